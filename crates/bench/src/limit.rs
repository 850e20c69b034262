//! The limit row of the heap and blk experiments: the best of a small fio
//! sweep measured in the same run, or, without fio, a limit of the bench's
//! own that needs no peer (plain O_DIRECT I/O on the same file).

use crate::direct::DirectJob;
use crate::fio::{self, Job};
use crate::{Missing, ProgressBar, Result, Summary};

/// Where a limit's figures come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// fio: every configuration of the sweep with its GiB/s per run; the
    /// limit is the configuration with the best median over the first
    /// [`SWEEP_RUNS`] runs, measured alone in the runs after them.
    Fio {
        /// Each configuration and its runs.
        sweep: Vec<(Job, Vec<f64>)>,
        /// The chosen configuration, once the sweep runs are done.
        fixed: Option<usize>,
    },
    /// fio is missing: the bench's own direct I/O on the same file.
    Own {
        /// What runs instead.
        job: DirectJob,
        /// What is missing.
        missing: Missing,
        /// GiB/s of each run.
        runs: Vec<f64>,
    },
}

/// Runs in which every configuration of the sweep is measured; later runs
/// measure only the best of them (a 10-run `--full` blk bench would
/// otherwise spend most of its time sweeping).
pub const SWEEP_RUNS: usize = 3;

/// A limit row: the best of a fio sweep, or the bench's own.
#[derive(Debug, Clone)]
pub struct Limit {
    /// fio's sweep, or the bench's own.
    pub source: Source,
}

impl Limit {
    /// A limit over `base` swept at every block size of `bss` and queue
    /// depths 4, 16, 64; without fio, the own limit `own`.
    pub fn new(base: &Job, bss: &[u64], own: DirectJob) -> Limit {
        let source = match Missing::FIO.check() {
            Some(missing) => Source::Own {
                job: own,
                missing,
                runs: Vec::new(),
            },
            None => Source::Fio {
                sweep: fio::sweep(base, bss)
                    .into_iter()
                    .map(|j| (j, Vec::new()))
                    .collect(),
                fixed: None,
            },
        };
        Limit { source }
    }

    /// Passes `runs` runs of the limit take (for progress totals).
    pub fn steps(&self, runs: usize) -> u64 {
        match &self.source {
            Source::Fio { sweep, .. } => {
                let swept = runs.min(SWEEP_RUNS);
                (swept * sweep.len() + (runs - swept)) as u64
            }
            Source::Own { .. } => runs as u64,
        }
    }

    /// One run: every configuration of the sweep once (in the first
    /// [`SWEEP_RUNS`] runs; the chosen one after), `before` run before each
    /// pass, fio pinned to `cpu`; or the own limit on the calling thread.
    ///
    /// # Errors
    /// When fio or the direct I/O fails, or `before` fails.
    pub fn measure(
        &mut self,
        cpu: Option<usize>,
        before: &mut dyn FnMut() -> Result<()>,
        bar: &ProgressBar,
    ) -> Result<()> {
        if let Source::Fio { sweep, fixed } = &mut self.source {
            let done = sweep.first().map_or(0, |(_, r)| r.len());
            if fixed.is_none() && done >= SWEEP_RUNS {
                *fixed = best(sweep);
            }
        }
        match &mut self.source {
            Source::Fio { sweep, fixed } => {
                for (i, (job, runs)) in sweep.iter_mut().enumerate() {
                    if fixed.is_some_and(|f| f != i) {
                        continue;
                    }
                    bar.set_message(format!("limit: fio {}", job.config()));
                    before()?;
                    runs.push(job.run(cpu)?.gib_per_s());
                    bar.inc(1);
                }
            }
            Source::Own { job, runs, .. } => {
                bar.set_message("limit: own O_DIRECT");
                before()?;
                runs.push(job.run()?);
                bar.inc(1);
            }
        }
        Ok(())
    }

    /// The fio configuration with the best median (fio only).
    pub fn chosen(&self) -> Option<&Job> {
        match &self.source {
            Source::Fio { sweep, fixed } => fixed
                .or_else(|| best(sweep))
                .and_then(|i| sweep.get(i))
                .map(|(j, _)| j),
            Source::Own { .. } => None,
        }
    }

    /// GiB/s of each run of the limit (the chosen configuration's).
    pub fn runs(&self) -> Vec<f64> {
        match &self.source {
            Source::Fio { sweep, .. } => {
                let chosen = self.chosen();
                sweep
                    .iter()
                    .find(|(j, _)| Some(j) == chosen)
                    .map(|(_, r)| r.clone())
                    .unwrap_or_default()
            }
            Source::Own { runs, .. } => runs.clone(),
        }
    }

    /// Median, min, max of the runs.
    pub fn summary(&self) -> Summary {
        Summary::of(&self.runs())
    }

