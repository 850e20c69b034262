//! The echo rows: 16-byte round trips through an endpoint fd to the
//! remote's echo and back, beside the raw eventfd ping-pong (and with
//! `--poll`, beside the poll floor), the ways alternating in turns.

use std::path::Path;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::EptFd;

use super::children::{Servers, Setup};
use super::raw::poll::RawPollPath;
use super::raw::RawPingPong;
use super::RpmsgConfig;
use crate::error::{check, check_failed};
use crate::place::{on_cpu, Cpus};
use crate::report::plot::{Bar, Panel, LIMIT, PRIMARY};
use crate::report::{Cell, Column, Table};
use crate::{Error, Latency, Report, Result};

/// Echo round trips measured in this many turns, alternating with the raw
/// ping-pong, so that both see the same machine.
pub(super) const ECHO_TURNS: u64 = 4;
/// Round trips of each kind before measuring.
const ECHO_WARM: u64 = 200;

/// `count` echo round trips of 16-byte messages through `ep`, each
/// checked; latencies appended to `lat`; returns the time taken.
fn echo(ep: &EptFd, count: u64, busy: bool, seq: &mut u64, lat: &mut Vec<f64>) -> Result<Duration> {
    let mut back = [0u8; 512];
    let t0 = Instant::now();
    for _ in 0..count {
        *seq += 1;
        let msg = u128::from(*seq).to_le_bytes();
        let t = Instant::now();
        ep.send(&msg).map_err(Error::layer("sending an echo"))?;
        let wait = Duration::from_secs(10);
        let n = if busy {
            ep.recv_busy(&mut back, wait)
        } else {
            ep.recv_timeout(&mut back, wait)
        }
        .map_err(Error::layer("receiving an echo"))?
        .ok_or_else(|| Error::Check(format!("no echo {seq} in 10 s")))?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        check!(n == 16 && back[..16] == msg, "echo {seq} came back wrong");
    }
    Ok(t0.elapsed())
}

/// A way of doing round trips: `n` of them, latencies appended to the
/// vector, the time taken returned.
type Way<'a> = &'a mut dyn FnMut(u64, &mut Vec<f64>) -> Result<Duration>;

