//! A lock-free log-linear histogram of durations in nanoseconds, recorded from any thread.
//!
//! # Layout
//! Values below 64 have a bucket each; above, each power of two `[2^e, 2^(e+1))` is split
//! into 32 equal buckets, so a bucket is at most 1/32 (about 3 %) of its values wide.
//! 1,920 buckets cover all of `u64`.
//!
//! # Invariants
//! - `count` equals the sum of all buckets once recording threads are done.
//! - `min` and `max` are exact (signed, so an early firing shows as a negative minimum);
//!   percentiles are bucket upper bounds, clamped to `[min, max]`. Negative values count
//!   in bucket 0.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

const LINEAR: u64 = 64;
const SUB_BITS: u32 = 5;
const BUCKETS: usize = 64 + (63 - 6 + 1) * 32;

/// A concurrent histogram of signed nanosecond values.
#[derive(Debug)]
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    min: AtomicI64,
    max: AtomicI64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let mantissa = (v >> (e - SUB_BITS)) - (1 << SUB_BITS);
    64 + ((e - 6) as usize) * 32 + mantissa as usize
}

fn upper_bound(index: usize) -> u64 {
    if index < LINEAR as usize {
        return index as u64;
    }
    let e = ((index - 64) / 32) as u32 + 6;
    let mantissa = ((index - 64) % 32) as u64 + 32;
    let bound = (u128::from(mantissa + 1) << (e - SUB_BITS)) - 1;
    u64::try_from(bound).unwrap_or(u64::MAX)
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Histogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            min: AtomicI64::new(i64::MAX),
            max: AtomicI64::new(i64::MIN),
        }
    }

    /// Records one value.
    pub fn record(&self, nanos: i64) {
        self.buckets[index(nanos.max(0) as u64)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.min.fetch_min(nanos, Relaxed);
        self.max.fetch_max(nanos, Relaxed);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The smallest value recorded.
    pub fn min(&self) -> Option<i64> {
        (self.count() > 0).then(|| self.min.load(Relaxed))
    }

    /// The largest value recorded.
    pub fn max(&self) -> Option<i64> {
        (self.count() > 0).then(|| self.max.load(Relaxed))
    }

    /// The `p`-th percentile (nearest rank, within a bucket's width).
    pub fn percentile(&self, p: f64) -> Option<i64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * count as f64)
            .ceil()
            .max(1.0) as u64;
        let mut seen = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            seen += bucket.load(Relaxed);
            if seen >= rank {
                let value = i64::try_from(upper_bound(i)).unwrap_or(i64::MAX);
                return Some(value.clamp(self.min.load(Relaxed), self.max.load(Relaxed)));
            }
        }
        self.max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_bounds_are_monotonic_and_tight() {
        let mut last = None;
        for i in 0..BUCKETS {
            let ub = upper_bound(i);
            if let Some(prev) = last {
                assert!(ub > prev, "bucket {i}");
            }
            assert_eq!(index(ub), i, "upper bound of {i} maps back to it");
            last = Some(ub);
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn percentiles_are_within_three_percent() {
        let h = Histogram::new();
        for v in 1..=100_000i64 {
            h.record(v * 1000);
        }
        let p50 = h.percentile(50.0).unwrap() as f64;
        let p99 = h.percentile(99.0).unwrap() as f64;
        assert!((p50 / 50_000_000.0 - 1.0).abs() < 0.035, "p50 {p50}");
        assert!((p99 / 99_000_000.0 - 1.0).abs() < 0.035, "p99 {p99}");
        assert_eq!(h.max(), Some(100_000_000));
        assert_eq!(h.percentile(100.0), Some(100_000_000));
        assert_eq!(h.count(), 100_000);
    }

    #[test]
    fn negative_values_show_in_min() {
        let h = Histogram::new();
        h.record(-5);
        h.record(10);
        assert_eq!(h.min(), Some(-5));
        assert!(Histogram::new().percentile(50.0).is_none());
    }
}
