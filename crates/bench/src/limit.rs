//! The limit row of the heap and blk experiments: the best of a small fio
//! sweep measured in the same run, or, without fio, a limit of the bench's
//! own that needs no peer (plain O_DIRECT I/O on the same file).

use serde_json::json;

use crate::fio::{self, Job};
use crate::{Missing, ProgressBar, Result, Stats};

/// Runs in which every configuration of the sweep is measured; later runs
/// measure only the best of them (a 10-run `--full` blk bench would
/// otherwise spend most of its time sweeping).
pub(crate) const SWEEP_RUNS: usize = 3;

/// A limit row: the best of a fio sweep, or the bench's own.
#[derive(Debug, Clone)]
pub(crate) enum Limit {
    /// Every configuration of the sweep with its GiB/s per run; the limit
    /// is the one with the best median over the first [`SWEEP_RUNS`] runs
    /// (`fixed` once they are done), measured alone after them.
    Fio {
        sweep: Vec<(Job, Vec<f64>)>,
        fixed: Option<usize>,
    },
    /// fio is missing: the bench's own direct I/O, GiB/s per run.
    Own {
        job: Job,
        missing: Missing,
        runs: Vec<f64>,
    },
}

impl Limit {
    /// A limit over `base` swept at every block size of `bss` and queue
    /// depths 4, 16, 64; without fio, the own limit: `base` as plain
    /// O_DIRECT I/O.
    pub(crate) fn new(base: &Job, bss: &[u64]) -> Limit {
        match Missing::FIO.check() {
            Some(missing) => Limit::Own {
                job: base.clone(),
                missing,
                runs: Vec::new(),
            },
            None => Limit::Fio {
                sweep: fio::sweep(base, bss)
                    .into_iter()
                    .map(|j| (j, Vec::new()))
                    .collect(),
                fixed: None,
            },
        }
    }

    /// One unmeasured pass of `base`, fio pinned to `cpu`, or of the own
    /// limit on the calling thread.
    pub(crate) fn warm_up(&self, base: &Job, cpu: Option<usize>) -> Result<f64> {
        match self {
            Limit::Fio { .. } => base.run(cpu),
            Limit::Own { job, .. } => crate::direct::run(job),
        }
    }

    /// Passes `runs` runs of the limit take (for progress totals).
    pub(crate) fn steps(&self, runs: usize) -> u64 {
        let swept = runs.min(SWEEP_RUNS);
        match self {
            Limit::Fio { sweep, .. } => (swept * sweep.len() + (runs - swept)) as u64,
            Limit::Own { .. } => runs as u64,
        }
    }

    /// One run: every configuration of the sweep once (in the first
    /// [`SWEEP_RUNS`] runs; the chosen one after), `before` run before each
    /// pass, fio pinned to `cpu`; or the own limit on the calling thread.
    pub(crate) fn measure(
        &mut self,
        cpu: Option<usize>,
        before: &mut dyn FnMut() -> Result<()>,
        bar: &ProgressBar,
    ) -> Result<()> {
        match self {
            Limit::Fio { sweep, fixed } => {
                if fixed.is_none() && sweep.first().is_some_and(|(_, r)| r.len() >= SWEEP_RUNS) {
                    *fixed = best(sweep);
                }
                for (i, (job, runs)) in sweep.iter_mut().enumerate() {
                    if fixed.is_none_or(|f| f == i) {
                        bar.set_message(format!("limit: fio {}", job.config()));
                        before()?;
                        runs.push(job.run(cpu)?);
                        bar.inc(1);
                    }
                }
            }
            Limit::Own { job, runs, .. } => {
                bar.set_message("limit: own O_DIRECT");
                before()?;
                runs.push(crate::direct::run(job)?);
                bar.inc(1);
            }
        }
        Ok(())
    }

    /// The fio configuration with the best median (fio only).
    fn chosen(&self) -> Option<&(Job, Vec<f64>)> {
        match self {
            Limit::Fio { sweep, fixed } => sweep.get(fixed.or_else(|| best(sweep))?),
            Limit::Own { .. } => None,
        }
    }

    /// GiB/s of each run of the limit (the chosen configuration's).
    pub(crate) fn runs(&self) -> &[f64] {
        match self {
            Limit::Fio { .. } => self.chosen().map_or(&[], |(_, r)| r),
            Limit::Own { runs, .. } => runs,
        }
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats::of(self.runs())
    }

