//! The small-block table of `iopath bench blk`: 4 KiB random reads and
//! writes at queue depths 1 and 32, where the wake-up, not the copy,
//! decides. Rows: fio's io_uring `O_DIRECT` on the same image (the limit);
//! iopath's driver on `iopath blk serve` sleeping (`--poll-us 0` on both
//! sides), adaptive (the default window on both sides) and `--poll` (both
//! sides); iopath's driver (adaptive) on qemu-storage-daemon; and the
//! adaptive pair over two queues at the deepest depth. Each cell gives
//! IOPS, p50/p99 latency and CPU time per request (driver and back end,
//! or fio), median of the runs; rows alternate run by run.

use std::path::Path;

use iopath_blk::dd::DdConfig;
use iopath_blk::workload::{Access, Op, Pattern, Stats, Workload};
use iopath_blk::PollMode;
use serde::Serialize;

use super::BlkBenchConfig;
use crate::place::{on_cpu, Cpus};
use crate::{fio, Error, Result};

/// What the small-block table measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallConfig {
    /// 4 KiB requests per run of a row.
    pub count: u64,
    /// Runs per row.
    pub runs: usize,
    /// Queue depths.
    pub depths: Vec<usize>,
}

impl SmallConfig {
    /// The short version of `iopath bench`: 8192 requests, 3 runs.
    pub fn quick() -> SmallConfig {
        SmallConfig {
            count: 8192,
            runs: 3,
            depths: vec![1, 32],
        }
    }

    /// `iopath bench --full`: 65536 requests, 5 runs.
    pub fn full() -> SmallConfig {
        SmallConfig {
            count: 65536,
            runs: 5,
            ..SmallConfig::quick()
        }
    }
}

/// The block size of the table.
pub const BS: usize = 4096;

/// One run of one cell.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SmallRun {
    /// Requests per second.
    pub iops: f64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// CPU time per request over every process of the row (driver and
    /// back end, or fio), microseconds.
    pub cpu_us: f64,
}

/// One row at one direction and depth.
#[derive(Debug, Clone, Serialize)]
pub struct SmallRow {
    /// What was measured.
    pub name: String,
    /// `read` or `write`.
    pub op: &'static str,
    /// Requests in flight.
    pub queue_depth: usize,
    /// Each run.
    pub runs: Vec<SmallRun>,
    /// IOPS over the runs.
    pub iops: Stats,
    /// Medians over the runs.
    pub p50_us: f64,
    /// Median of the runs' p99.
    pub p99_us: f64,
    /// Median CPU time per request.
    pub cpu_us: f64,
    /// Why it has no figures.
    pub skipped: Option<String>,
}

/// The table's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SmallReport {
    /// Requests per run.
    pub count: u64,
    /// Runs per row.
    pub runs: usize,
    /// Every row, by direction, depth, then row.
    pub rows: Vec<SmallRow>,
}

/// Row names.
pub const FIO: &str = "fio io_uring O_DIRECT (limit)";
/// iopath's back end and driver, sleeping at once.
pub const SLEEP: &str = "iopath blk serve, sleeping (--poll-us 0 both sides)";
/// Adaptive on both sides.
pub const ADAPTIVE: &str = "iopath blk serve, adaptive (50 us both sides)";
/// Never sleeping on both sides.
pub const BUSY: &str = "iopath blk serve, --poll (both sides)";
/// The peer.
pub const QSD: &str = "qemu-storage-daemon, driver adaptive";
/// Two queues.
pub const TWO_QUEUES: &str = "iopath blk serve, adaptive, 2 queues";

