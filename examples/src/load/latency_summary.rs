//! Percentiles of measured durations (nearest rank).

use std::fmt;
use std::time::Duration;

/// p50 / p99 / max of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest sample.
    pub max: Duration,
}

impl LatencySummary {
    /// Summarises `samples` (sorted in place); `None` when there are none.
    pub fn of(samples: &mut [Duration]) -> Option<LatencySummary> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let rank = |p: f64| {
            let index = ((p * samples.len() as f64).ceil() as usize).max(1) - 1;
            samples[index.min(samples.len() - 1)]
        };
        Some(LatencySummary {
            count: samples.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            max: samples[samples.len() - 1],
        })
    }
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

impl fmt::Display for LatencySummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "p50 {}, p99 {}, max {} (n = {})",
            ms(self.p50),
            ms(self.p99),
            ms(self.max),
            self.count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let summary = LatencySummary::of(&mut samples).unwrap();
        assert_eq!(summary.p50, Duration::from_millis(50));
        assert_eq!(summary.p99, Duration::from_millis(99));
        assert_eq!(summary.max, Duration::from_millis(100));
        assert_eq!(summary.count, 100);
        let mut one = vec![Duration::from_millis(3)];
        assert_eq!(
            LatencySummary::of(&mut one).unwrap().p99,
            Duration::from_millis(3)
        );
        assert!(LatencySummary::of(&mut []).is_none());
    }
}
