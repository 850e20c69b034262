//! `iopath bench`: the arguments of the experiments, mapped to the configs
//! of `iopath-bench`, which runs them and builds their reports; the
//! reports printed and, when asked, written to files.
//!
//! `iopath bench` with no subcommand runs every experiment on small embedded
//! defaults (the "main job", well under two minutes), or with `--full` on
//! the full sizes.

mod blk;
mod heap;
mod place;
mod rpmsg;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use iopath_bench::blk::BlkBenchConfig;
use iopath_bench::heap::HeapConfig;
use iopath_bench::report::{Files, Written};
use iopath_bench::rpmsg::RpmsgConfig;
use iopath_bench::Report;

pub use blk::BenchBlkArgs;
pub use heap::HeapArgs;
pub use place::PlacementArg;
pub use rpmsg::RpmsgArgs;

/// Arguments of `iopath bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without a subcommand, runs every experiment on small defaults (under two
minutes); a peer that is missing (fio, qemu-storage-daemon) drops its row,
with a note, and the bench measures a limit of its own in fio's place:
  iopath bench
  iopath bench --plot charts --markdown bench.md --json bench.json
  iopath bench --full --plot docs/bench      # 1 GiB file; 8 GiB x 10 runs; 100,000 loops; prints an estimate first
  iopath bench heap --size 1G --runs 3

Exit status: 0 when every experiment ran (missing peers included), 1 on an
error, 2 on a usage error. SIGINT or SIGTERM stops the child processes, removes the scratch
files and exits 130 or 143.")]
pub struct BenchArgs {
    /// One experiment; without it, all of them on small defaults.
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// (Without a subcommand) the full sizes: a 1 GiB file into 32 x 32
    /// MiB buffers; 8 GiB written in 8 MiB blocks (`dd bs=8M count=1024`)
    /// x 10 runs per DMA mode; 1,000 / 10,000 / 100,000 create+destroy
    /// loops.
    #[arg(long)]
    pub full: bool,
    /// (Without a subcommand) write one JSON object, one key per experiment
    /// with every row, to FILE (`-` or no FILE: stdout, instead of the
    /// tables).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub out: Outputs,
}

/// Files a bench writes when asked (never otherwise).
#[derive(Debug, Clone, clap::Args)]
pub struct Outputs {
    /// Write one SVG chart per experiment into DIR (created if needed):
    /// heap.svg, blk.svg, rpmsg.svg.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Write the tables as Markdown (as in BENCHMARKS.md) to FILE.
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
}

impl Outputs {
    /// The files to write, with the JSON object to `json` unless that is
    /// stdout (`-`).
    fn files(&self, json: Option<&Path>) -> Files {
        let json = json.filter(|p| *p != Path::new("-"));
        Files::new(
            self.plot.clone(),
            self.markdown.clone(),
            json.map(Path::to_path_buf),
        )
    }
}

/// The experiments.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCmd {
    /// Fill 32 x 32 MiB buffers from a cold file with every heap and
    /// method, beside fio's O_DIRECT io_uring read of the same file.
    Heap(HeapArgs),
    /// iopath's virtio-blk driver writes an image through each DMA mode
    /// (direct, direct-static, iommu, bounce) via `iopath blk serve`,
    /// beside fio's O_DIRECT write of the same image and the same driver
    /// against qemu-storage-daemon; with --guest, a Linux guest's dd on
    /// both back ends too, and on iopath's with swiotlb=force behind the
    /// vIOMMU. Then 4 KiB random reads and writes at queue depths 1 and
    /// 32: fio, `iopath blk serve` sleeping, adaptive and --poll,
    /// qemu-storage-daemon, two queues (IOPS, p50/p99, CPU per request).
    Blk(BenchBlkArgs),
    /// rpmsg endpoints as fds (RPMSG_CREATE_EPT_FD_IOCTL): create+destroy
    /// an endpoint L times the legacy way (a node to open) and the fd way,
    /// beside a raw SOCK_SEQPACKET request/response passing an fd; echo
    /// latency beside a raw eventfd ping-pong.
    Rpmsg(RpmsgArgs),
}

