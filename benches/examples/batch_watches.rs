//! Batched watches that all expire, for counting what one operation of a `watch_batch`
//! costs under `valgrind --tool=callgrind`: `N` operations (default 20,000) in batches of
//! `B` (default 10), 10 a millisecond, each on 3 of 100 keys with a 20 ms timeout; it
//! waits until the purgatory has expired every one. `expiring_watches` is the same with
//! single watches.
//!
//! ```text
//! cargo build --release -p purgatory-benches --example batch_watches
//! valgrind --tool=callgrind target/release/examples/batch_watches 20000 10
//! ```
//!
//! The inclusive cost of `Purgatory::watch_batch`, divided by `N`, is the figure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use purgatory::{Completion, DelayedOperation, Purgatory};

static EXPIRED: AtomicU64 = AtomicU64::new(0);

struct Request;

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        Duration::from_millis(20)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
    fn on_expiration(&mut self) {
        EXPIRED.fetch_add(1, Ordering::Relaxed);
    }
}

fn main() {
    let arg = |i: usize, default: u64| -> u64 {
        std::env::args()
            .nth(i)
            .map(|a| a.parse().expect("a number"))
            .unwrap_or(default)
    };
    let (n, b) = (arg(1, 20_000), arg(2, 10).max(1));
    let p: Purgatory<u64, Request> = Purgatory::new("batch-watches");
    let mut i = 0;
    while i < n {
        let batch: Vec<(Request, [u64; 3])> = (i..(i + b).min(n))
            .map(|j| (Request, [j % 100, (j * 7 + 3) % 100, (j * 13 + 5) % 100]))
            .collect();
        i += batch.len() as u64;
        for result in p.watch_batch(batch) {
            assert!(result.is_ok());
        }
        if i % 10 < b {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    while EXPIRED.load(Ordering::Relaxed) < n {
        std::thread::sleep(Duration::from_millis(5));
    }
    p.shutdown();
}
