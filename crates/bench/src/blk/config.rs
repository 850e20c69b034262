//! What `iopath bench blk` is asked to measure, and how long that takes.

use std::path::PathBuf;
use std::time::Duration;

use super::{small, DmaMode, Placement, SmallConfig};

/// What `iopath bench blk` measures.
#[derive(Debug, Clone)]
pub struct BlkBenchConfig {
    /// Bytes written per run (the image is this large).
    pub size: usize,
    /// Runs per row.
    pub runs: usize,
    /// Block size of every transfer.
    pub bs: usize,
    /// Blocks in flight.
    pub queue_depth: usize,
    /// Directory for the image file; `None`: RAM (/dev/shm) when the image
    /// fits with room to spare, else /var/tmp.
    pub dir: Option<PathBuf>,
    /// DMA modes to measure (empty: all).
    pub modes: Vec<DmaMode>,
    /// Where the processes run.
    pub placement: Placement,
    /// Also a Linux guest's dd (scripts/guest-dd) on each back end.
    pub guest: bool,
    /// The `iopath` executable whose `blk serve` is iopath's back end.
    pub iopath: PathBuf,
    /// Show progress on stderr.
    pub progress: bool,
    /// The small-block table (4 KiB random I/O), when asked for.
    pub small: Option<SmallConfig>,
}

impl BlkBenchConfig {
    /// The embedded defaults of `iopath bench`: 256 MiB in 8 MiB blocks,
    /// 4 in flight, 3 runs, every mode, split placement.
    pub fn quick(iopath: PathBuf) -> BlkBenchConfig {
        BlkBenchConfig {
            size: 256 << 20,
            runs: 3,
            bs: 8 << 20,
            queue_depth: 4,
            dir: None,
            modes: Vec::new(),
            placement: Placement::Split,
            guest: false,
            iopath,
            progress: true,
            small: Some(SmallConfig::quick()),
        }
    }

    /// The full sizes: `dd bs=8M count=1024` (8 GiB) x 10 runs
    /// per DMA mode.
    pub fn full(iopath: PathBuf) -> BlkBenchConfig {
        BlkBenchConfig {
            size: 8 << 30,
            runs: 10,
            small: Some(SmallConfig::full()),
            ..BlkBenchConfig::quick(iopath)
        }
    }

    /// A rough duration, from nominal rates on a 2-vCPU VM (2 GiB/s per
    /// dd or fio pass and for the image's first touch).
    pub fn estimate(&self) -> Duration {
        let gib = self.size as f64 / f64::from(1u32 << 30);
        let modes = if self.modes.is_empty() {
            4
        } else {
            self.modes.len()
        };
        // Every run: the modes, the peer, the limit; a warm-up round; the sweep.
        // Every run: the modes and the peer; the limit's sweep (6 fio passes
        // at the default bs) in the first runs, its best alone after; a
        // warm-up round.
        let swept = self.runs.min(crate::limit::SWEEP_RUNS);
        let passes = (self.runs + 1) * (modes + 1) + swept * 6 + (self.runs - swept) + 1;
        // A guest run: about 20 s of boot and checks under TCG, its dd at
        // some 50 MB/s direct, 15 MB/s bounced behind the vIOMMU.
        let guest = if self.guest {
            self.runs as f64 * (3.0 * 20.0 + gib * (2.0 / 0.05 + 1.0 / 0.015))
        } else {
            0.0
        };
        // The small-block table: some 10k requests per second at worst.
        let small = self.small.as_ref().map_or(0.0, |s| {
            small::steps(s) as f64 * (s.count as f64 / 10_000.0 + 0.1)
        });
        Duration::from_secs_f64(passes as f64 * gib / 2.0 + guest + gib / 2.0 + 3.0 + small)
    }
}
