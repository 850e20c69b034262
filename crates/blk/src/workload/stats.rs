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
    /// Blocks per second.
    pub iops: f64,
    /// Median latency of a block, from submission to completion, in
    /// microseconds.
    pub p50_us: f64,
    /// 99th percentile of the same.
    pub p99_us: f64,
}

impl Run {
    /// A run that moved `bytes` in `elapsed`, one block per entry of
    /// `latency_ns` (each block's submission-to-completion time).
    pub fn new(bytes: u64, elapsed: Duration, latency_ns: &mut [u32]) -> Self {
        let seconds = elapsed.as_secs_f64();
        latency_ns.sort_unstable();
        let pct = |p: f64| -> f64 {
            if latency_ns.is_empty() {
                return 0.0;
            }
            let i = ((latency_ns.len() - 1) as f64 * p).round() as usize;
            f64::from(latency_ns[i]) / 1000.0
        };
        Run {
            seconds,
            gib_per_s: bytes as f64 / seconds.max(1e-9) / f64::from(1u32 << 30),
            iops: latency_ns.len() as f64 / seconds.max(1e-9),
            p50_us: pct(0.5),
            p99_us: pct(0.99),
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
    fn a_run_counts_blocks_and_ranks_latencies() {
        let mut lat: Vec<u32> = (1..=100).rev().map(|us| us * 1000).collect();
        let r = Run::new(100 << 12, Duration::from_millis(10), &mut lat);
        assert_eq!(r.iops, 10_000.0);
        assert_eq!(r.p50_us, 51.0);
        assert_eq!(r.p99_us, 99.0);
        let none = Run::new(0, Duration::from_secs(1), &mut []);
        assert_eq!((none.iops, none.p50_us), (0.0, 0.0));
    }

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
