//! `iopath bench rpmsg --scale`: what the endpoint service costs as the
//! work grows, beside limits measured in the same run, every process on
//! one CPU.
//!
//! ```text
//!  echo     1, 16, 256 endpoints echoing at once, a thread each, for 1 s:
//!           aggregate round trips/s, each endpoint's p99 and round trips
//!  stream   one endpoint sending to the remote's sink as fast as it can,
//!           then "SYNC" for its count, beside the same to a raw sink
//!  create   10,000 endpoint fds created and held, then closed: time per
//!           endpoint per thousand, the host's resident memory
//! ```
//!
//! The remote offers `EVENT_IDX` and 64 KiB buffers.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptInfo};
use iopath_rpmsg::tools::ping::percentile;

use super::children::{bound, Servers, Setup};
use super::raw::sink::Sinks;
use crate::error::{check, check_failed, invalid};
use crate::place::{on_cpu, Cpus, Placement};
use crate::report::plot::{Bar, Line, Panel, LIMIT, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::{Error, Report, Result, Stats};

const ENDPOINTS: [usize; 3] = [1, 16, 256];
const ECHO_TIME: Duration = Duration::from_secs(1);
const RUNS: usize = 3;
/// Messages per stream run, at most [`STREAM_BYTES`].
const STREAM_MSGS: u64 = 100_000;
const STREAM_BYTES: u64 = 32 << 20;
const STREAM_SIZES: [usize; 4] = [16, 496, 4096, 65520];
const CREATE: usize = 10_000;

/// One echo row over every run: aggregate round trips/s; the median
/// endpoint's p99, the worst endpoint's p99, the fewest round trips of an
/// endpoint over the median endpoint's.
#[derive(Debug, Default)]
struct EchoRow {
    endpoints: usize,
    aggregate: Vec<f64>,
    p99_median: Vec<f64>,
    p99_max: Vec<f64>,
    fewest_share: Vec<f64>,
}

/// One stream row: messages per run, messages/s per run through the
/// endpoint and raw.
#[derive(Debug)]
struct StreamRow {
    size: usize,
    msgs: u64,
    ept: Vec<f64>,
    raw: Vec<f64>,
}

/// Creating many endpoints at once: microseconds per endpoint per thousand
/// created (the curve), the seconds to create and to free them all, the
/// host's resident memory before, with every endpoint held, after.
#[derive(Debug)]
struct CreateRow {
    per_thousand_us: Vec<f64>,
    create_s: f64,
    destroy_s: f64,
    rss_kib: [u64; 3],
}

/// Runs the scale experiments: their tables and chart panels.
///
/// # Errors
/// When the host, remote or raw sink cannot be started or misbehave (an
/// echo wrong, a message lost), or the fd limit is too low.
pub(super) fn run(iopath: &Path, cpus: &Cpus, r: &mut Report) -> Result<()> {
    let (client_cpu, server_cpu) = Placement::One.cpus(cpus);
    let buf = iopath_rpmsg::BufSizes::both(64 * 1024);
    let setup = Setup {
        parent: &std::env::temp_dir(),
        prefix: "iopath-bench-scale-",
        poll: false,
        remote_args: &[
            "--event-idx",
            "--echo",
            "echo",
            "--sink",
            "sink",
            "--buf-size",
            "64K",
        ],
        shm_size: iopath_rpmsg::rsc_table::ShmLayout::size_for(256, buf)
            .expect("rings of 256 have a layout"),
        remote_cpu: server_cpu,
        host_cpu: server_cpu,
    };
    let srv = Servers::start(iopath, &setup)?;
    let c = srv.connect()?;
    let mut sinks = Sinks::start(bound(&c, "sink")?, iopath, server_cpu)?;
    on_cpu(client_cpu, cpus, || {
        let mut echo: Vec<EchoRow> = ENDPOINTS
            .map(|endpoints| EchoRow {
                endpoints,
                ..EchoRow::default()
            })
            .into();
        let mut streams: Vec<StreamRow> = STREAM_SIZES
            .map(|size| StreamRow {
                size,
                msgs: STREAM_MSGS.min(STREAM_BYTES / size as u64),
                ept: Vec::new(),
                raw: Vec::new(),
            })
            .into();
        for run in 0..RUNS {
            // Rows take turns, the order rotating per run.
            for k in 0..echo.len() {
                let n = echo.len();
                let row = &mut echo[(k + run) % n];
                echo_run(&c, row, ECHO_TIME)?;
            }
            for k in 0..streams.len() {
                let n = streams.len();
                let row = &mut streams[(k + run) % n];
                // The endpoint first in even runs, the raw socket in odd.
                for raw in [run % 2 == 1, run % 2 == 0] {
                    let took = sinks.stream(raw, row.msgs, row.size)?;
                    let rates = if raw { &mut row.raw } else { &mut row.ept };
                    rates.push(row.msgs as f64 / took.as_secs_f64());
                }
            }
        }
        drop(sinks);
        let create = create_many(&srv, &c, CREATE)?;
        let place =
            Placement::One.describe(cpus, "client threads", "host, remote and the raw sink");
        tables(&place, &echo, &streams, &create)
            .into_iter()
            .for_each(|t| r.table(t));
        panels(&echo, &streams, &create)
            .into_iter()
            .for_each(|p| r.panel(p));
        Ok(())
    })
}

/// `row.endpoints` endpoints echoing at once from as many threads for
/// `time`; adds the run's figures to `row`.
fn echo_run(c: &CtrlClient, row: &mut EchoRow, time: Duration) -> Result<()> {
    let n = row.endpoints;
    let eps = (0..n)
        .map(|_| bound(c, "echo"))
        .collect::<Result<Vec<_>>>()?;
    let go = Barrier::new(n + 1);
    let deadline = AtomicU64::new(0);
    let t0 = Instant::now();
    // Each endpoint's round trips and p99.
    let per = std::thread::scope(|s| -> Result<Vec<(f64, f64)>> {
        let mut handles = Vec::with_capacity(n);
        for (i, ep) in eps.iter().enumerate() {
            let (go, deadline) = (&go, &deadline);
            let h = std::thread::Builder::new()
                .stack_size(256 << 10)
                .spawn_scoped(s, move || -> Result<(f64, f64)> {
                    let mut lat = Vec::with_capacity(1 << 14);
                    let mut back = [0u8; 512];
                    go.wait();
                    let end = t0 + Duration::from_nanos(deadline.load(Ordering::SeqCst));
                    let mut seq = 0u64;
                    loop {
                        let t = Instant::now();
                        if t >= end {
                            break;
                        }
                        seq += 1;
                        let mut msg = [0u8; 16];
                        msg[..8].copy_from_slice(&(i as u64).to_le_bytes());
                        msg[8..].copy_from_slice(&seq.to_le_bytes());
                        ep.send(&msg).map_err(Error::layer("sending an echo"))?;
                        let got = ep
                            .recv_timeout(&mut back, Duration::from_secs(10))
                            .map_err(Error::layer("receiving an echo"))?
                            .ok_or_else(|| {
                                Error::Check(format!("endpoint {i}: no echo {seq} in 10 s"))
                            })?;
                        check!(
                            got == 16 && back[..16] == msg,
                            "endpoint {i}: echo {seq} came back wrong"
                        );
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                    lat.sort_by(f64::total_cmp);
                    Ok((lat.len() as f64, percentile(&lat, 0.99)))
                })
                .map_err(Error::sys("spawning an echo thread"))?;
            handles.push(h);
        }
        // Every thread made and parked before the clock starts.
        let start = t0.elapsed() + Duration::from_millis(20) + time;
        deadline.store(start.as_nanos() as u64, Ordering::SeqCst);
        go.wait();
        let panicked = || Err(Error::Check("an echo thread panicked".into()));
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| panicked()))
            .collect()
    })?;
    let (mut rts, mut p99): (Vec<f64>, Vec<f64>) = per.into_iter().unzip();
    rts.sort_by(f64::total_cmp);
    p99.sort_by(f64::total_cmp);
    row.aggregate
        .push(rts.iter().sum::<f64>() / time.as_secs_f64());
    row.p99_median.push(percentile(&p99, 0.5));
    row.p99_max.push(p99.last().copied().unwrap_or(0.0));
    row.fewest_share
        .push(rts[0] / percentile(&rts, 0.5).max(1.0));
    Ok(())
}

