//! The cost of a check per list entry on hot keys whose operations are not ready, ours
//! against the naive peer, in the same process, three rounds each, alternating.
//!
//! `OPS` operations (default 5,000) are watched on 3 random keys each out of `KEYS`
//! (default 100), none ever ready; then `CHECKS` (default 100,000) checks of random keys
//! run, each trying every operation of its key. Prints nanoseconds per list entry tried.
//!
//! ```text
//! cargo run --release -p purgatory-benches --example hot_check -- [OPS KEYS CHECKS]
//! ```
//!
//! Under `valgrind --tool=callgrind`, run one side alone with `WHICH=ours` or
//! `WHICH=naive` for an instruction count.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory};
use purgatory_benches::peers::NaivePurgatory;

/// A request that becomes ready when its flag is set (never, here): 24 bytes, like
/// the load tool's.
struct Request {
    ready: &'static Vec<AtomicBool>,
    id: u32,
}

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        Duration::from_secs(600)
    }
    fn try_complete(&mut self) -> bool {
        self.ready[self.id as usize].load(Ordering::Acquire)
    }
    fn on_complete(&mut self, _how: Completion) {}
}

/// xorshift64: a fixed sequence, the same for both sides.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("OPS KEYS CHECKS are numbers"))
        .collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (ops, keys, checks) = (arg(0, 5_000), arg(1, 100), arg(2, 100_000));
    let which = std::env::var("WHICH").unwrap_or_default();
    let ready: &'static Vec<AtomicBool> =
        Box::leak(Box::new((0..ops).map(|_| AtomicBool::new(false)).collect()));
    let mut seed = 88_172_645_463_325_252u64;
    let key = |seed: &mut u64| next(seed) % keys as u64;
    let key_sets: Vec<[u64; 3]> = (0..ops)
        .map(|_| [key(&mut seed), key(&mut seed), key(&mut seed)])
        .collect();
    let order: Vec<u64> = (0..checks).map(|_| key(&mut seed)).collect();
    let entries_tried = checks as f64 * 3.0 * ops as f64 / keys as f64;
    for round in 0..3 {
        if which != "naive" {
            let p = Purgatory::<u64, Request>::builder()
                .build()
                .expect("default settings");
            for (id, k) in key_sets.iter().enumerate() {
                let request = Request {
                    ready,
                    id: id as u32,
                };
                assert!(!p.try_complete_else_watch(request, *k).expect("watched"));
            }
            let start = Instant::now();
            for k in &order {
                p.check_and_complete(k);
            }
            let ns = start.elapsed().as_nanos() as f64 / entries_tried;
            println!("round {round} ours  {ns:.2} ns per entry");
            p.shutdown();
        }
        if which != "ours" {
            let p = NaivePurgatory::<u64, Request>::start(1_000).expect("reaper started");
            for (id, k) in key_sets.iter().enumerate() {
                let request = Request {
                    ready,
                    id: id as u32,
                };
                assert!(p.watch(request, *k).is_some(), "never ready");
            }
            let start = Instant::now();
            for k in &order {
                p.check_and_complete(k);
            }
            let ns = start.elapsed().as_nanos() as f64 / entries_tried;
            println!("round {round} naive {ns:.2} ns per entry");
            p.shutdown();
        }
    }
}
