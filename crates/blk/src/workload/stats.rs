//! Timings: one run's throughput, and the median and spread of a series.

use std::time::Duration;

use serde::Serialize;

/// One timed run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Run {
    /// Wall time of the run.
    pub seconds: f64,
    /// Throughput in GiB/s.
    pub gib_per_s: f64,
}

impl Run {
    /// A run that moved `bytes` in `elapsed`.
    pub fn new(bytes: u64, elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        Run {
            seconds,
            gib_per_s: bytes as f64 / seconds.max(1e-9) / f64::from(1u32 << 30),
        }
    }
}

/// Median, min, max and spread of a series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// (max - min) / median (0 when the median is 0).
    pub spread: f64,
}

impl Stats {
    /// Stats of a series (NaN when empty).
    pub fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        let min = v.first().copied().unwrap_or(f64::NAN);
        let max = v.last().copied().unwrap_or(f64::NAN);
        Stats {
            median,
            min,
            max,
            spread: if median == 0.0 {
                0.0
            } else {
                (max - min) / median
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_runs() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 4.0]);
        assert_eq!(s.median, 2.5);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 4.0);
        assert!((s.spread - 1.2).abs() < 1e-12);
        assert_eq!(Stats::of(&[3.0, 1.0, 2.0]).median, 2.0);
        assert!(Stats::of(&[]).median.is_nan());
    }
}