/// The resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let p = format!("/proc/{pid}/status");
    let s = std::fs::read_to_string(&p).map_err(Error::io(&p))?;
    let kib = s.lines().find_map(|l| l.strip_prefix("VmRSS:"));
    kib.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| Error::Check(format!("no VmRSS in {p}")))
}

/// `n` endpoint fds created on `c` and held, then closed.
fn create_many(srv: &Servers, c: &CtrlClient, n: usize) -> Result<CreateRow> {
    let limit = iopath_sys::raise_fd_limit(Some(n as u64 + 256));
    if limit < n as u64 + 64 {
        invalid!(
            "--scale",
            "{n} endpoints need {} open files; the limit here is {limit}",
            n + 64
        );
    }
    let stats = || c.stats().map_err(Error::layer("STATS"));
    let base = stats()?.endpoints();
    let before = rss_kib(srv.host_pid())?;
    let info = EptInfo::new("bench");
    let mut held = Vec::with_capacity(n);
    let mut per_thousand_us = Vec::new();
    let (t0, mut tk) = (Instant::now(), Instant::now());
    for i in 0..n {
        let ep = c.create_ept_fd(&info, O_RDWR | O_CLOEXEC);
        held.push(ep.map_err(Error::layer(format!("CREATE_EPT_FD number {}", i + 1)))?);
        if (i + 1) % 1000 == 0 {
            per_thousand_us.push(tk.elapsed().as_secs_f64() * 1e6 / 1000.0);
            tk = Instant::now();
        }
    }
    let create_s = t0.elapsed().as_secs_f64();
    let (held_now, want) = (u64::from(stats()?.endpoints()), u64::from(base) + n as u64);
    check!(
        held_now == want,
        "the service holds {held_now} endpoints, not {want}"
    );
    let full = rss_kib(srv.host_pid())?;
    let t1 = Instant::now();
    drop(held);
    while stats()?.endpoints() > base {
        check!(
            t1.elapsed() < Duration::from_secs(60),
            "the service did not free {n} closed endpoints in 60 s"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(CreateRow {
        per_thousand_us,
        create_s,
        destroy_s: t1.elapsed().as_secs_f64(),
        rss_kib: [before, full, rss_kib(srv.host_pid())?],
    })
}

/// The tables: endpoints echoing at once, the one-way stream beside its
/// raw limit, creating many endpoints.
fn tables(place: &str, echo: &[EchoRow], streams: &[StreamRow], c: &CreateRow) -> Vec<Table> {
    let range = |v: &[f64], digits| Cell::runs(v, Unit::Grouped, digits);
    let mut e = Table::new(
        format!(
            "scale, {place}: endpoints echoing at once ({:.1} s, 16 B), medians (min-max) over {RUNS} runs; the remote offers EVENT_IDX",
            ECHO_TIME.as_secs_f64(),
        ),
        vec![
            Column::right("endpoints"),
            Column::right("round trips/s (aggregate)"),
            Column::right("vs 1 endpoint"),
            Column::right("per-endpoint p99 us, median endpoint"),
            Column::right("worst endpoint's p99 / median's"),
            Column::right("fewest round trips / median's"),
        ],
    );
    let one = echo.iter().find(|r| r.endpoints == 1);
    let base = one.map_or(f64::NAN, |r| Stats::of(&r.aggregate).median);
    for r in echo {
        let ratio: Vec<f64> = r
            .p99_max
            .iter()
            .zip(&r.p99_median)
            .map(|(m, d)| m / d.max(1e-9))
            .collect();
        e.row(vec![
            Cell::grouped(r.endpoints as f64, 0),
            range(&r.aggregate, 0),
            Cell::times(Stats::of(&r.aggregate).median / base),
            range(&r.p99_median, 1),
            range(&ratio, 2),
            range(&r.fewest_share, 2),
        ]);
    }
    let mut s = Table::new(
        format!(
            "one-way stream: {STREAM_MSGS} messages ({} MiB at most), then SYNC; 64 KiB buffers; medians (min-max)",
            STREAM_BYTES >> 20
        ),
        vec![
            Column::left("payload"),
            Column::right("endpoint fd msgs/s"),
            Column::right("MB/s"),
            Column::right("raw SOCK_SEQPACKET msgs/s (limit)"),
            Column::right("MB/s"),
            Column::right("endpoint / limit"),
        ],
    );
    for r in streams {
        let mb = |v: &[f64]| -> Vec<f64> { v.iter().map(|x| x * r.size as f64 / 1e6).collect() };
        s.row(vec![
            Cell::text(format!("{} B", r.size)),
            range(&r.ept, 0),
            range(&mb(&r.ept), 1),
            range(&r.raw, 0),
            range(&mb(&r.raw), 1),
            Cell::times(Stats::of(&r.ept).median / Stats::of(&r.raw).median),
        ]);
    }
    let title = format!("creating {CREATE} endpoint fds (held, one control connection)");
    let mut t = Table::new(title, vec![Column::left("what"), Column::left("measured")]);
    let each = |secs: f64| format!("{secs:.2} s ({:.1} us each)", secs * 1e6 / CREATE as f64);
    let curve: Vec<String> = c
        .per_thousand_us
        .iter()
        .map(|v| format!("{v:.1}"))
        .collect();
    let [before, full, after] = c.rss_kib;
    let per = full.saturating_sub(before) as f64 / CREATE as f64;
    for (what, measured) in [
        ("created in", each(c.create_s)),
        ("us per endpoint, each thousand in turn", curve.join(", ")),
        ("closed and freed in", each(c.destroy_s)),
        (
            "host resident memory: before, all held, after",
            format!("{before} / {full} / {after} KiB ({per:.2} KiB per endpoint)"),
        ),
    ] {
        t.row(vec![what.into(), measured.into()]);
    }
    vec![e, s, t]
}

/// The chart's panels: aggregate round trips/s and the per-endpoint p99
/// as endpoints grow, the one-way stream beside its raw limit, the time to
/// create each thousand endpoints; medians with min-max whiskers.
fn panels(echo: &[EchoRow], streams: &[StreamRow], c: &CreateRow) -> Vec<Panel> {
    let bar = Bar::runs;
    let one = echo.first().map_or(0.0, |r| Stats::of(&r.aggregate).median);
    let panel = |title: &str, y_desc: &str, log, bars, legend: &[(&str, _)]| Panel {
        title: title.into(),
        y_desc: y_desc.into(),
        log,
        bars,
        lines: Vec::new(),
        legend: legend.iter().map(|(l, c)| (l.to_string(), *c)).collect(),
    };
    let mut aggregate = panel(
        "endpoints echoing at once, one CPU: aggregate round trips/s",
        "round trips/s",
        false,
        echo.iter()
            .map(|r| bar(format!("{} endpoints", r.endpoints), &r.aggregate, PRIMARY))
            .collect(),
        &[("aggregate", PRIMARY)],
    );
    aggregate.lines = vec![Line::span("one endpoint's rate".into(), 0, echo.len(), one)];
    let p99 = echo.iter().flat_map(|r| {
        let n = r.endpoints;
        [
            bar(format!("{n} median"), &r.p99_median, PRIMARY),
            bar(format!("{n} worst"), &r.p99_max, SECONDARY),
        ]
    });
    let stream = streams.iter().flat_map(|r| {
        [
            bar(format!("{} B endpoint", r.size), &r.ept, PRIMARY),
            bar(format!("{} B raw", r.size), &r.raw, LIMIT),
        ]
    });
    let create = c
        .per_thousand_us
        .iter()
        .enumerate()
        .map(|(k, &us)| bar(format!("{}k", k + 1), &[us], PRIMARY));
    vec![
        aggregate,
        panel(
            "per-endpoint p99: median endpoint and worst endpoint",
            "us (log)",
            true,
            p99.collect(),
            &[
                ("median endpoint's p99", PRIMARY),
                ("worst endpoint's p99", SECONDARY),
            ],
        ),
        panel(
            "one-way stream: messages/s",
            "messages/s",
            false,
            stream.collect(),
            &[
                ("endpoint fd", PRIMARY),
                ("limit: raw SOCK_SEQPACKET", LIMIT),
            ],
        ),
        panel(
            &format!("creating {CREATE} endpoint fds: us per endpoint, each thousand in turn"),
            "us per endpoint",
            false,
            create.collect(),
            &[("endpoint fd create", PRIMARY)],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_has_a_curve_per_experiment_from_the_rows() {
        let echo: Vec<EchoRow> = [(1, 40_000.0), (16, 60_000.0), (256, 38_000.0)]
            .into_iter()
            .map(|(endpoints, rate)| EchoRow {
                endpoints,
                aggregate: vec![rate - 1000.0, rate, rate + 5000.0],
                p99_median: vec![10.0, 11.0, 12.0],
                p99_max: vec![20.0, 21.0, 22.0],
                fewest_share: vec![1.0; 3],
            })
            .collect();
        let stream = [StreamRow {
            size: 16,
            msgs: 100,
            ept: vec![1.0, 2.0, 3.0],
            raw: vec![4.0, 5.0, 6.0],
        }];
        let create = CreateRow {
            per_thousand_us: vec![30.0, 31.0],
            create_s: 0.06,
            destroy_s: 0.02,
            rss_kib: [1, 2, 2],
        };
        let p = panels(&echo, &stream, &create);
        assert_eq!(p.len(), 4);
        // The echo curve: one bar per endpoint count at its median, the
        // runs' spread as the whisker, one endpoint's rate as the line.
        let medians: Vec<f64> = p[0].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(medians, [40_000.0, 60_000.0, 38_000.0]);
        assert_eq!(p[0].bars[1].whisker, Some((59_000.0, 65_000.0)));
        assert_eq!(p[0].lines.len(), 1);
        assert!(p[0].lines[0].points.iter().all(|&(_, y)| y == 40_000.0));
        // Median and worst endpoint's p99 per count; endpoint and raw per
        // size; one bar per thousand created.
        assert_eq!(p[1].bars.len(), 6);
        assert_eq!(p[1].bars[1].segments[0].1, 21.0);
        let stream: Vec<f64> = p[2].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(stream, [2.0, 5.0]);
        let create: Vec<f64> = p[3].bars.iter().map(|b| b.segments[0].1).collect();
        assert_eq!(create, [30.0, 31.0]);
    }
}
