//! iopath-bench: iopath's heap, blk and rpmsg experiments, each beside
//! the limit measured in the same run, and the writers of their reports.
//!
//! ```text
//!   Experiment (a config: sizes, runs, placements; quick() and full())
//!      |
//!   heap::run ---- iopath-heap loaders ------ limit: best of a fio read sweep
//!   blk::run  ---- iopath-blk workload ------ limit: best of a fio write sweep;
//!      |            (policy-chosen DMA ops)     qemu-storage-daemon, guest rows
//!   rpmsg::run --- iopath-rpmsg ctrl client - raw SOCK_SEQPACKET / eventfd
//!      |              (host, remote, back end: child processes)
//!   Report (tables of cells, context, chart)
//!      -> text(), markdown(), json(), plot() (SVG); report::Files writes them
//! ```
//!
//! [`run`] runs experiments and prints their reports. A missing peer (fio,
//! qemu-storage-daemon, QEMU) drops its row, never the run; without fio
//! the limits are the bench's own O_DIRECT I/O. The bench's own servers
//! are children of the `iopath` executable ([`serve_if_child`]).
//!
//! ```
//! let s = iopath_bench::Stats::of(&[3.0, 1.0, 2.0]);
//! assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
//! ```
#![forbid(unsafe_code)]

pub mod blk;
mod child;
mod cleanup;
mod direct;
mod error;
mod fio;
pub mod heap;
mod limit;
mod place;
mod progress;
pub mod report;
pub mod rpmsg;

use std::path::{Path, PathBuf};

pub use error::{Error, Result};
pub use iopath_blk::workload::Stats;
pub use place::Placement;
use progress::ProgressBar;
pub use report::{plot, Report};

/// Runs the bench server this process was started as, if it was started
/// as one (`IOPATH_BENCH_CHILD` set), or the raw ping-pong's partner
/// ([`iopath_rpmsg::tools::ping::RawPingPong`]): its result, to report and
/// exit with. `None`: a process of its own, to go on as usual.
pub fn serve_if_child() -> Option<Result<()>> {
    if let Some(r) = iopath_rpmsg::tools::ping::serve_partner_if_asked() {
        return Some(r.map_err(Error::layer("the raw ping-pong's partner")));
    }
    let value = std::env::var_os(child::ENV)?;
    Some(child::Server::parse(&value).and_then(rpmsg::raw::serve))
}

/// An experiment and its settings.
#[derive(Debug, Clone)]
pub enum Experiment {
    /// `iopath bench heap`.
    Heap(heap::HeapConfig),
    /// `iopath bench blk`.
    Blk(blk::BlkBenchConfig),
    /// `iopath bench rpmsg`.
    Rpmsg(rpmsg::RpmsgConfig),
}

impl Experiment {
    /// Every experiment on the embedded defaults, or (`full`) the full
    /// sizes, run by the `iopath` executable `exe`.
    pub fn all(full: bool, exe: PathBuf) -> Vec<Experiment> {
        use {blk::BlkBenchConfig as B, heap::HeapConfig as H, rpmsg::RpmsgConfig as R};
        let (h, b, r) = match full {
            false => (H::quick(), B::quick(exe.clone()), R::quick(exe)),
            true => (H::full(), B::full(exe.clone()), R::full(exe)),
        };
        vec![Self::Heap(h), Self::Blk(b), Self::Rpmsg(r)]
    }

    fn run(&self) -> Result<Report> {
        match self {
            Experiment::Heap(c) => heap::run(c),
            Experiment::Blk(c) => blk::run(c),
            Experiment::Rpmsg(c) => rpmsg::run(c),
        }
    }

    /// Its name, as the CLI's subcommand.
    fn name(&self) -> &'static str {
        match self {
            Experiment::Heap(_) => "heap",
            Experiment::Blk(_) => "blk",
            Experiment::Rpmsg(_) => "rpmsg",
        }
    }
}

/// Where the reports go besides the tables on stdout.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    /// Every figure as one JSON object into this file; `-`: on stdout
    /// instead of the tables.
    pub json: Option<PathBuf>,
    /// The SVG charts, one per message, into this directory.
    pub plot: Option<PathBuf>,
    /// The tables as Markdown into this file.
    pub markdown: Option<PathBuf>,
}

