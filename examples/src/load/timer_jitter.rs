//! The machine's noise floor for timed waits: how late a thread wakes from a sleep of a
//! given length. The simulated followers wait like this before every advance, so on a busy
//! or virtualised machine their lateness shows up in acks=all produce latency; this
//! measures it alone, with no broker involved.

use std::time::{Duration, Instant};

use super::latency_summary::LatencySummary;

/// Sleeps `samples` times for `sleep` and summarises how late each wake-up was.
pub fn run(sleep: Duration, samples: usize) -> Option<LatencySummary> {
    let mut late = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        std::thread::sleep(sleep);
        late.push(started.elapsed().saturating_sub(sleep));
    }
    LatencySummary::of(&mut late)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_sample_and_never_wakes_early() {
        let summary = run(Duration::from_millis(1), 5).unwrap();
        assert_eq!(summary.count, 5);
        assert!(summary.p50 <= summary.max);
    }
}
