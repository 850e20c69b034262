//! The small-block table of `iopath bench blk`: 4 KiB random reads and
//! writes at queue depths 1 and 32, where the wake-up, not the copy,
//! decides: fio (the limit); iopath's driver on `iopath blk serve`
//! sleeping, adaptive and `--poll` (both sides alike), on
//! qemu-storage-daemon, and over two queues at the deepest depth; and
//! libblkio's driver (`blkio-dd`, [`super::libblkio`]) on the same
//! sleeping and `--poll` back ends (a poll queue against `--poll`) and on
//! qemu-storage-daemon, with the same placement. IOPS, p50/p99 latency
//! and CPU time per request, medians; rows alternate.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use iopath_blk::dd::DdConfig;
use iopath_blk::workload::{Access, Op, Workload};
use iopath_blk::PollMode;

use super::{libblkio, ratio, BlkBenchConfig};
use crate::place::{on_cpu, Cpus};
use crate::report::plot::{Chart, LIMIT, PEER as PEER_COLOR, PRIMARY, SECONDARY};
use crate::report::{Cell, Column, Table, Unit};
use crate::{fio, Error, Missing, ProgressBar, Result, Stats};

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

    /// Progress steps: eight rows at every depth, the two-queue row at
    /// the deepest, both directions.
    pub(super) fn steps(&self) -> u64 {
        (self.runs * 2 * (8 * self.depths.len() + 1)) as u64
    }
}

const BS: usize = 4096;
const FIO: &str = "fio io_uring O_DIRECT (limit)";
const SLEEP: &str = "iopath blk serve, sleeping (--poll-us 0 both sides)";
const ADAPTIVE: &str = "iopath blk serve, adaptive (50 us both sides)";
const BUSY: &str = "iopath blk serve, --poll (both sides)";
const QSD: &str = "qemu-storage-daemon, driver adaptive";
const TWO_QUEUES: &str = "iopath blk serve, adaptive, 2 queues";
const LIBBLKIO_SLEEP: &str = "libblkio on blk serve, sleeping (--poll-us 0)";
const LIBBLKIO_POLL: &str = "libblkio poll queue on blk serve --poll";
const LIBBLKIO_QSD: &str = "libblkio on qemu-storage-daemon";

/// libblkio's poll queue spins without yielding: beside a polling back
/// end on the same CPU, each request waits for a time slice (minutes per
/// run), so that row needs two CPUs.
const SPINS: &str = "its poll queue spins without yielding: on the back end's CPU each \
                     request waits for a time slice (run it with --placement split)";

/// One run of one cell: IOPS, p50 and p99 latency (us), CPU time per
/// request over every process of the row (driver and back end, or fio; us).
type Run = [f64; 4];

/// One row at one direction and depth: its runs, or why it has none.
#[derive(Debug)]
pub(super) struct Row {
    name: &'static str,
    op: Op,
    queue_depth: usize,
    runs: Vec<Run>,
    skipped: Option<String>,
}

impl Row {
    /// Figure `i` ([`Run`]) of every run.
    fn each(&self, i: usize) -> Vec<f64> {
        self.runs.iter().map(|r| r[i]).collect()
    }
}

#[derive(Debug)]
pub(super) struct Measured {
    count: u64,
    runs: usize,
    rows: Vec<Row>,
}

/// The back ends the rows use: a socket and the pid whose CPU time counts.
pub(super) struct Backends {
    pub sleep: Option<(PathBuf, u32)>,
    pub adaptive: Option<(PathBuf, u32)>,
    pub busy: Option<(PathBuf, u32)>,
    pub qsd: Option<(PathBuf, u32)>,
}

/// CPU time of process `pid` ([`iopath_sys::process::cpu_time`]), ns.
fn cpu_ns_of(pid: u32) -> u64 {
    iopath_sys::process::cpu_time(pid).map_or(0, |t| t.as_nanos() as u64)
}

/// CPU time of this process, threads that have exited included, ns.
fn cpu_ns_self() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One run of iopath's driver with `poll` on the back end at `socket`
/// (pid `pid`), `queues` queues.
fn dd_run(
    (socket, pid): &(PathBuf, u32),
    (op, qd, count, seed): (Op, usize, u64, u64),
    poll: PollMode,
    queues: usize,
) -> Result<Run> {
    let w = Workload {
        op,
        access: Access::Rand,
        seed,
        bs: BS,
        count,
        queue_depth: qd,
        ..Workload::default()
    };
    let mut dd = DdConfig::new(socket, w);
    dd.poll = poll;
    dd.queues = queues;
    let (mine, theirs) = (cpu_ns_self(), cpu_ns_of(*pid));
    let report = iopath_blk::dd::run(&dd, &()).map_err(Error::layer("dd"))?;
    let cpu = cpu_ns_self().saturating_sub(mine) + cpu_ns_of(*pid).saturating_sub(theirs);
    let r = report.runs[0];
    let cpu_us = cpu as f64 / 1000.0 / count as f64;
    Ok([r.iops, r.p50_us, r.p99_us, cpu_us])
}

