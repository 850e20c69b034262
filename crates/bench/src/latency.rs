//! Round-trip latency percentiles.

use std::time::Duration;

/// The sample at fraction `p` (0..=1) of `sorted` (nearest rank; 0 when
/// empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Latency of a series of round trips, microseconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Latency {
    /// Round trips.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Slowest.
    pub max_us: f64,
    /// Round trips per second over the whole series.
    pub msgs_per_s: f64,
}

impl Latency {
    /// From per-round-trip microseconds and the series' wall time.
    pub fn from(mut us: Vec<f64>, elapsed: Duration) -> Self {
        us.sort_by(f64::total_cmp);
        Latency {
            count: us.len() as u64,
            p50_us: percentile(&us, 0.5),
            p99_us: percentile(&us, 0.99),
            max_us: us.last().copied().unwrap_or(0.0),
            msgs_per_s: us.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        }
    }

    /// One line: p50, p99, max, msgs/s.
    pub fn line(&self) -> String {
        format!(
            "p50 {:.1} us, p99 {:.1} us, max {:.1} us, {:.0} msgs/s",
            self.p50_us, self.p99_us, self.max_us, self.msgs_per_s
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_series() {
        let l = Latency::from(
            (1..=100).rev().map(f64::from).collect(),
            Duration::from_secs(1),
        );
        assert_eq!(l.count, 100);
        assert_eq!(l.p50_us, 51.0);
        assert_eq!(l.p99_us, 99.0);
        assert_eq!(l.max_us, 100.0);
        assert_eq!(l.msgs_per_s, 100.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