/// The command line, for the Markdown file.
fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "iopath".into();
    }
    args.join(" ")
}

/// Says where the files went.
fn say(w: &Written) {
    for c in &w.charts {
        println!("chart: {}", c.display());
    }
    if let Some(m) = &w.markdown {
        println!("markdown: {}", m.display());
    }
    if let Some(j) = &w.json {
        println!("json: {}", j.display());
    }
}

/// Runs one experiment once its files are known to be writable, prints
/// its report (its JSON with `json`, else its tables and where its files
/// went) and writes its files.
fn one(report: impl FnOnce() -> Result<Report>, json: bool, out: &Outputs) -> Result<()> {
    let mut files = out.files(None);
    files.check()?;
    let r = files.add(report()?)?;
    if json {
        println!("{}", r.json());
        files.finish(&command_line())?;
    } else {
        print!("{}", r.text());
        say(&files.finish(&command_line())?);
    }
    Ok(())
}

/// Runs `iopath bench`.
///
/// # Errors
/// Whatever the experiment fails with.
pub fn run(args: &BenchArgs) -> Result<()> {
    // SIGINT/SIGTERM: stop the children, remove the scratch files, exit
    // 130/143.
    iopath_bench::cleanup::on_signals()?;
    // Where the results go is checked before anything runs: a bad path
    // costs no experiment.
    let r = match &args.cmd {
        Some(BenchCmd::Heap(a)) => one(|| a.report(), a.json, &a.out),
        Some(BenchCmd::Blk(a)) => one(|| a.report(), a.json, &a.out),
        Some(BenchCmd::Rpmsg(a)) => one(|| a.report(), a.json, &a.out),
        None => run_all(args),
    };
    if r.is_err() {
        // Interrupted: the signal thread exits 130/143 once it has cleaned
        // up; an error its stopping caused must not exit 1 before it.
        iopath_bench::cleanup::wait_if_interrupted();
    }
    r
}

fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{s} s")
    }
}

/// Every experiment, on embedded defaults or (`--full`) the full sizes.
fn run_all(args: &BenchArgs) -> Result<()> {
    let exe = iopath_bench::current_exe()?;
    let to_stdout = args.json.as_deref() == Some(Path::new("-"));
    args.out.files(args.json.as_deref()).check()?;
    let (h, b, r) = if args.full {
        (
            HeapConfig::full(),
            BlkBenchConfig::full(exe.clone()),
            RpmsgConfig::full(exe),
        )
    } else {
        (
            HeapConfig::quick(),
            BlkBenchConfig::quick(exe.clone()),
            RpmsgConfig::quick(exe),
        )
    };
    if args.full {
        let (eh, eb, er) = (h.estimate(), b.estimate(), r.estimate());
        let line = format!(
            "bench --full: 1 GiB file; 8 GiB x 10 runs; 100,000 loops; estimated duration {} (heap {}, blk {}, rpmsg {}; nominal rates of a 2-vCPU VM, a loaded machine takes longer)",
            minutes(eh + eb + er),
            minutes(eh),
            minutes(eb),
            minutes(er)
        );
        if to_stdout {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    let mut files = args.out.files(args.json.as_deref());
    for name in ["heap", "blk", "rpmsg"] {
        if !to_stdout {
            println!("== {name}");
        }
        let report = match name {
            "heap" => iopath_bench::heap::run(&h)?.report(),
            "blk" => iopath_bench::blk::run(&b)?.report(),
            _ => iopath_bench::rpmsg::run(&r)?.report(),
        };
        let report = files.add(report)?;
        if !to_stdout {
            print!("{}", report.text());
            println!();
        }
    }
    let written = files.finish(&command_line())?;
    if to_stdout {
        println!("{}", files.json());
    } else {
        say(&written);
    }
    Ok(())
}