/// One fio run on `image` pinned to `cpu`.
fn fio_run(
    image: &Path,
    size: u64,
    op: Op,
    qd: usize,
    count: u64,
    cpu: Option<usize>,
) -> Result<Run> {
    let dir = op.name();
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
    parse_fio(&v, dir).ok_or_else(|| fio::failed(format!("no jobs[0].{dir} figures in its JSON")))
}

/// IOPS, latency percentiles and CPU time per request from fio's JSON.
fn parse_fio(v: &serde_json::Value, dir: &str) -> Option<Run> {
    let job = &v["jobs"][0];
    let d = &job[dir];
    let pct = |p: &str| Some(d["lat_ns"]["percentile"][p].as_f64()? / 1000.0);
    let ios = d["total_ios"].as_f64()?.max(1.0);
    let runtime_s = d["runtime"].as_f64()? / 1000.0;
    let cpu = (job["usr_cpu"].as_f64()? + job["sys_cpu"].as_f64()?) / 100.0 * runtime_s;
    let (p50, p99) = (pct("50.000000")?, pct("99.000000")?);
    Some([d["iops"].as_f64()?, p50, p99, cpu * 1e6 / ios])
}

/// Runs the table. Cells alternate within each run (every row of a
/// direction and depth one after the other, the order rotating from run
/// to run); a row whose back end is missing or fails is skipped.
pub(super) fn run(
    cfg: &BlkBenchConfig,
    small: &SmallConfig,
    image: &Path,
    b: &Backends,
    cpus: &Cpus,
    (client, server): (Option<usize>, Option<usize>),
    bar: &ProgressBar,
) -> Measured {
    type Measure<'a> = Box<dyn Fn(Op, usize, u64) -> Result<Run> + 'a>;
    let size = cfg.size as u64;
    let count = small.count.min(size / BS as u64);
    let no_back_end = || "its back end did not start".to_string();
    let dd = |be: &Option<(PathBuf, u32)>, poll, queues| -> Result<Measure<'_>, String> {
        let be = be.clone().ok_or_else(no_back_end)?;
        Ok(Box::new(move |op, qd, seed| {
            on_cpu(client, cpus, || {
                dd_run(&be, (op, qd, count, seed), poll, queues)
            })
        }))
    };
    let helper = libblkio::program();
    let one_cpu = client.is_some() && client == server;
    let blkio = |be: &Option<(PathBuf, u32)>, poll: bool| -> Result<Measure<'_>, String> {
        let helper = helper.clone().ok_or(libblkio::BUILD)?;
        if poll && one_cpu {
            return Err(SPINS.into());
        }
        let (socket, pid) = be.clone().ok_or_else(no_back_end)?;
        Ok(Box::new(move |op, qd, seed| {
            let theirs = cpu_ns_of(pid);
            let (iops, p50, p99, mine) =
                libblkio::run(&helper, &socket, (op, qd, count, seed), poll, client)?;
            let cpu = mine + cpu_ns_of(pid).saturating_sub(theirs) as f64;
            Ok([iops, p50, p99, cpu / 1000.0 / count as f64])
        }))
    };
    let fio: Result<Measure<'_>, String> = match Missing::FIO.check() {
        Some(m) => Err(m.note()),
        None => Ok(Box::new(move |op, qd, _| {
            fio_run(image, size, op, qd, count, server)
        })),
    };
    let adaptive = PollMode::default();
    // iopath's driver and libblkio's on one back end run one after the
    // other, so that their run-by-run ratio compares like with like.
    let ways = [
        (FIO, fio),
        (SLEEP, dd(&b.sleep, PollMode::SLEEP, 1)),
        (LIBBLKIO_SLEEP, blkio(&b.sleep, false)),
        (BUSY, dd(&b.busy, PollMode::Busy, 1)),
        (LIBBLKIO_POLL, blkio(&b.busy, true)),
        (ADAPTIVE, dd(&b.adaptive, adaptive, 1)),
        (TWO_QUEUES, dd(&b.adaptive, adaptive, 2)),
        (QSD, dd(&b.qsd, adaptive, 1)),
        (LIBBLKIO_QSD, blkio(&b.qsd, false)),
    ];
    // Two queues only at the deepest depth.
    let deepest = small.depths.iter().copied().max().unwrap_or(1);
    let mut rows: Vec<Row> = Vec::new();
    let mut way = Vec::new();
    for op in [Op::Read, Op::Write] {
        for &queue_depth in &small.depths {
            for (i, (name, m)) in ways.iter().enumerate() {
                if *name != TWO_QUEUES || queue_depth == deepest {
                    way.push(i);
                    let (runs, skipped) = (Vec::new(), m.as_ref().err().cloned());
                    rows.push(Row {
                        name,
                        op,
                        queue_depth,
                        runs,
                        skipped,
                    });
                }
            }
        }
    }
    for run in 0..small.runs {
        // Every other run backwards: neither of two neighbours always leads.
        let mut order: Vec<usize> = crate::turns(rows.len(), run).collect();
        if run % 2 == 1 {
            order.reverse();
        }
        for c in order {
            let (row, (name, m)) = (&mut rows[c], &ways[way[c]]);
            if let (None, Ok(m)) = (&row.skipped, m) {
                let (op, qd) = (row.op, row.queue_depth);
                bar.set_message(format!("run {}: 4K {op} qd {qd}: {name}", run + 1));
                match m(op, qd, run as u64 + 1) {
                    Ok(r) => row.runs.push(r),
                    Err(e) => row.skipped = Some(e.chain()),
                }
            }
            bar.inc(1);
        }
    }
    let runs = small.runs;
    Measured { count, runs, rows }
}

