//! `expiring_watches` for the naive peer ([`NaivePurgatory`]: one mutex over a key map, a
//! deadline heap and a reaper thread), so that a watch and its expiry are counted the
//! same way for both under `valgrind --tool=callgrind`: `N` operations (default 20,000),
//! 10 a millisecond, each on 3 of 100 keys with a 20 ms timeout; it waits until the
//! reaper has expired every one. With `B`, the operations go through
//! `NaivePurgatory::watch_batch` in batches of `B` instead.
//!
//! ```text
//! cargo build --release -p purgatory-benches --examples
//! valgrind --tool=callgrind target/release/examples/expiring_watches_naive 20000 [B]
//! ```
//!
//! `TIMEOUT_MS` sets the timeout as there.
//!
//! Per watch and its expiry: (total at N = 20,000 minus total at N = 100) / 19,900. The
//! single watch is `naive_watch_one`'s inclusive cost over N (`callgrind_annotate
//! --inclusive=yes`): it only calls `NaivePurgatory::watch`, kept out of line so the
//! watch has a frame of its own, as ours' `watch_one` has.
//!
//! # Invariants
//! - The operations, keys, timeout and pacing are `expiring_watches`' own, and the
//!   handle each watch returns is dropped at once (ours returns none).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use purgatory::{Completion, DelayedOperation};
use purgatory_benches::peers::{NaiveHandle, NaivePurgatory};

static EXPIRED: AtomicU64 = AtomicU64::new(0);
/// Every request's timeout, ms: 20, or `TIMEOUT_MS` from the environment.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(20);

struct Request;

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
    fn on_expiration(&mut self) {
        EXPIRED.fetch_add(1, Ordering::Relaxed);
    }
}

/// One watch, in a frame of its own for callgrind.
#[inline(never)]
fn naive_watch_one(
    p: &NaivePurgatory<u64, Request>,
    keys: [u64; 3],
) -> Option<NaiveHandle<Request>> {
    p.watch(Request, keys)
}

fn main() {
    let arg = |i: usize| -> Option<u64> {
        std::env::args()
            .nth(i)
            .map(|a| a.parse().expect("a number"))
    };
    let (n, batch) = (arg(1).unwrap_or(20_000), arg(2));
    if let Some(ms) = std::env::var_os("TIMEOUT_MS") {
        let ms = ms.to_str().and_then(|ms| ms.parse().ok());
        TIMEOUT_MS.store(ms.expect("TIMEOUT_MS, a number of ms"), Ordering::Relaxed);
    }
    let p: NaivePurgatory<u64, Request> = NaivePurgatory::start(1000).expect("a reaper");
    let keys = |i: u64| [i % 100, (i * 7 + 3) % 100, (i * 13 + 5) % 100];
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        match batch {
            None => {
                for _ in 0..10 {
                    assert!(naive_watch_one(&p, keys(i)).is_some(), "watched");
                    i += 1;
                }
            }
            Some(b) => {
                let end = (i + b.max(1)).min(n);
                let lists: Vec<[u64; 3]> = (i..end).map(keys).collect();
                p.watch_batch(lists.iter().map(|k| (Request, &k[..])), &mut out);
                assert!(out.drain(..).all(|h| h.is_some()), "watched");
                i = end;
                if i % 10 >= b.max(1) {
                    continue; // 10 a millisecond, as one by one
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    while EXPIRED.load(Ordering::Relaxed) < n {
        std::thread::sleep(Duration::from_millis(5));
    }
    p.shutdown();
}
