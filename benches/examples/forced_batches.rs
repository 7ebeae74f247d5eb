//! Watches that are all completed by force, in batches, for counting what one
//! `force_complete_batch` costs an operation under `valgrind --tool=callgrind`, as the
//! load tool's completer calls it: `N` operations (default 20,000) watched through
//! `watch_batch` in batches of 64, each on 3 of 100 keys with a 60 s timeout (none
//! expires), then completed through `force_complete_batch` in batches of 64, in an order
//! shuffled from the order they were watched (the completer's order is their latencies').
//! The figure is `Purgatory::force_complete_batch`'s inclusive cost over `N`.
//!
//! ```text
//! cargo build --release -p purgatory-benches --example forced_batches
//! valgrind --tool=callgrind target/release/examples/forced_batches 20000
//! ```
//!
//! It uses only `Purgatory::new`, `watch_batch`, `force_complete_batch` and `shutdown`,
//! so the same file also builds against older versions of the crate, for a before figure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use purgatory::{Completion, DelayedOperation, Purgatory, WatchOutcome};

static COMPLETED: AtomicU64 = AtomicU64::new(0);

struct Request;

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {
        COMPLETED.fetch_add(1, Ordering::Relaxed);
    }
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map_or(20_000, |a| a.parse().expect("a number"));
    let p: Purgatory<u64, Request> = Purgatory::new("forced-batches");
    let keys = |i: u64| [i % 100, (i * 7 + 3) % 100, (i * 13 + 5) % 100];
    let mut handles = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let end = (i + 64).min(n);
        for result in p.watch_batch((i..end).map(|j| (Request, keys(j as u64)))) {
            match result.expect("watched") {
                WatchOutcome::Pending(handle) => handles.push(handle),
                WatchOutcome::Completed => unreachable!("never ready"),
            }
        }
        i = end;
    }
    // A fixed shuffle (Fisher-Yates with a small linear congruential generator), so that
    // every run completes them in the same order.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for k in (1..handles.len()).rev() {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        handles.swap(k, (state >> 33) as usize % (k + 1));
    }
    let mut forced = 0;
    for chunk in handles.chunks(64) {
        forced += p.force_complete_batch(chunk);
    }
    assert_eq!(forced, n);
    assert_eq!(COMPLETED.load(Ordering::Relaxed), n as u64);
    p.shutdown();
}