impl Measured {
    /// Row `name` at `op` and `qd`, if it ran.
    fn ran(&self, name: &str, op: Op, qd: usize) -> Option<&Row> {
        let is = |r: &&Row| r.name == name && r.op == op && r.queue_depth == qd;
        self.rows.iter().find(is).filter(|r| r.skipped.is_none())
    }

    /// The median of figure `i` of row `name` at `op` and `qd`, if it ran.
    fn median(&self, name: &str, op: Op, qd: usize, i: usize) -> Option<f64> {
        Some(Stats::of(&self.ran(name, op, qd)?.each(i)).median)
    }

    /// Figure `i` of row `a` over row `b` at `op` and `qd`, run by run
    /// (each run measures both rows in one pass, so the machine's slow
    /// and fast spells weigh on both alike): their median and range; n/a
    /// when either did not run.
    fn paired(&self, (a, b): (&str, &str), op: Op, qd: usize, i: usize) -> Cell {
        let rows = self.ran(a, op, qd).zip(self.ran(b, op, qd));
        let pairs = rows.iter().flat_map(|(a, b)| a.runs.iter().zip(&b.runs));
        let q: Vec<f64> = pairs.map(|(x, y)| x[i] / y[i]).collect();
        Cell::runs(&q, Unit::Times, 2)
    }

    /// The queue depths measured, smallest first.
    fn depths(&self) -> BTreeSet<usize> {
        self.rows.iter().map(|r| r.queue_depth).collect()
    }

    /// The table: IOPS (min-max), p50, p99, CPU per request, share of
    /// fio's IOPS at the same direction and depth; the ratios below.
    pub(super) fn table(&self, placement: &str) -> Table {
        let mut t = Table::new(
            format!(
                "4 KiB random I/O, {} requests per run, {} runs per row, median; {placement}",
                self.count, self.runs
            ),
            vec![
                Column::left("row"),
                Column::left("op"),
                Column::right("QD"),
                Column::right("IOPS, median (min-max)"),
                Column::right("p50"),
                Column::right("p99"),
                Column::right("CPU per request"),
                Column::right("of fio"),
            ],
        );
        for r in &self.rows {
            if let Some(why) = &r.skipped {
                let row = format!("{} {} qd {}", r.name, r.op, r.queue_depth);
                t.not_run(row, why, why);
                continue;
            }
            let iops = Stats::of(&r.each(0)).median;
            let of_fio = ratio(Some(iops), self.median(FIO, r.op, r.queue_depth, 0));
            t.row(vec![
                r.name.into(),
                r.op.name().into(),
                Cell::num(r.queue_depth as f64, 0),
                Cell::runs(&r.each(0), Unit::Grouped, 0),
                Cell::median(&r.each(1), Unit::Micros, 1),
                Cell::median(&r.each(2), Unit::Micros, 1),
                Cell::median(&r.each(3), Unit::Micros, 1),
                Cell::or_na(of_fio.map(|q| Cell::percent(q * 100.0, 1))),
            ]);
        }
        let deep = self.depths().last().copied().unwrap_or(1);
        // (depth, ratio, row over row, of figure: 0 IOPS, 1 p50 latency)
        let ratios = [
            (1, "--poll / qemu-storage-daemon", BUSY, QSD, 0),
            (1, "--poll / fio", BUSY, FIO, 1),
            (1, "adaptive / qemu-storage-daemon", ADAPTIVE, QSD, 0),
            (1, "adaptive / sleeping", ADAPTIVE, SLEEP, 0),
            (deep, "adaptive / qemu-storage-daemon", ADAPTIVE, QSD, 0),
            (deep, "adaptive / fio", ADAPTIVE, FIO, 0),
            (
                deep,
                "2 queues / 1 queue (adaptive)",
                TWO_QUEUES,
                ADAPTIVE,
                0,
            ),
        ];
        for op in [Op::Read, Op::Write] {
            for (qd, what, a, b, i) in ratios {
                let of = ["IOPS", "p50 latency"][i];
                let q = self.paired((a, b), op, qd, i);
                t.figure(format!("{op} qd {qd}: {what}, {of}"), q);
            }
            // iopath's driver against libblkio's on the same back end.
            for qd in [1, deep] {
                for (what, ours, theirs) in [
                    (
                        "blk serve sleeping, iopath / libblkio",
                        SLEEP,
                        LIBBLKIO_SLEEP,
                    ),
                    (
                        "blk serve --poll, iopath --poll / libblkio poll queue",
                        BUSY,
                        LIBBLKIO_POLL,
                    ),
                    (
                        "qemu-storage-daemon, iopath adaptive / libblkio",
                        QSD,
                        LIBBLKIO_QSD,
                    ),
                ] {
                    let q = self.paired((ours, theirs), op, qd, 0);
                    t.figure(format!("{op} qd {qd}: {what}, IOPS"), q);
                }
            }
        }
        t
    }

