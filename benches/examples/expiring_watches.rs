//! Watches that all expire, for counting what one `try_complete_else_watch` costs under
//! `valgrind --tool=callgrind`: `N` operations (default 20,000), 10 a millisecond, each on
//! 3 of 100 keys with a 20 ms timeout; it waits until the purgatory has expired every
//! one. With `B`, the operations go through `watch_batch` in batches of `B` instead, and
//! the figure is `Purgatory::watch_batch`'s inclusive cost over `N`.
//!
//! ```text
//! cargo build --release -p purgatory-benches --example expiring_watches
//! valgrind --tool=callgrind target/release/examples/expiring_watches 20000 [B]
//! ```
//!
//! With `TIMEOUT_MS=200` in the environment every timeout is 200 ms (W3's), not 20.
//!
//! It uses only `Purgatory::new`, `try_complete_else_watch`, `watch_batch` and
//! `shutdown`, so the same file also builds against older versions of the crate, for a
//! before figure.
//!
//! With `IN_RUNTIME=1` in the environment, the purgatory is built and used inside a
//! tokio runtime's context: built with `--features kafka-purgatory/tokio`, each watch
//! then enters that runtime for its user code, which is what that costs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use purgatory::{Completion, DelayedOperation, Purgatory};

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
    let runtime = std::env::var_os("IN_RUNTIME").map(|_| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    });
    let _context = runtime.as_ref().map(tokio::runtime::Runtime::enter);
    let p: Purgatory<u64, Request> = Purgatory::new("expiring-watches");
    let keys = |i: u64| [i % 100, (i * 7 + 3) % 100, (i * 13 + 5) % 100];
    let mut i = 0;
    while i < n {
        match batch {
            None => {
                for _ in 0..10 {
                    assert!(!p
                        .try_complete_else_watch(Request, keys(i))
                        .expect("watched"));
                    i += 1;
                }
            }
            Some(b) => {
                let end = (i + b.max(1)).min(n);
                for result in p.watch_batch((i..end).map(|j| (Request, keys(j)))) {
                    assert!(result.is_ok());
                }
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
