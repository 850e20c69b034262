//! What `iopath bench rpmsg` measures: loop counts, runs, round trips,
//! placements, the peer rows' settings, and the checks of those settings.

use std::path::PathBuf;
use std::time::Duration;

use super::peers;
use crate::error::invalid;
use crate::{Placement, Result};

/// What `iopath bench rpmsg` measures.
#[derive(Debug, Clone)]
pub struct RpmsgConfig {
    /// Create+destroy cycles per row.
    pub loops: Vec<u64>,
    /// Runs per row (median and spread are reported).
    pub runs: usize,
    /// Echo round trips (16-byte messages) for the latency rows.
    pub count: u64,
    /// Also measure echo latency with host and remote polling the rings and
    /// the client busy-polling its fd (no notifications; spins two cores).
    pub poll: bool,
    /// Where the processes run; the first one fills the main table and
    /// JSON `rows`.
    pub placement: Vec<Placement>,
    /// OpenAMP's demo, built by `scripts/openamp-demo build SRC DIR`: the
    /// peer rows run when given, else they are noted as missing.
    pub openamp: Option<PathBuf>,
    /// Where the peer rows' processes run (driver side, remote).
    pub peer_placement: Vec<Placement>,
    /// Longest a peer row's measured round trips may take per run (OpenAMP's
    /// driver spins: with its remote on the same CPU it manages a few
    /// hundred round trips a second).
    pub peer_budget: Duration,
    /// The `iopath` executable whose `rpmsg host` and `rpmsg remote` the
    /// experiment starts, as it does the bench servers ([`crate::child`]).
    pub iopath: PathBuf,
    /// Show progress on stderr.
    pub progress: bool,
}

impl RpmsgConfig {
    /// The embedded defaults of `iopath bench`: 1000 loops, 3 runs, 5000
    /// echo round trips, no polling, placements one and split.
    pub fn quick(iopath: PathBuf) -> RpmsgConfig {
        RpmsgConfig {
            loops: vec![1000],
            runs: 3,
            count: 5000,
            poll: false,
            placement: vec![Placement::One, Placement::Split],
            openamp: None,
            peer_placement: vec![Placement::Split, Placement::One],
            peer_budget: Duration::from_secs(2),
            iopath,
            progress: true,
        }
    }

    /// The full sizes: 1,000 / 10,000 / 100,000 loops, 3 runs, 10,000
    /// echo round trips, placements one and split.
    pub fn full(iopath: PathBuf) -> RpmsgConfig {
        RpmsgConfig {
            loops: vec![1000, 10_000, 100_000],
            count: 10_000,
            ..RpmsgConfig::quick(iopath)
        }
    }

    /// A rough duration, from nominal rates on a 2-vCPU VM: 260 us for a
    /// cycle of the five ways, 100 us per echo round trip and its limit's.
    pub fn estimate(&self) -> Duration {
        let cycles = self.loops.iter().sum::<u64>() as f64 * self.runs as f64;
        let per_place = cycles * 260e-6 + self.count as f64 * 100e-6 + 1.0;
        let poll = if self.poll {
            self.count as f64 * 50e-6 + 1.0
        } else {
            0.0
        };
        // Per peer row and run: start-up, warm-up, and the round trips at
        // about 15,000/s or the budget.
        let peers = if self.openamp.is_some() {
            let row = 1.0 + (self.count as f64 / 15_000.0).min(self.peer_budget.as_secs_f64());
            row * (peers::PAIRS.len() * self.runs * self.peer_placement.len()) as f64
        } else {
            0.0
        };
        Duration::from_secs_f64(per_place * self.placement.len() as f64 + poll + peers)
    }

    /// Refuses settings the experiment cannot run with.
    ///
    /// # Errors
    /// [`crate::Error::Invalid`] naming the option.
    pub(super) fn check(&self) -> Result<()> {
        if self.runs == 0 {
            invalid!("--runs", "give at least 1");
        }
        if self.loops.is_empty() || self.loops.contains(&0) {
            invalid!("--loops", "give positive counts, e.g. 1000,10000");
        }
        if self.placement.is_empty() {
            invalid!("--placement", "give at least one of one, split, free");
        }
        if let Some(dir) = &self.openamp {
            peers::check_dir(dir)?;
            if self.peer_placement.is_empty() {
                invalid!("--peer-placement", "give at least one of one, split, free");
            }
            if self.peer_budget.is_zero() {
                invalid!("--peer-seconds", "give at least 1");
            }
        }
        Ok(())
    }
}