/// The back ends the rows use: a socket and the pid whose CPU time counts.
pub(super) struct Backends<'a> {
    pub sleep: Option<(&'a Path, u32)>,
    pub adaptive: Option<(&'a Path, u32)>,
    pub busy: Option<(&'a Path, u32)>,
    pub qsd: Option<(&'a Path, u32)>,
}

/// CPU time (user and system) of process `pid`, threads that have
/// exited included, nanoseconds: `/proc/PID/stat`'s utime and stime, in
/// clock ticks (queue threads end when their front end goes, before the
/// figure is read, so per-thread counters would miss them).
fn cpu_ns_of(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command (which may hold spaces) and its `)`.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| f.get(i)?.parse::<u64>().ok())
        .sum();
    ticks * 1_000_000_000 / rustix::param::clock_ticks_per_second().max(1)
}

/// CPU time of this process, threads that have exited included,
/// nanoseconds (`CLOCK_PROCESS_CPUTIME_ID`, as `getrusage(RUSAGE_SELF)`
/// counts it).
fn cpu_ns_self() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One run of iopath's driver with `poll` on the back end at `socket`
/// (pid `pid`), `queues` queues.
fn dd_run(
    (socket, pid): (&Path, u32),
    op: Op,
    qd: usize,
    count: u64,
    seed: u64,
    (poll, queues): (PollMode, usize),
) -> Result<SmallRun> {
    let w = Workload {
        op,
        pattern: Pattern::Zero,
        access: Access::Rand,
        seed,
        bs: BS,
        count,
        offset: 0,
        queue_depth: qd,
        runs: 1,
        verify: false,
    };
    let mut dd = DdConfig::new(socket, w);
    dd.poll = poll;
    dd.queues = queues;
    let (mine, theirs) = (cpu_ns_self(), cpu_ns_of(pid));
    let report = iopath_blk::dd::run(&dd, &()).map_err(Error::layer("dd"))?;
    let cpu = cpu_ns_self().saturating_sub(mine) + cpu_ns_of(pid).saturating_sub(theirs);
    let r = report.runs[0];
    Ok(SmallRun {
        iops: r.iops,
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        cpu_us: cpu as f64 / 1000.0 / count as f64,
    })
}

/// One fio run on `image` pinned to `cpu`.
fn fio_run(
    image: &Path,
    size: u64,
    op: Op,
    qd: usize,
    count: u64,
    cpu: Option<usize>,
) -> Result<SmallRun> {
    let dir = if op == Op::Read { "read" } else { "write" };
    let mut cmd = std::process::Command::new(fio::PROGRAM);
    cmd.arg("--name=limit")
        .arg(format!("--filename={}", image.display()))
        .arg(format!("--rw=rand{dir}"))
        .arg(format!("--bs={BS}"))
        .arg(format!("--iodepth={qd}"))
        .args(["--ioengine=io_uring", "--direct=1", "--lat_percentiles=1"])
        .arg(format!("--size={size}"))
        .arg(format!("--io_size={}", count * BS as u64))
        .args(["--randrepeat=0", "--norandommap", "--output-format=json"]);
    if op == Op::Read {
        cmd.arg("--readonly");
    }
    let v = fio::run(&mut cmd, cpu)?;
    parse_fio(&v, dir).ok_or_else(|| Error::Peer {
        program: fio::PROGRAM.into(),
        reason: format!("no jobs[0].{dir} figures in its JSON"),
    })
}

/// IOPS, latency percentiles and CPU time per request from fio's JSON.
fn parse_fio(v: &serde_json::Value, dir: &str) -> Option<SmallRun> {
    let job = &v["jobs"][0];
    let d = &job[dir];
    let iops = d["iops"].as_f64()?;
    let pct = &d["lat_ns"]["percentile"];
    let p50 = pct["50.000000"].as_f64()? / 1000.0;
    let p99 = pct["99.000000"].as_f64()? / 1000.0;
    let ios = d["total_ios"].as_f64()?.max(1.0);
    let runtime_s = d["runtime"].as_f64()? / 1000.0;
    let cpu = (job["usr_cpu"].as_f64()? + job["sys_cpu"].as_f64()?) / 100.0 * runtime_s;
    Some(SmallRun {
        iops,
        p50_us: p50,
        p99_us: p99,
        cpu_us: cpu * 1e6 / ios,
    })
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    Stats::of(&v.collect::<Vec<_>>()).median
}

/// Runs the table. Cells alternate within each run (every row of a
/// direction and depth one after the other, the order rotating from run
/// to run); a row whose back end is missing or fails is skipped.
pub(super) fn run(
    cfg: &BlkBenchConfig,
    small: &SmallConfig,
    image: &Path,
    b: &Backends<'_>,
    cpus: &Cpus,
    (client, server): (Option<usize>, Option<usize>),
    bar: &crate::ProgressBar,
) -> SmallReport {
    type Measure<'a> = Box<dyn Fn(Op, usize, u64) -> Result<SmallRun> + 'a>;
    let size = cfg.size as u64;
    let count = small.count.min(size / BS as u64);
    let dd = |be: Option<(&Path, u32)>, poll: PollMode, queues: usize| -> Option<Measure<'_>> {
        let (socket, pid) = be?;
        let socket = socket.to_path_buf();
        Some(Box::new(move |op, qd, seed| {
            on_cpu(client, cpus, || {
                dd_run((&socket, pid), op, qd, count, seed, (poll, queues))
            })
        }))
    };
    let rows: Vec<(&str, Option<Measure<'_>>, bool)> = vec![
        (
            FIO,
            crate::Missing::FIO.check().is_none().then(|| {
                Box::new(move |op, qd, _| fio_run(image, size, op, qd, count, server))
                    as Measure<'_>
            }),
            false,
        ),
        (SLEEP, dd(b.sleep, PollMode::SLEEP, 1), false),
        (ADAPTIVE, dd(b.adaptive, PollMode::default(), 1), false),
        (BUSY, dd(b.busy, PollMode::Busy, 1), false),
        (QSD, dd(b.qsd, PollMode::default(), 1), false),
        (TWO_QUEUES, dd(b.adaptive, PollMode::default(), 2), true),
    ];
    let deepest = small.depths.iter().copied().max().unwrap_or(1);
    let mut cells: Vec<SmallRow> = Vec::new();
    let mut index = Vec::new();
    for op in [Op::Read, Op::Write] {
        for &qd in &small.depths {
            for (i, (name, m, deep_only)) in rows.iter().enumerate() {
                if *deep_only && qd != deepest {
                    continue;
                }
                index.push((op, qd, i));
                cells.push(SmallRow {
                    name: (*name).into(),
                    op: if op == Op::Read { "read" } else { "write" },
                    queue_depth: qd,
                    runs: Vec::new(),
                    iops: Stats::of(&[]),
                    p50_us: 0.0,
                    p99_us: 0.0,
                    cpu_us: 0.0,
                    skipped: m.is_none().then(|| match *name {
                        FIO => crate::Missing::FIO.note(),
                        _ => "its back end did not start".into(),
                    }),
                });
            }
        }
    }
    for run in 0..small.runs {
        let n = cells.len();
        for k in 0..n {
            let c = (k + run) % n;
            if cells[c].skipped.is_some() {
                bar.inc(1);
                continue;
            }
            let (op, qd, i) = index[c];
            bar.set_message(format!(
                "run {}: 4K {} qd {qd}: {}",
                run + 1,
                cells[c].op,
                rows[i].0
            ));
            let m = rows[i].1.as_ref().expect("not skipped");
            match m(op, qd, run as u64 + 1) {
                Ok(r) => cells[c].runs.push(r),
                Err(e) => cells[c].skipped = Some(iopath_sys::error_chain(&e)),
            }
            bar.inc(1);
        }
    }
    for c in &mut cells {
        if c.skipped.is_some() {
            continue;
        }
        c.iops = Stats::of(&c.runs.iter().map(|r| r.iops).collect::<Vec<_>>());
        c.p50_us = median(c.runs.iter().map(|r| r.p50_us));
        c.p99_us = median(c.runs.iter().map(|r| r.p99_us));
        c.cpu_us = median(c.runs.iter().map(|r| r.cpu_us));
    }
    SmallReport {
        count,
        runs: small.runs,
        rows: cells,
    }
}

/// Progress steps of the table.
pub(super) fn steps(small: &SmallConfig) -> u64 {
    // Five rows at every depth, the two-queue row at the deepest, both
    // directions.
    (small.runs * 2 * (5 * small.depths.len() + 1)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_latency_and_cpu() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"jobs":[{"usr_cpu":10.0,"sys_cpu":40.0,"read":{"iops":100000.0,"total_ios":100000,"runtime":1000,
            "lat_ns":{"percentile":{"50.000000":6000,"99.000000":12000}}}}]}"#,
        )
        .unwrap();
        let r = parse_fio(&v, "read").unwrap();
        assert_eq!(r.iops, 100000.0);
        assert_eq!((r.p50_us, r.p99_us), (6.0, 12.0));
        assert!((r.cpu_us - 5.0).abs() < 1e-9);
        assert!(parse_fio(&v, "write").is_none());
    }
}
