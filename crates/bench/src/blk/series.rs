//! A row of the 8 MiB table: its runs as they are measured, then its
//! figures against the limit.

use iopath_blk::workload::Stats;
use iopath_sys::error_chain;
use serde::Serialize;

use crate::{Error, Missing, Result};

/// One row of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Throughput of each run, GiB/s.
    pub runs_gib_per_s: Vec<f64>,
    /// Median, min, max, spread of the runs (null when skipped).
    pub stats: Stats,
    /// Median as a fraction of the limit's median (null when skipped).
    pub of_limit: Option<f64>,
    /// Why the row has no figures, when it has none.
    pub skipped: Option<String>,
    /// The peer this machine lacks, when that is why.
    pub missing: Option<Missing>,
}

impl Row {
    pub(super) fn measured(&self) -> bool {
        self.skipped.is_none()
    }
}

/// A row being measured: its runs so far, or why it cannot run.
pub(super) struct Series {
    pub(super) name: String,
    pub(super) runs: Vec<f64>,
    failed: Option<String>,
    missing: Option<Missing>,
}

impl Series {
    pub(super) fn new(name: String, failed: Option<&Error>) -> Self {
        let missing = match failed {
            Some(Error::MissingPeer { program, package }) => Some(Missing { program, package }),
            _ => None,
        };
        Series {
            name,
            runs: Vec::new(),
            failed: failed.map(|e| match &missing {
                Some(m) => m.note(),
                None => error_chain(e),
            }),
            missing,
        }
    }

    pub(super) fn measure(&mut self, f: impl FnOnce() -> Result<f64>) {
        if self.failed.is_none() {
            match f() {
                Ok(v) => self.runs.push(v),
                Err(e) => self.failed = Some(error_chain(&e)),
            }
        }
    }

    pub(super) fn row(self, limit: f64) -> Row {
        match self.failed {
            Some(why) => Row {
                name: self.name,
                runs_gib_per_s: Vec::new(),
                stats: Stats::of(&[]),
                of_limit: None,
                skipped: Some(why),
                missing: self.missing,
            },
            None => {
                let stats = Stats::of(&self.runs);
                Row {
                    name: self.name,
                    runs_gib_per_s: self.runs,
                    of_limit: (limit > 0.0).then(|| stats.median / limit),
                    stats,
                    skipped: None,
                    missing: None,
                }
            }
        }
    }
}
