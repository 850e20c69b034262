//! The echo rows: 16-byte round trips through an endpoint fd to the
//! remote's echo and back, beside the raw eventfd ping-pong (and with
//! `--poll`, beside the poll floor), the ways alternating in turns.

use std::path::Path;
use std::time::Duration;

use iopath_rpmsg::ctrl::EptFd;
use iopath_rpmsg::tools::ping::{ping, Latency, Payloads, PingEndpoint, PingOptions, RawPingPong};

use super::children::{bound, Servers, Setup};
use super::raw::poll::RawPollPath;
use super::RpmsgConfig;
use crate::place::{on_cpu, Cpus};
use crate::report::plot::{Chart, LIMIT, OTHER, PRIMARY};
use crate::report::{Cell, Column, Table};
use crate::{Error, Report, Result};

/// Echo round trips measured in this many turns, alternating with the raw
/// ping-pong, so that both see the same machine.
pub(super) const ECHO_TURNS: u64 = 4;
/// Round trips of each kind before measuring.
const ECHO_WARM: u64 = 200;

/// `count` echo round trips of 16-byte messages through `ep`, each
/// checked; latencies appended to `lat`; returns the time taken.
fn echo(ep: &PingEndpoint, count: u64, busy: bool, lat: &mut Vec<f64>) -> Result<Duration> {
    let opts = PingOptions {
        count,
        payloads: Payloads::Fixed(16),
        timeout: Duration::from_secs(10),
        busy,
    };
    let r = ping(ep, &opts, || {}).map_err(Error::layer("echo round trips"))?;
    lat.extend(r.round_trips_us);
    Ok(r.elapsed)
}

/// The raw ping-pong, its partner a child of `exe` on `cpu`, good for
/// `kicks` round trips: its round trips as a way of [`alternate`].
fn raw_way(
    exe: &Path,
    kicks: u64,
    cpu: Option<usize>,
) -> Result<impl FnMut(u64, &mut Vec<f64>) -> Result<Duration>> {
    let dir = crate::cleanup::temp_dir("iopath-bench-rawpp-", &std::env::temp_dir())?;
    let raw = RawPingPong::start(exe, dir.path(), kicks, |c| crate::place::spawn_on(cpu, c))
        .map_err(Error::layer("starting the raw ping-pong"))?;
    Ok(move |n, lat: &mut Vec<f64>| {
        raw.round_trips(n, lat)
            .map_err(Error::layer("raw ping-pong"))
    })
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
        for i in crate::turns(N, turn as usize) {
            time[i] += ways[i](n, &mut lat[i])?;
        }
        done += n;
    }
    Ok(std::array::from_fn(|i| {
        Latency::from(std::mem::take(&mut lat[i]), time[i])
    }))
}

/// The echo rows: through `ep` and the raw ping-pong (its child of
/// `a.iopath` on `cpu`), `a.count` round trips each, in alternating turns.
pub(super) fn rows(a: &RpmsgConfig, ep: EptFd, cpu: Option<usize>) -> Result<[Latency; 2]> {
    let mut r = raw_way(&a.iopath, ECHO_WARM + a.count, cpu)?;
    let ep = PingEndpoint::from(ep);
    let mut e = |n, lat: &mut Vec<f64>| echo(&ep, n, false, lat);
    alternate(a.count, [&mut e, &mut r])
}

/// Echo with host and remote polling the rings and the client busy-polling
/// its fd: the host spins on the second CPU, the remote on the client's
/// (where it gives way to the client whenever the client runs). Beside it
/// the poll floor ([`super::raw::poll`]) in the same places, and the raw
/// eventfd ping-pong in its fastest placement, both on the client's CPU:
/// the table, and its chart.
pub(super) fn measure_poll(a: &RpmsgConfig, cpus: &Cpus, r: &mut Report) -> Result<()> {
    let (ca, cb) = cpus.pair();
    let setup = Setup {
        poll: true,
        ..Setup::echo(Some(ca), Some(cb))
    };
    let servers = Servers::start(&a.iopath, &setup)?;
    let floor = RawPollPath::start(&a.iopath, ECHO_WARM + a.count, Some(cb), Some(ca))?;
    let mut raw = raw_way(&a.iopath, ECHO_WARM + a.count, Some(ca))?;
    let [echo, floor, eventfd] = on_cpu(Some(ca), cpus, || {
        let c = servers.connect()?;
        let ep = PingEndpoint::from(bound(&c, "echo")?);
        let mut e = |n, lat: &mut Vec<f64>| echo(&ep, n, true, lat);
        let mut f = |n, lat: &mut Vec<f64>| floor.round_trips(n, lat);
        alternate(a.count, [&mut e, &mut f, &mut raw])
    })?;
    let place = format!(
        "host and the floor's forwarder on CPU {cb}; remote, the floor's echo and the \
         busy-polling client on CPU {ca}; eventfd pair on CPU {ca}"
    );
    let title = format!(
        "echo round trip, polling ({place}): 16 B, {} round trips each",
        a.count
    );
    let paths = [
        ("endpoint fd, busy-polled, host and remote polling", &echo),
        ("floor: the same hops and places, no rpmsg", &floor),
    ];
    let mut t = table(title, &paths, &eventfd);
    let ratio = Cell::times(echo.p50_us / floor.p50_us);
    t.figure("endpoint fd busy-polled / floor, p50", ratio);
    let title = "rpmsg echo round trip, everything polling: latency beside its floor";
    let heading = "host, remote and client polling".to_string();
    r.chart(chart("rpmsg-echo-latency-polling", title, heading, &t));
    r.table(t);
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

/// The chart `name` of an echo table `t`, in a group `heading`: each
/// row's p50, then each row's p99, the limit in its colour.
pub(super) fn chart(name: &str, title: &str, heading: String, t: &Table) -> Chart {
    let mut c = Chart::new(name, title, "us")
        .about("16-byte messages, strict round trips; the limit: a raw eventfd ping-pong between two processes", "round-trip us, lower is faster")
        .legend(&[
            ("endpoint fd", PRIMARY),
            ("floor: the same hops, no rpmsg", OTHER),
            ("limit: raw eventfd ping-pong", LIMIT),
        ]);
    c.group(heading);
    for col in ["p50 us", "p99 us"] {
        let i = t.col(col);
        for row in &t.rows {
            let name = row[0].to_string();
            let short = name.split([',', ':', '(']).next().map_or("", str::trim);
            let color = match short {
                "endpoint fd" => PRIMARY,
                "limit" => LIMIT,
                _ => OTHER,
            };
            c.bar(format!("{short}, {}", &col[..3]), &row[i], color);
        }
    }
    c
}