    /// The peer this machine lacks, when the limit is the bench's own.
    pub fn missing(&self) -> Option<Missing> {
        match &self.source {
            Source::Own { missing, .. } => Some(*missing),
            Source::Fio { .. } => None,
        }
    }

    /// Whether this is fio's limit (not the bench's own).
    pub fn is_fio(&self) -> bool {
        matches!(self.source, Source::Fio { .. })
    }

    /// The short label: `fio bs=8M qd=16`, or `own O_DIRECT`.
    pub fn label(&self) -> String {
        match &self.source {
            Source::Fio { .. } => {
                format!("fio {}", self.chosen().map(Job::config).unwrap_or_default())
            }
            Source::Own { job, .. } => format!(
                "own O_DIRECT bs={} qd={}",
                iopath_sys::format_size(job.bs),
                job.depth
            ),
        }
    }

    /// The lines printed under the table: the sweep and the chosen
    /// configuration's command, or the note on the missing peer and what
    /// was measured instead.
    pub fn notes(&self) -> Vec<String> {
        match &self.source {
            Source::Fio { sweep, .. } => {
                let chosen = self.chosen();
                vec![
                    format!(
                        "limit: the best median of a fio sweep measured in the same run ({} runs of each, GiB/s): {}; chosen {}",
                        sweep.iter().map(|(_, r)| r.len()).min().unwrap_or(0),
                        sweep
                            .iter()
                            .map(|(j, r)| format!("{} {:.3}", j.config(), Summary::of(r).median))
                            .collect::<Vec<_>>()
                            .join(", "),
                        chosen.map(Job::config).unwrap_or_default()
                    ),
                    format!(
                        "limit: {}",
                        chosen.map(|j| j.cmdline().join(" ")).unwrap_or_default()
                    ),
                ]
            }
            Source::Own { job, missing, .. } => vec![
                format!("note: the fio limit row is missing: {}", missing.note()),
                format!("limit (own, labelled so): {}", job.describe()),
            ],
        }
    }

    /// JSON: `{source, label, gib_per_s, gib_per_s_runs, spread_pct, ...}`
    /// with the sweep and command for fio, `missing` for the own limit.
    pub fn json(&self) -> serde_json::Value {
        let s = self.summary();
        let mut v = serde_json::json!({
            "label": self.label(),
            "gib_per_s": s.median,
            "gib_per_s_runs": s.json(),
            "spread_pct": s.spread_pct(),
        });
        match &self.source {
            Source::Fio { sweep, .. } => {
                v["source"] = "fio".into();
                if let Some(c) = self.chosen() {
                    v["command"] = c.cmdline().join(" ").into();
                    v["bs"] = c.bs.into();
                    v["iodepth"] = c.iodepth.into();
                }
                v["sweep"] = sweep
                    .iter()
                    .map(|(j, r)| {
                        let s = Summary::of(r);
                        serde_json::json!({"bs": j.bs, "iodepth": j.iodepth, "gib_per_s": s.median, "gib_per_s_runs": s.json()})
                    })
                    .collect::<Vec<_>>()
                    .into();
            }
            Source::Own { job, missing, .. } => {
                v["source"] = "own".into();
                v["what"] = job.describe().into();
                v["fio_missing"] = missing.json();
            }
        }
        v
    }
}

/// The configuration with the best median.
fn best(sweep: &[(Job, Vec<f64>)]) -> Option<usize> {
    (0..sweep.len()).max_by(|&a, &b| {
        Summary::of(&sweep[a].1)
            .median
            .total_cmp(&Summary::of(&sweep[b].1).median)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fio::Dir;

    fn job(bs: u64, iodepth: u32) -> Job {
        Job {
            dir: Dir::Read,
            path: "/f".into(),
            bytes: 1 << 30,
            bs,
            iodepth,
        }
    }

    #[test]
    fn the_limit_is_the_best_median_of_the_sweep() {
        let l = Limit {
            source: Source::Fio {
                sweep: vec![
                    (job(1 << 20, 4), vec![1.0, 5.0, 1.2]),
                    (job(1 << 20, 16), vec![2.0, 2.1, 1.9]),
                    (job(8 << 20, 4), vec![1.5, 1.6, 1.4]),
                ],
                fixed: None,
            },
        };
        // One outlier does not make a configuration the best: the median does.
        assert_eq!(l.chosen(), Some(&job(1 << 20, 16)));
        assert_eq!(l.runs(), vec![2.0, 2.1, 1.9]);
        assert_eq!(l.summary().median, 2.0);
        assert_eq!(l.label(), "fio bs=1M qd=16");
        // 3 configurations in the first SWEEP_RUNS runs, then the best alone.
        assert_eq!(l.steps(2), 6);
        assert_eq!(l.steps(10), 3 * 3 + 7);
        let j = l.json();
        assert_eq!(j["source"], "fio");
        assert_eq!(j["iodepth"], 16);
        assert_eq!(j["sweep"].as_array().unwrap().len(), 3);
    }
}
