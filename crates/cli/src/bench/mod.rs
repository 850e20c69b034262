//! `iopath bench`: the seed experiments, each beside the limit measured in the
//! same run.
//!
//! `iopath bench` with no subcommand runs every experiment on small embedded
//! defaults (the "main job", well under a minute). To add an experiment: a
//! module with its `clap::Args`, a variant in [`BenchCmd`], and an entry in
//! [`run_default`].

pub mod blk;
pub mod fio;
pub mod guest;
pub mod heap;
pub mod place;
pub mod rpmsg;

use std::path::PathBuf;

use anyhow::{bail, Result};

/// Arguments of `iopath bench`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without a subcommand, runs every experiment on small defaults (under a minute):
  iopath bench
  iopath bench heap --size 1G --runs 3")]
pub struct BenchArgs {
    /// One experiment; without it, all of them on small defaults.
    #[command(subcommand)]
    pub cmd: Option<BenchCmd>,
    /// (Without a subcommand) print one JSON object, one key per experiment.
    #[arg(long)]
    pub json: bool,
}

/// The experiments.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCmd {
    /// Fill 32 x 32 MiB buffers from a cold file with every heap and
    /// method, beside fio's O_DIRECT io_uring read of the same file.
    Heap(heap::HeapArgs),
    /// The 2018 "virtio uses the DMA API" experiment: iopath's virtio-blk
    /// driver writes an image through each DMA mode (direct, direct-static,
    /// iommu, bounce) via `iopath blk serve`, beside fio's O_DIRECT write of
    /// the same image and the same driver against qemu-storage-daemon;
    /// with --guest, a Linux guest's dd on both back ends too.
    Blk(blk::BenchBlkArgs),
    /// The 2025 RPMSG_CREATE_EPT_FD_IOCTL experiment: create+destroy an
    /// endpoint L times the legacy way (a node to open) and the fd way,
    /// beside a raw SOCK_SEQPACKET request/response passing an fd; echo
    /// latency beside a raw eventfd ping-pong.
    Rpmsg(rpmsg::RpmsgArgs),
}

/// Runs `iopath bench`.
///
/// # Errors
/// Whatever the experiment fails with.
pub fn run(args: &BenchArgs) -> Result<()> {
    match &args.cmd {
        Some(BenchCmd::Heap(a)) => heap::run(a),
        Some(BenchCmd::Blk(a)) => blk::run(a),
        Some(BenchCmd::Rpmsg(a)) => rpmsg::run(a),
        None => run_default(args.json),
    }
}

/// An experiment on its embedded defaults: prints its table unless asked for
/// JSON, and returns its JSON object.
type Experiment = fn(bool) -> Result<serde_json::Value>;

/// Every experiment on embedded defaults.
fn run_default(json: bool) -> Result<()> {
    let mut all = serde_json::Map::new();
    let experiments: [(&str, Experiment); 3] = [
        ("heap", heap::run_default),
        ("blk", blk::run_default),
        ("rpmsg", rpmsg::run_default),
    ];
    for (name, f) in experiments {
        if !json {
            println!("== {name}");
        }
        all.insert(name.into(), f(json)?);
        if !json {
            println!();
        }
    }
    if json {
        println!("{}", serde_json::Value::Object(all));
    }
    Ok(())
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
    /// Summarises `samples` (not empty).
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
pub(crate) const TMPFS_MAGIC: i64 = 0x0102_1994;

/// A directory on a disk file system for scratch files: `/var/tmp`, else the
/// current directory; never a tmpfs (a benchmark file there would be RAM).
///
/// # Errors
/// When neither is disk-backed.
#[allow(clippy::unnecessary_cast)] // `f_type` is i64 on x86_64, other types elsewhere
pub fn scratch_dir() -> Result<PathBuf> {
    let mut tried = Vec::new();
    for dir in [PathBuf::from("/var/tmp"), std::env::current_dir()?] {
        match rustix::fs::statfs(&dir) {
            Ok(st) if st.f_type as i64 != TMPFS_MAGIC => return Ok(dir),
            Ok(_) => tried.push(format!("{} is tmpfs", dir.display())),
            Err(e) => tried.push(format!("{}: {e}", dir.display())),
        }
    }
    bail!(
        "no disk-backed directory for the scratch file ({}); pass --file",
        tried.join(", ")
    )
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