/// `count` round trips of every way after [`ECHO_WARM`] each unmeasured,
/// in [`ECHO_TURNS`] turns whose order rotates, so that each sees the same
/// machine and none always runs first.
fn alternate<const N: usize>(count: u64, mut ways: [Way<'_>; N]) -> Result<[Latency; N]> {
    let mut scratch = Vec::new();
    for w in &mut ways {
        w(ECHO_WARM, &mut scratch)?;
    }
    let mut lat: [Vec<f64>; N] = std::array::from_fn(|_| Vec::new());
    let mut time = [Duration::ZERO; N];
    let mut done = 0;
    for turn in 0..ECHO_TURNS {
        let n = (count - done) / (ECHO_TURNS - turn);
        for k in 0..N {
            let i = (k + turn as usize) % N;
            time[i] += ways[i](n, &mut lat[i])?;
        }
        done += n;
    }
    Ok(std::array::from_fn(|i| {
        Latency::from(std::mem::take(&mut lat[i]), time[i])
    }))
}

/// Echo through `ep` and the raw ping-pong (its child of `exe` on
/// `raw_cpu`), `count` round trips each, in alternating turns.
pub(super) fn echo_vs_limit(
    exe: &Path,
    ep: &EptFd,
    count: u64,
    raw_cpu: Option<usize>,
) -> Result<(Latency, Latency)> {
    let raw = RawPingPong::start(exe, ECHO_WARM + count, raw_cpu)?;
    let mut seq = 0;
    let mut e = |n, lat: &mut Vec<f64>| echo(ep, n, false, &mut seq, lat);
    let mut r = |n, lat: &mut Vec<f64>| raw.round_trips(n, lat);
    let [e, r] = alternate(count, [&mut e, &mut r])?;
    Ok((e, r))
}

/// Echo with host and remote polling the rings and the client busy-polling
/// its fd: the host spins on the second CPU, the remote on the client's
/// (where it gives way to the client whenever the client runs). Beside it
/// the poll floor ([`super::raw::poll`]) in the same places, and the raw
/// eventfd ping-pong in its fastest placement, both on the client's CPU:
/// the table, and the chart's panel.
pub(super) fn measure_poll(a: &RpmsgConfig, cpus: &Cpus, r: &mut Report) -> Result<()> {
    let (ca, cb) = cpus.pair();
    let servers = Servers::start(
        &a.iopath,
        &Setup {
            parent: &super::shm_dir(),
            prefix: "iopath-bench-rpmsg-",
            poll: true,
            remote_args: &["--echo", "echo"],
            shm_size: super::children::SHM_SIZE,
            remote_cpu: Some(ca),
            host_cpu: Some(cb),
        },
    )?;
    let floor = RawPollPath::start(&a.iopath, ECHO_WARM + a.count, Some(cb), Some(ca))?;
    let raw = RawPingPong::start(&a.iopath, ECHO_WARM + a.count, Some(ca))?;
    let [echo, floor, eventfd] = on_cpu(Some(ca), cpus, || {
        let (_c, ep) = servers.client("echo")?;
        let mut seq = 0;
        let mut e = |n, lat: &mut Vec<f64>| echo(&ep, n, true, &mut seq, lat);
        let mut f = |n, lat: &mut Vec<f64>| floor.round_trips(n, lat);
        let mut r = |n, lat: &mut Vec<f64>| raw.round_trips(n, lat);
        alternate(a.count, [&mut e, &mut f, &mut r])
    })?;
    let place = format!(
        "host and the floor's forwarder on CPU {cb}; remote, the floor's echo and the \
         busy-polling client on CPU {ca}; eventfd pair on CPU {ca}"
    );
    let mut t = table(
        format!(
            "echo round trip, polling ({place}): 16 B, {} round trips each",
            a.count
        ),
        &[
            ("endpoint fd, busy-polled, host and remote polling", &echo),
            ("floor: the same hops and places, no rpmsg", &floor),
        ],
        &eventfd,
    );
    let ratio = Cell::times(echo.p50_us / floor.p50_us);
    t.figure("endpoint fd busy-polled / floor, p50", ratio);
    r.table(t);
    let title = "echo round trip, polling (limit: the poll floor)";
    r.panel(panel(
        title.into(),
        &echo,
        &floor,
        "the same hops, no rpmsg",
    ));
    Ok(())
}

/// An echo latency table titled `title`: each path, then the limit, with
/// p50 / limit.
pub(super) fn table(title: String, paths: &[(&str, &Latency)], limit: &Latency) -> Table {
    let mut t = Table::new(
        title,
        vec![
            Column::left("path"),
            Column::right("p50 us"),
            Column::right("p99 us"),
            Column::right("max us"),
            Column::right("msgs/s"),
            Column::right("p50 / limit"),
        ],
    );
    let limit_row = ("limit: raw eventfd ping-pong, two processes", limit);
    for (name, l) in paths.iter().chain([&limit_row]) {
        let n = || vec![l.count];
        t.row(vec![
            Cell::text(*name),
            Cell::num(l.p50_us, 1).with_samples(n()),
            Cell::num(l.p99_us, 1).with_samples(n()),
            Cell::num(l.max_us, 1).with_samples(n()),
            Cell::grouped(l.msgs_per_s, 0).with_samples(n()),
            Cell::times(l.p50_us / limit.p50_us),
        ]);
    }
    t
}

/// Echo p50/p99 beside the limit's (log scale).
pub(super) fn panel(title: String, echo: &Latency, limit: &Latency, limit_name: &str) -> Panel {
    Panel {
        title,
        y_desc: "us (log)".into(),
        log: true,
        bars: vec![
            Bar::of("echo p50", echo.p50_us, PRIMARY),
            Bar::of("raw p50", limit.p50_us, LIMIT),
            Bar::of("echo p99", echo.p99_us, PRIMARY),
            Bar::of("raw p99", limit.p99_us, LIMIT),
        ],
        lines: Vec::new(),
        legend: vec![
            ("endpoint fd echo".into(), PRIMARY),
            (format!("limit: {limit_name}"), LIMIT),
        ],
    }
}
