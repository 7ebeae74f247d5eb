//! The slowest single watches while a purgatory grows to `N` waiting operations
//! (default 2,000,000), each on 1 of 100,000 keys with a 60 s timeout: what one watch
//! can cost a request thread when the purgatory's tables grow. With `ROUNDS` (default
//! 1), the operations are forced and the purgatory purged (its memory given back)
//! after each round, and the next round grows it again: the tables made anew.
//!
//! ```text
//! cargo build --release -p purgatory-benches --example watch_tail
//! target/release/examples/watch_tail [N [ROUNDS]]
//! ```
//!
//! It uses only `Purgatory::new`, `watch`, `force_complete_batch`, `purge` and
//! `shutdown`, so the same file also builds against older versions of the crate, for a
//! before figure.

use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory, WatchOutcome};

struct Request;

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
    fn on_expiration(&mut self) {}
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(2_000_000, |s| s.parse().expect("N"));
    let rounds: usize = args.next().map_or(1, |s| s.parse().expect("ROUNDS"));
    let purgatory: Purgatory<u64, Request> = Purgatory::new("watch_tail");
    for round in 1..=rounds {
        let mut handles = Vec::with_capacity(n);
        let mut slowest: Vec<(Duration, usize)> = Vec::new();
        let start = Instant::now();
        for i in 0..n {
            let key = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) % 100_000;
            let t = Instant::now();
            let outcome = purgatory.watch(Request, [key]);
            let took = t.elapsed();
            if took > Duration::from_micros(500) {
                slowest.push((took, i));
            }
            match outcome {
                Ok(WatchOutcome::Pending(handle)) => handles.push(handle),
                _ => panic!("watch {i} did not wait"),
            }
        }
        let total = start.elapsed();
        slowest.sort_by(|a, b| b.cmp(a));
        println!(
            "round {round}: {n} watches in {total:?}; over 0.5 ms: {}; slowest: {}",
            slowest.len(),
            slowest
                .iter()
                .take(4)
                .map(|(took, i)| format!("{:.2} ms (watch {i})", took.as_secs_f64() * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(purgatory.force_complete_batch(&handles), n);
        drop(handles);
        purgatory.purge();
        // The give-back frees on a thread of its own: let it finish.
        std::thread::sleep(Duration::from_millis(500));
        purgatory.purge();
    }
    purgatory.shutdown();
}