    /// A chart per direction: the IOPS of each row of `t` (the table)
    /// with its min-max, grouped by queue depth, fio's first.
    pub(super) fn charts(&self, t: &Table, placement: &str) -> Vec<Chart> {
        let [op, qd, iops] = ["op", "QD", "IOPS, median (min-max)"].map(|n| t.col(n));
        let about = format!(
            "{} requests per run, median (min-max) of {} runs; {placement}",
            self.count, self.runs
        );
        ["read", "write"]
            .map(|dir| {
                let title = format!(
                    "virtio-blk 4 KiB random {dir}s: IOPS by driver, back end and queue depth"
                );
                let mut c = Chart::new(format!("blk-4k-random-{dir}-iops"), title, "IOPS")
                    .about(about.clone(), "IOPS, higher is faster")
                    .legend(&[
                        ("fio (limit)", LIMIT),
                        ("iopath, sleeping back end", SECONDARY),
                        ("iopath, adaptive or polling", PRIMARY),
                        ("qemu-storage-daemon or libblkio", PEER_COLOR),
                    ]);
                for depth in self.depths() {
                    c.group(format!("queue depth {depth}"));
                    let rows = t.rows.iter().filter(|r| r[op].to_string() == dir);
                    for r in rows.filter(|r| r[qd].value() == Some(depth as f64)) {
                        let name = r[0].to_string();
                        let color = match name.as_str() {
                            FIO => LIMIT,
                            QSD | LIBBLKIO_SLEEP | LIBBLKIO_POLL | LIBBLKIO_QSD => PEER_COLOR,
                            SLEEP => SECONDARY,
                            _ => PRIMARY,
                        };
                        c.bar(name, &r[iops], color);
                    }
                }
                c
            })
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_taken_run_by_run() {
        let row = |name, iops: [f64; 3], skipped: Option<String>| Row {
            name,
            op: Op::Read,
            queue_depth: 1,
            runs: iops.iter().map(|&x| [x, 0.0, 0.0, 0.0]).collect(),
            skipped,
        };
        let rows = vec![
            row(BUSY, [100.0, 300.0, 200.0], None),
            row(LIBBLKIO_POLL, [200.0, 200.0, 100.0], None),
            row(QSD, [1.0, 1.0, 1.0], Some("no qemu-storage-daemon".into())),
        ];
        let m = Measured {
            count: 1,
            runs: 3,
            rows,
        };
        // The medians' ratio would be 200 / 200; run by run: 0.5, 1.5, 2.
        let q = m.paired((BUSY, LIBBLKIO_POLL), Op::Read, 1, 0);
        assert_eq!(q, Cell::runs(&[0.5, 1.5, 2.0], Unit::Times, 2));
        assert_eq!(q.value(), Some(1.5));
        let skipped = m.paired((BUSY, QSD), Op::Read, 1, 0);
        assert_eq!(skipped, Cell::NotAvailable);
    }

    #[test]
    fn parses_fio_latency_and_cpu() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"jobs":[{"usr_cpu":10.0,"sys_cpu":40.0,"read":{"iops":100000.0,"total_ios":100000,"runtime":1000,
            "lat_ns":{"percentile":{"50.000000":6000,"99.000000":12000}}}}]}"#,
        )
        .unwrap();
        let [iops, p50, p99, cpu] = parse_fio(&v, "read").unwrap();
        assert_eq!(iops, 100000.0);
        assert_eq!((p50, p99), (6.0, 12.0));
        assert!((cpu - 5.0).abs() < 1e-9);
        assert!(parse_fio(&v, "write").is_none());
    }
}
