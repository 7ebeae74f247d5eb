//! Pre-sampled random tables with fixed seeds, so that generating a request costs an
//! array read instead of a random draw (the generator must not be the bottleneck).
//!
//! # Invariants
//! - Every table is a pure function of its parameters and seed: runs are repeatable and
//!   every implementation sees the same inputs.
//! - Cyclic tables have a power-of-two length, so index `i` reads entry `i & mask`.
//! - Completion latency is log-normal with `mu = ln(pct50)` and
//!   `sigma = (ln(pct75) - mu) / 0.674490` (the 75th percentile of the standard normal),
//!   so the sampled median is `pct50` and the sampled 75th percentile is `pct75`.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, LogNormal};

/// The 75th percentile of the standard normal distribution.
const Z75: f64 = 0.674_490;

/// `n` values uniform in `lo..=hi` (W1: delays in ms; W2: deadlines in ms).
pub fn uniform(n: usize, lo: u64, hi: u64, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(lo..=hi)).collect()
}

/// The first `count` of a random permutation of `0..n` (W1: which tasks to cancel, in
/// which order).
pub fn shuffled_prefix(n: usize, count: usize, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.shuffle(&mut rng);
    order.truncate(count.min(n));
    order.shrink_to_fit();
    order
}

/// A cyclic table of `u64` samples (nanoseconds), read by request index.
#[derive(Debug, Clone)]
pub struct CyclicTable {
    values: Box<[u64]>,
    mask: usize,
}

impl CyclicTable {
    /// The sample for request `i`.
    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        self.values[i & self.mask]
    }

    /// Number of distinct entries.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether the table has no entries (never true for tables built here).
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    fn from_fn(len_log2: u32, mut sample: impl FnMut() -> u64) -> Self {
        let len = 1usize << len_log2;
        CyclicTable {
            values: (0..len).map(|_| sample()).collect(),
            mask: len - 1,
        }
    }

    /// Log-normal completion latencies in nanoseconds with the given median and 75th
    /// percentile in milliseconds (`0 < pct50 <= pct75`, checked by the caller).
    pub fn log_normal_latency_nanos(
        pct50_ms: f64,
        pct75_ms: f64,
        len_log2: u32,
        seed: u64,
    ) -> Self {
        let mu = pct50_ms.ln();
        let sigma = ((pct75_ms.ln() - mu) / Z75).max(0.0);
        let mut rng = StdRng::seed_from_u64(seed);
        match LogNormal::new(mu, sigma) {
            Ok(dist) => Self::from_fn(len_log2, || (dist.sample(&mut rng) * 1e6) as u64),
            Err(_) => Self::from_fn(len_log2, || (pct50_ms * 1e6) as u64),
        }
    }

    /// Exponential gaps in nanoseconds between arrivals of a Poisson process of `rate`
    /// arrivals per second (`rate > 0`, checked by the caller). The table is scaled so its
    /// mean is exactly `1 / rate`: a run that keeps up then holds the target rate exactly.
    pub fn poisson_gaps_nanos(rate_per_sec: f64, len_log2: u32, seed: u64) -> Self {
        let mean_nanos = 1e9 / rate_per_sec;
        let mut rng = StdRng::seed_from_u64(seed);
        let len = 1usize << len_log2;
        let draws: Vec<f64> = match Exp::new(1.0) {
            Ok(dist) => (0..len).map(|_| dist.sample(&mut rng)).collect(),
            Err(_) => vec![1.0; len],
        };
        let scale = mean_nanos * len as f64 / draws.iter().sum::<f64>();
        let mut values = draws.into_iter().map(|d| (d * scale).round() as u64);
        Self::from_fn(len_log2, || values.next().unwrap_or(0))
    }
}

/// Keys of each request: `keys_per_request` distinct keys in `0..key_space`, from a
/// cyclic table of `2^len_log2` requests.
#[derive(Debug, Clone)]
pub struct KeyTable {
    keys: Box<[u64]>,
    per_request: usize,
    mask: usize,
}

impl KeyTable {
    /// Samples the table (`1 <= keys_per_request <= key_space`, checked by the caller).
    pub fn new(keys_per_request: usize, key_space: u64, len_log2: u32, seed: u64) -> Self {
        let requests = 1usize << len_log2;
        let per_request = keys_per_request.max(1);
        let mut rng = StdRng::seed_from_u64(seed);
        let mut keys = Vec::with_capacity(requests * per_request);
        for _ in 0..requests {
            let start = keys.len();
            while keys.len() < start + per_request {
                let key = rng.gen_range(0..key_space.max(1));
                if !keys[start..].contains(&key) || key_space < per_request as u64 {
                    keys.push(key);
                }
            }
        }
        KeyTable {
            keys: keys.into_boxed_slice(),
            per_request,
            mask: requests - 1,
        }
    }

    /// The keys of request `i`.
    #[inline]
    pub fn keys(&self, i: usize) -> &[u64] {
        let start = (i & self.mask) * self.per_request;
        &self.keys[start..start + self.per_request]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_normal_table_has_requested_median_and_p75() {
        let t = CyclicTable::log_normal_latency_nanos(20.0, 60.0, 16, 7);
        let mut v: Vec<u64> = (0..t.len()).map(|i| t.get(i)).collect();
        v.sort_unstable();
        let p50 = v[v.len() / 2] as f64 / 1e6;
        let p75 = v[v.len() * 3 / 4] as f64 / 1e6;
        assert!((p50 - 20.0).abs() < 1.0, "p50 {p50}");
        assert!((p75 - 60.0).abs() < 3.0, "p75 {p75}");
    }

    #[test]
    fn poisson_gaps_have_requested_mean() {
        let t = CyclicTable::poisson_gaps_nanos(10_000.0, 16, 3);
        let mean = (0..t.len()).map(|i| t.get(i)).sum::<u64>() as f64 / t.len() as f64;
        assert!((mean - 100_000.0).abs() < 1.0, "mean gap {mean} ns");
    }

    #[test]
    fn keys_are_distinct_within_a_request_and_in_range() {
        let t = KeyTable::new(3, 100, 10, 1);
        for i in 0..2048 {
            let k = t.keys(i);
            assert_eq!(k.len(), 3);
            assert!(k.iter().all(|&k| k < 100));
            assert!(k[0] != k[1] && k[1] != k[2] && k[0] != k[2]);
        }
    }

    #[test]
    fn same_seed_same_table() {
        assert_eq!(uniform(100, 1, 30_000, 9), uniform(100, 1, 30_000, 9));
        assert_ne!(uniform(100, 1, 30_000, 9), uniform(100, 1, 30_000, 10));
        let order = shuffled_prefix(1000, 900, 4);
        let mut sorted = order.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 900);
    }
}
