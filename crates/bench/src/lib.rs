//! iopath-bench: iopath's heap, blk and rpmsg experiments, each beside
//! the limit measured in the same run, and the writers of their reports.
//!
//! ```text
//!   config (plain structs: sizes, runs, placements; quick() and full())
//!      |
//!   heap::run ---- iopath-heap loaders ------ limit: best of a fio read sweep
//!   blk::run  ---- iopath-blk workload ------ limit: best of a fio write sweep;
//!      |            (policy-chosen DMA ops)     qemu-storage-daemon, guest rows
//!   rpmsg::run --- iopath-rpmsg ctrl client - raw SOCK_SEQPACKET / eventfd
//!      |              (host, remote, back end: child processes)
//!   Report (tables of cells, notes, chart, figures)
//!      -> text(), markdown(), json(), plot() (SVG); report::Files writes them
//! ```
//!
//! Each experiment takes a config and returns a report; the caller prints
//! it. Peers (fio, qemu-storage-daemon, QEMU) are child processes found on
//! the `PATH`: a missing one drops its row (a note with its Debian
//! package, ratios n/a), never the run, and without fio the heap and blk
//! limits are the bench's own plain O_DIRECT I/O ([`direct`]). The bench's
//! own servers are child processes of the `iopath` executable named in
//! each config, which runs them from `main` ([`serve_if_child`]).
//!
//! ```
//! use iopath_bench::Summary;
//! let s = Summary::of(&[3.0, 1.0, 2.0]);
//! assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
//! ```
#![forbid(unsafe_code)]

pub mod blk;
pub mod child;
pub mod cleanup;
mod error;
pub mod fio;
pub mod guest;
pub mod heap;
mod latency;
pub mod place;
pub mod progress;
pub mod report;
pub mod rpmsg;

use std::path::PathBuf;

pub mod direct;
pub mod limit;
pub use error::{Error, Result};
pub use latency::{percentile, Latency};
pub use place::{Cpus, Placement};
pub use progress::ProgressBar;
pub use report::{plot, Report};

/// Runs the bench server this process was started as, if it was started
/// as one ([`child::ENV`] set): its result, to report and exit with.
/// `None`: a process of its own, to go on as usual.
pub fn serve_if_child() -> Option<Result<()>> {
    let value = std::env::var_os(child::ENV)?;
    Some(child::Server::parse(&value).and_then(rpmsg::raw::serve))
}

/// Median, minimum and maximum of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// The median.
    pub median: f64,
    /// The smallest sample.
    pub min: f64,
    /// The largest sample.
    pub max: f64,
}

impl Summary {
    /// Summarises `samples` (NaN when empty).
    pub fn of(samples: &[f64]) -> Summary {
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Summary {
            median,
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
        }
    }

    /// (max - min) / median, in percent.
    pub fn spread_pct(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / self.median * 100.0
        }
    }

    /// JSON: `{median, min, max}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"median": self.median, "min": self.min, "max": self.max})
    }
}

/// `TMPFS_MAGIC` of statfs(2).
pub const TMPFS_MAGIC: i64 = 0x0102_1994;

/// A directory on a disk file system for scratch files: `/var/tmp`, else the
/// current directory; never a tmpfs (a benchmark file there would be RAM).
///
/// # Errors
/// [`Error::Invalid`] (option `--file`) when neither is disk-backed.
#[allow(clippy::unnecessary_cast)] // `f_type` is i64 on x86_64, other types elsewhere
pub fn scratch_dir() -> Result<PathBuf> {
    let mut tried = Vec::new();
    let cwd = std::env::current_dir().map_err(Error::sys("reading the current directory"))?;
    for dir in [PathBuf::from("/var/tmp"), cwd] {
        match rustix::fs::statfs(&dir) {
            Ok(st) if st.f_type as i64 != TMPFS_MAGIC => return Ok(dir),
            Ok(_) => tried.push(format!("{} is tmpfs", dir.display())),
            Err(e) => tried.push(format!("{}: {e}", dir.display())),
        }
    }
    error::invalid!(
        "--file",
        "no disk-backed directory for the scratch file ({}); pass --file",
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
    /// fio.
    pub const FIO: Missing = Missing {
        program: "fio",
        package: "fio",
    };
    /// qemu-storage-daemon.
    pub const QSD: Missing = Missing {
        program: "qemu-storage-daemon",
        package: "qemu-utils",
    };
    /// QEMU for the guest rows.
    pub const QEMU: Missing = Missing {
        program: "qemu-system-x86_64",
        package: "qemu-system-x86",
    };

    /// Whether the program is on the `PATH` (runs `PROGRAM --version`).
    pub fn installed(&self) -> bool {
        std::process::Command::new(self.program)
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    /// `None` when installed, else itself.
    pub fn check(self) -> Option<Missing> {
        (!self.installed()).then_some(self)
    }

    /// The note printed in place of a row: what is missing, its package,
    /// and that `scripts/install-deps` installs it.
    pub fn note(&self) -> String {
        format!(
            "{} is not installed (Debian package {}; scripts/install-deps installs it)",
            self.program, self.package
        )
    }

    /// `{program, package, note}` for the `missing` field of a JSON row.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"program": self.program, "package": self.package, "note": self.note()})
    }
}

/// The 1-minute load average (`/proc/loadavg`), to report beside figures
/// that other work on the machine moves.
pub fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The `iopath` executable this process is (the bench's servers are its
/// children), for configs that do not name another.
///
/// # Errors
/// [`Error::Sys`] when `/proc/self/exe` cannot be read.
pub fn current_exe() -> Result<PathBuf> {
    std::env::current_exe().map_err(Error::sys("finding the iopath executable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(s.spread_pct(), 100.0);
        assert_eq!(Summary::of(&[1.0, 2.0, 4.0, 8.0]).median, 3.0);
    }
}