    pub(crate) fn is_fio(&self) -> bool {
        matches!(self, Limit::Fio { .. })
    }

    /// The short label: `fio bs=8M qd=16`, or `own O_DIRECT bs=1M qd=16`.
    pub(crate) fn label(&self) -> String {
        match self {
            Limit::Fio { .. } => format!("fio {}", self.config()),
            Limit::Own { job, .. } => {
                let bs = iopath_sys::format_size(job.bs);
                format!("own O_DIRECT bs={bs} qd={}", job.iodepth)
            }
        }
    }

    /// The chosen fio configuration (`bs=8M qd=16`) and its command line.
    fn config(&self) -> String {
        self.chosen().map(|c| c.0.config()).unwrap_or_default()
    }

    fn command(&self) -> String {
        self.chosen()
            .map(|c| c.0.cmdline().join(" "))
            .unwrap_or_default()
    }

    /// The lines printed under the table: the sweep and the chosen
    /// configuration's command, or the note on the missing peer and what
    /// was measured instead.
    pub(crate) fn notes(&self) -> Vec<String> {
        match self {
            Limit::Fio { sweep, .. } => {
                let runs = sweep.iter().map(|(_, r)| r.len()).min().unwrap_or(0);
                let each = sweep
                    .iter()
                    .map(|(j, r)| format!("{} {:.3}", j.config(), Stats::of(r).median));
                vec![
                    format!(
                        "limit: the best median of a fio sweep measured in the same run ({runs} runs of each, GiB/s): {}; chosen {}",
                        each.collect::<Vec<_>>().join(", "),
                        self.config()
                    ),
                    format!("limit: {}", self.command()),
                ]
            }
            Limit::Own { job, missing, .. } => vec![
                format!("note: the fio limit row is missing: {}", missing.note()),
                format!("limit (own, labelled so): {}", crate::direct::describe(job)),
            ],
        }
    }

    /// For a report's context: `source` (`fio` or `own`), `label`, the
    /// `command` run and, for fio, the `sweep` (each configuration's
    /// `config` and GiB/s `runs`); for the own limit, the `missing` peer.
    pub(crate) fn context(&self) -> serde_json::Value {
        match self {
            Limit::Fio { sweep, .. } => {
                let sweep: Vec<_> = sweep
                    .iter()
                    .map(|(j, r)| json!({"config": j.config(), "runs": r}))
                    .collect();
                json!({"source": "fio", "label": self.label(), "command": self.command(), "sweep": sweep})
            }
            Limit::Own {
                job, missing: m, ..
            } => json!({"source": "own", "label": self.label(),
                "command": crate::direct::describe(job), "missing": {"program": m.program, "package": m.package}}),
        }
    }
}

fn best(sweep: &[(Job, Vec<f64>)]) -> Option<usize> {
    let median = |i: &usize| Stats::of(&sweep[*i].1).median;
    (0..sweep.len()).max_by(|a, b| median(a).total_cmp(&median(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(bs: u64, iodepth: u32) -> Job {
        Job::new(false, std::path::Path::new("/f"), 1 << 30, bs, iodepth)
    }

    #[test]
    fn the_limit_is_the_best_median_of_the_sweep() {
        let l = Limit::Fio {
            sweep: vec![
                (job(1 << 20, 4), vec![1.0, 5.0, 1.2]),
                (job(1 << 20, 16), vec![2.0, 2.1, 1.9]),
                (job(8 << 20, 4), vec![1.5, 1.6, 1.4]),
            ],
            fixed: None,
        };
        // One outlier does not make a configuration the best: the median does.
        assert_eq!(l.chosen().map(|c| &c.0), Some(&job(1 << 20, 16)));
        assert_eq!(l.runs(), [2.0, 2.1, 1.9]);
        assert_eq!(l.stats().median, 2.0);
        assert_eq!(l.label(), "fio bs=1M qd=16");
        // 3 configurations in the first SWEEP_RUNS runs, then the best alone.
        assert_eq!(l.steps(2), 6);
        assert_eq!(l.steps(10), 3 * 3 + 7);
        let j = l.context();
        assert_eq!(j["source"], "fio");
        assert!(j["command"].as_str().unwrap().contains("--iodepth=16"));
        assert_eq!(j["sweep"].as_array().unwrap().len(), 3);
    }
}
