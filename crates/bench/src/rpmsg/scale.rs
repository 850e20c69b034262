//! `iopath bench rpmsg --scale`: what the endpoint service costs as the
//! work grows, beside limits measured in the same run, every process on
//! one CPU.
//!
//! ```text
//!  echo     1, 16, 256 endpoints echoing at once, a thread each, for 1 s:
//!           aggregate round trips/s, each endpoint's p99 and round trips
//!  create   10,000 endpoint fds created and held, then closed: time per
//!           endpoint per thousand, the host's resident memory
//! ```
//!
//! The remote offers `EVENT_IDX` and 64 KiB buffers. One-way streams beside
//! a raw socket are the bulk rows' (`super::bulk`).

use std::path::Path;
use std::sync::{Barrier, OnceLock};
use std::time::{Duration, Instant};

use iopath_rpmsg::ctrl::proto::{O_CLOEXEC, O_RDWR};
use iopath_rpmsg::ctrl::{CtrlClient, EptFd, EptInfo};
use iopath_rpmsg::tools::ping::percentile;

use super::children::{bound, echo_once, Servers, Setup};
use crate::error::{check, check_failed, invalid};
use crate::place::{on_cpu, Cpus, Placement};
use crate::report::plot::{Chart, PRIMARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::{Error, Report, Result, Stats};

const ENDPOINTS: [usize; 3] = [1, 16, 256];
const ECHO_TIME: Duration = Duration::from_secs(1);
const RUNS: usize = 3;
const CREATE: usize = 10_000;

/// One echo row over every run: aggregate round trips/s; the median
/// endpoint's p99; the worst endpoint's p99 and the fewest round trips of
/// an endpoint, each over the median endpoint's.
#[derive(Debug, Default)]
struct EchoRow {
    endpoints: usize,
    aggregate: Vec<f64>,
    p99_median: Vec<f64>,
    worst_share: Vec<f64>,
    fewest_share: Vec<f64>,
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

/// Runs the scale experiments: their tables and charts.
///
/// # Errors
/// When the host or remote cannot be started or misbehave (an echo
/// wrong), or the fd limit is too low.
pub(super) fn run(iopath: &Path, cpus: &Cpus, r: &mut Report) -> Result<()> {
    let (client_cpu, server_cpu) = Placement::One.cpus(cpus);
    let setup = Setup::sink("iopath-bench-scale-", 256, &["--echo", "echo"], server_cpu);
    let srv = Servers::start(iopath, &setup)?;
    let c = srv.connect()?;
    on_cpu(client_cpu, cpus, || {
        let mut echo: Vec<EchoRow> = ENDPOINTS
            .map(|endpoints| EchoRow {
                endpoints,
                ..EchoRow::default()
            })
            .into();
        for run in 0..RUNS {
            // Rows take turns, the order rotating per run.
            for i in crate::turns(echo.len(), run) {
                echo_run(&c, &mut echo[i], ECHO_TIME)?;
            }
        }
        let create = create_many(&srv, &c, CREATE)?;
        let place = Placement::One.describe(cpus, "client threads", "host and remote");
        let t = tables(&place, &echo, &create);
        charts(&t, &create).into_iter().for_each(|c| r.chart(c));
        t.into_iter().for_each(|t| r.table(t));
        Ok(())
    })
}

/// `row.endpoints` endpoints echoing at once from as many threads for
/// `time`; adds the run's figures to `row`.
fn echo_run(c: &CtrlClient, row: &mut EchoRow, time: Duration) -> Result<()> {
    let n = row.endpoints;
    let eps: Vec<_> = (0..n).map(|_| bound(c, "echo")).collect::<Result<_>>()?;
    let (go, end) = (Barrier::new(n + 1), OnceLock::new());
    // Each endpoint's round trips and p99.
    let per = std::thread::scope(|s| -> Result<Vec<(f64, f64)>> {
        let mut handles = Vec::with_capacity(n);
        for (i, ep) in eps.iter().enumerate() {
            let (go, end) = (&go, &end);
            let echo = move || {
                go.wait();
                echo_until(ep, i, *end.get().expect("set before the start"))
            };
            let h = std::thread::Builder::new().stack_size(256 << 10);
            let spawned = h.spawn_scoped(s, echo);
            handles.push(spawned.map_err(Error::sys("spawning an echo thread"))?);
        }
        // Every thread made and parked before the clock starts.
        end.get_or_init(|| Instant::now() + Duration::from_millis(20) + time);
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
    let median = percentile(&p99, 0.5);
    row.p99_median.push(median);
    row.worst_share
        .push(p99.last().copied().unwrap_or(0.0) / median.max(1e-9));
    row.fewest_share
        .push(rts[0] / percentile(&rts, 0.5).max(1.0));
    Ok(())
}

/// Endpoint `i`'s strict round trips through `ep` until `end`: their
/// count and p99.
fn echo_until(ep: &EptFd, i: usize, end: Instant) -> Result<(f64, f64)> {
    let mut lat = Vec::with_capacity(1 << 14);
    let (mut msg, mut back) = ([0u8; 16], [0u8; 512]);
    msg[..8].copy_from_slice(&(i as u64).to_le_bytes());
    let who = format!("endpoint {i}: ");
    for seq in 1u64.. {
        let t = Instant::now();
        if t >= end {
            break;
        }
        msg[8..].copy_from_slice(&seq.to_le_bytes());
        echo_once(ep, &msg, &mut back, &who, seq)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(f64::total_cmp);
    Ok((lat.len() as f64, percentile(&lat, 0.99)))
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
    let before = rss_kib(srv.host.id())?;
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
    let full = rss_kib(srv.host.id())?;
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
        rss_kib: [before, full, rss_kib(srv.host.id())?],
    })
}

/// The tables: endpoints echoing at once, creating many endpoints.
fn tables(place: &str, echo: &[EchoRow], c: &CreateRow) -> Vec<Table> {
    let range = |v: &[f64], digits| Cell::runs(v, Unit::Grouped, digits);
    let secs = ECHO_TIME.as_secs_f64();
    let title = format!("scale, {place}: endpoints echoing at once ({secs:.1} s, 16 B), medians (min-max) over {RUNS} runs; the remote offers EVENT_IDX");
    let mut e = Table::new(
        title,
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
        e.row(vec![
            Cell::grouped(r.endpoints as f64, 0),
            range(&r.aggregate, 0),
            Cell::times(Stats::of(&r.aggregate).median / base),
            range(&r.p99_median, 1),
            range(&r.worst_share, 2),
            range(&r.fewest_share, 2),
        ]);
    }
    let title = format!("creating {CREATE} endpoint fds (held, one control connection)");
    let mut t = Table::new(title, vec![Column::left("what"), Column::left("measured")]);
    let each = |secs: f64| format!("{secs:.2} s ({:.1} us each)", secs * 1e6 / CREATE as f64);
    let curve = c.per_thousand_us.iter().map(|v| format!("{v:.1}"));
    let curve = curve.collect::<Vec<_>>().join(", ");
    let [before, full, after] = c.rss_kib;
    let per = full.saturating_sub(before) as f64 / CREATE as f64;
    let rss = format!("{before} / {full} / {after} KiB ({per:.2} KiB per endpoint)");
    for (what, measured) in [
        ("created in", each(c.create_s)),
        ("us per endpoint, each thousand in turn", curve),
        ("closed and freed in", each(c.destroy_s)),
        ("host resident memory: before, all held, after", rss),
    ] {
        t.row(vec![what.into(), measured.into()]);
    }
    vec![e, t]
}

/// The charts of the echo table (`t`) and of `c`: aggregate round trips/s
/// and the median endpoint's p99 by endpoints echoing at once, the time to
/// create each thousand endpoints; medians with min-max whiskers.
fn charts(t: &[Table], c: &CreateRow) -> Vec<Chart> {
    let e = &t[0];
    let about = format!("every process on one CPU; median (min-max) of {RUNS} runs");
    let by_endpoints = |name: &str, title: &str, col: &str, unit, axis: &str| {
        let mut ch = Chart::new(name, title, unit).about(about.clone(), axis);
        let i = e.col(col);
        for row in &e.rows {
            ch.bar(format!("{} endpoints", row[0]), &row[i], PRIMARY);
        }
        ch
    };
    let rate = by_endpoints(
        "rpmsg-scale-echo-throughput",
        "rpmsg endpoints echoing at once: aggregate round trips/s",
        "round trips/s (aggregate)",
        "round trips/s",
        "round trips/s, higher is faster",
    );
    let p99 = by_endpoints(
        "rpmsg-scale-echo-p99",
        "rpmsg endpoints echoing at once: the median endpoint's p99 latency",
        "per-endpoint p99 us, median endpoint",
        "us",
        "p99 us, lower is faster",
    );
    let title = format!("Creating {CREATE} rpmsg endpoint fds and holding them: us per endpoint");
    let mut create = Chart::new("rpmsg-scale-create", title, "us").about(
        "one control connection, every endpoint held; each thousand in turn",
        "us per endpoint, lower is faster",
    );
    for (k, &us) in c.per_thousand_us.iter().enumerate() {
        let label = format!("endpoints {k}k-{}k", k + 1);
        create.bar(label, &Cell::num(us, 1), PRIMARY);
    }
    vec![rate, p99, create]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_are_the_tables_figures() {
        let echo: Vec<EchoRow> = [(1, 40_000.0), (16, 60_000.0), (256, 38_000.0)]
            .into_iter()
            .map(|(endpoints, rate)| EchoRow {
                endpoints,
                aggregate: vec![rate - 1000.0, rate, rate + 5000.0],
                p99_median: vec![10.0, 11.0, 12.0],
                worst_share: vec![20.0 / 10.0, 21.0 / 11.0, 22.0 / 12.0],
                fewest_share: vec![1.0; 3],
            })
            .collect();
        let create = CreateRow {
            per_thousand_us: vec![30.0, 31.0],
            create_s: 0.06,
            destroy_s: 0.02,
            rss_kib: [1, 2, 2],
        };
        let c = charts(&tables("here", &echo, &create), &create);
        let t: Vec<_> = c.iter().map(|c| c.bar_titles()).collect();
        assert!(t[0]
            .0
            .contains(&"16 endpoints: 60,000 round trips/s".into()));
        assert_eq!(t[0].1, 3);
        assert!(t[1].0.contains(&"256 endpoints: 11.0 us".into()));
        assert!(t[2].0.contains(&"endpoints 1k-2k: 31.0 us".into()));
    }
}