/// Runs `experiments` one after the other and prints their reports (the
/// tables, under `== NAME` when there are several, or the JSON), then
/// writes the files `out` asks for, checked first. SIGINT or SIGTERM stops
/// the children, removes the scratch files and exits 130 or 143.
///
/// # Errors
/// An output that cannot be written; whatever an experiment fails with.
pub fn run(experiments: &[Experiment], out: &Outputs) -> Result<()> {
    cleanup::on_signals()?;
    let r = run_all(experiments, out);
    if r.is_err() {
        // The error may be the signal's doing: exit 130/143 with it.
        cleanup::wait_if_interrupted();
    }
    r
}

fn run_all(experiments: &[Experiment], out: &Outputs) -> Result<()> {
    let stdout = out.json.as_deref() == Some(Path::new("-"));
    progress::show(!stdout);
    let mut files = report::Files::new(out);
    files.check()?;
    let several = experiments.len() > 1;
    for e in experiments {
        if several && !stdout {
            println!("== {}", e.name());
        }
        let r = files.add(e.run()?)?;
        if !stdout {
            print!("{}{}", r.text(), if several { "\n" } else { "" });
        }
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let written = files.finish(&format!("iopath {}", args.join(" ")))?;
    if stdout {
        println!("{}", files.json());
    } else {
        written.iter().for_each(|w| println!("{w}"));
    }
    Ok(())
}

/// The indices `0..n` from `first` on, wrapping round: the order in which
/// a run takes its rows, rotated from run to run so that none always goes
/// first.
fn turns(n: usize, first: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (k + first) % n)
}

/// `TMPFS_MAGIC` of statfs(2).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The file system type of `path` (statfs(2)'s `f_type`).
#[allow(clippy::unnecessary_cast)] // `f_type` is i64 on x86_64, other types elsewhere
fn fs_type(path: &Path) -> Option<i64> {
    rustix::fs::statfs(path).ok().map(|s| s.f_type as i64)
}

/// A directory on a disk file system for scratch files: `/var/tmp`, else the
/// current directory; never a tmpfs (a benchmark file there would be RAM).
fn scratch_dir() -> Result<PathBuf> {
    let cwd = std::env::current_dir().map_err(Error::sys("reading the current directory"))?;
    let dirs = [PathBuf::from("/var/tmp"), cwd];
    let disk = |d: &&PathBuf| fs_type(d).is_some_and(|t| t != TMPFS_MAGIC);
    if let Some(d) = dirs.iter().find(disk) {
        return Ok(d.clone());
    }
    let tried: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    error::invalid!(
        "--file",
        "no disk-backed directory for the scratch file ({} are tmpfs or unreadable); pass --file",
        tried.join(", ")
    )
}

/// A peer program a row needs and this machine lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Missing {
    /// The program.
    pub program: &'static str,
    /// The Debian package that brings it.
    pub package: &'static str,
}

impl Missing {
    const FIO: Missing = Missing::new("fio", "fio");
    const QSD: Missing = Missing::new("qemu-storage-daemon", "qemu-utils");

    const fn new(program: &'static str, package: &'static str) -> Missing {
        Missing { program, package }
    }

    /// `None` when the program is on the `PATH` (`PROGRAM --version`
    /// runs), else itself.
    fn check(self) -> Option<Missing> {
        let ran = std::process::Command::new(self.program)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output();
        (!ran.is_ok_and(|o| o.status.success())).then_some(self)
    }

    /// What is missing, its package, and that `scripts/install-deps`
    /// installs it.
    pub fn note(&self) -> String {
        format!(
            "{} is not installed (Debian package {}; scripts/install-deps installs it)",
            self.program, self.package
        )
    }
}

/// The 1-minute load average (`/proc/loadavg`), to report beside figures
/// that other work on the machine moves.
fn loadavg() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// The `iopath` executable this process is (the bench's servers are its
/// children).
///
/// # Errors
/// When `/proc/self/exe` cannot be read.
pub fn current_exe() -> Result<PathBuf> {
    std::env::current_exe().map_err(Error::sys("finding the iopath executable"))
}
