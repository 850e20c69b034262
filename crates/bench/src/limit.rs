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

/// A configuration of a sweep with its GiB/s per run.
type Swept = (Job, Vec<f64>);

/// A limit row: the best of a fio sweep, or, without fio, the bench's own
/// O_DIRECT I/O (a sweep of one job, measured the same way).
#[derive(Debug, Clone)]
pub(crate) struct Limit {
    /// Every configuration of the sweep with its GiB/s per run; the limit
    /// is the one with the best median over the first [`SWEEP_RUNS`] runs
    /// (`fixed` once they are done), measured alone after them.
    sweep: Vec<Swept>,
    fixed: Option<usize>,
    /// fio, when it is missing: the one job runs as plain O_DIRECT I/O.
    missing: Option<Missing>,
}

impl Limit {
    /// A limit over `base` swept at every block size of `bss` and queue
    /// depths 4, 16, 64; without fio, the own limit: `base` as plain
    /// O_DIRECT I/O.
    pub(crate) fn new(base: &Job, bss: &[u64]) -> Limit {
        let missing = Missing::FIO.check();
        let jobs = match missing {
            Some(_) => vec![base.clone()],
            None => fio::sweep(base, bss),
        };
        let sweep = jobs.into_iter().map(|j| (j, Vec::new())).collect();
        Limit {
            sweep,
            fixed: None,
            missing,
        }
    }

    /// One unmeasured pass of `base`, fio pinned to `cpu`, or of the own
    /// limit on the calling thread.
    pub(crate) fn warm_up(&self, base: &Job, cpu: Option<usize>) -> Result<f64> {
        pass(base, self.is_fio(), cpu)
    }

    /// Passes `runs` runs of the limit take (for progress totals).
    pub(crate) fn steps(&self, runs: usize) -> u64 {
        let swept = runs.min(SWEEP_RUNS);
        (swept * self.sweep.len() + (runs - swept)) as u64
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
        let fio = self.is_fio();
        let Limit { sweep, fixed, .. } = self;
        if fixed.is_none() && sweep.first().is_some_and(|(_, r)| r.len() >= SWEEP_RUNS) {
            *fixed = best(sweep);
        }
        for (i, (job, runs)) in sweep.iter_mut().enumerate() {
            if fixed.is_none_or(|f| f == i) {
                bar.set_message(match fio {
                    true => format!("limit: fio {}", job.config()),
                    false => "limit: own O_DIRECT".into(),
                });
                before()?;
                runs.push(pass(job, fio, cpu)?);
                bar.inc(1);
            }
        }
        Ok(())
    }

    /// The configuration with the best median.
    fn chosen(&self) -> Option<&Swept> {
        self.sweep.get(self.fixed.or_else(|| best(&self.sweep))?)
    }

    /// GiB/s of each run of the limit (the chosen configuration's).
    pub(crate) fn runs(&self) -> &[f64] {
        self.chosen().map_or(&[], |(_, r)| r)
    }

    pub(crate) fn stats(&self) -> Stats {
        Stats::of(self.runs())
    }

    pub(crate) fn is_fio(&self) -> bool {
        self.missing.is_none()
    }

    /// The short label: `fio bs=8M qd=16`, or `own O_DIRECT bs=1M qd=16`.
    pub(crate) fn label(&self) -> String {
        let source = if self.is_fio() { "fio" } else { "own O_DIRECT" };
        format!("{source} {}", self.config())
    }

    /// The chosen configuration (`bs=8M qd=16`).
    fn config(&self) -> String {
        self.chosen().map(|c| c.0.config()).unwrap_or_default()
    }

    /// What the limit runs: the chosen configuration's fio command line,
    /// or the own I/O in words.
    fn command(&self) -> String {
        match self.chosen() {
            Some((job, _)) if self.is_fio() => job.cmdline().join(" "),
            Some((job, _)) => crate::direct::describe(job),
            None => String::new(),
        }
    }

    /// The lines printed under the table: the sweep and the chosen
    /// configuration's command, or the note on the missing peer and what
    /// was measured instead.
    pub(crate) fn notes(&self) -> Vec<String> {
        let Some(missing) = self.missing else {
            let runs = self.sweep.iter().map(|(_, r)| r.len()).min().unwrap_or(0);
            let median = |(j, r): &Swept| format!("{} {:.3}", j.config(), Stats::of(r).median);
            let each: Vec<_> = self.sweep.iter().map(median).collect();
            return vec![
                format!(
                    "limit: the best median of a fio sweep measured in the same run \
                     ({runs} runs of each, GiB/s): {}; chosen {}",
                    each.join(", "),
                    self.config()
                ),
                format!("limit: {}", self.command()),
            ];
        };
        vec![
            format!("note: the fio limit row is missing: {}", missing.note()),
            format!("limit (own, labelled so): {}", self.command()),
        ]
    }

    /// For a report's context: `source` (`fio` or `own`), `label`, the
    /// `command` run and, for fio, the `sweep` (each configuration's
    /// `config` and GiB/s `runs`); for the own limit, the `missing` peer.
    pub(crate) fn context(&self) -> serde_json::Value {
        let (label, command) = (self.label(), self.command());
        let Some(missing) = self.missing else {
            let config = |(j, r): &Swept| json!({"config": j.config(), "runs": r});
            let sweep: Vec<_> = self.sweep.iter().map(config).collect();
            return json!({"source": "fio", "label": label, "command": command, "sweep": sweep});
        };
        json!({"source": "own", "label": label, "command": command, "missing": missing})
    }
}

/// One pass of `job`: fio pinned to `cpu`, or (not `fio`) the bench's own
/// O_DIRECT I/O on the calling thread.
fn pass(job: &Job, fio: bool, cpu: Option<usize>) -> Result<f64> {
    match fio {
        true => job.run(cpu),
        false => crate::direct::run(job),
    }
}

fn best(sweep: &[Swept]) -> Option<usize> {
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
        let l = Limit {
            sweep: vec![
                (job(1 << 20, 4), vec![1.0, 5.0, 1.2]),
                (job(1 << 20, 16), vec![2.0, 2.1, 1.9]),
                (job(8 << 20, 4), vec![1.5, 1.6, 1.4]),
            ],
            fixed: None,
            missing: None,
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
