//! How long a check of a very hot key holds up a watch on another key of the same
//! watcher shard: `N` operations (default 2,000,000), never ready, wait on key 0 of a
//! one-shard purgatory; a thread checks key 0 again and again (each check tries all of
//! them) while this thread watches (and force-completes) operations on key 1, one at a
//! time, and records how long each watch took. Prints the watches' p50, p99 and max, and
//! the same with no checker, for comparison. With `DEAD` (a percentage, default 0), that
//! share of key 0's operations is force-completed first, so the first check also drops
//! their entries from the list.
//!
//! ```text
//! cargo run --release -p purgatory-benches --example hot_list_hold -- [N [DEAD]]
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory, PurgatoryBuilder, WatchOutcome};

struct Request;

impl DelayedOperation for Request {
    fn timeout(&self) -> Duration {
        Duration::from_secs(600)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
}

/// Watches and forces operations on key 1 for `run`; returns each watch's duration.
fn watch_for(purgatory: &Purgatory<u64, Request>, run: Duration) -> Vec<Duration> {
    let mut took = Vec::new();
    let start = Instant::now();
    while start.elapsed() < run {
        let t = Instant::now();
        let outcome = purgatory.watch(Request, [1]).expect("watched");
        took.push(t.elapsed());
        if let WatchOutcome::Pending(handle) = outcome {
            purgatory.force_complete(&handle);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    took.sort_unstable();
    took
}

fn report(what: &str, took: &[Duration]) {
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "{what}: {} watches, p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        at(0.5),
        at(0.99),
        took[took.len() - 1]
    );
}

fn main() {
    let arg = |i: usize, default: usize| -> usize {
        std::env::args()
            .nth(i)
            .map(|a| a.parse().expect("a number"))
            .unwrap_or(default)
    };
    let (n, dead) = (arg(1, 2_000_000), arg(2, 0));
    let purgatory: Purgatory<u64, Request> = PurgatoryBuilder::new()
        .name("hot-list")
        .shards(1)
        .build()
        .expect("valid configuration");
    let mut left = n;
    let mut handles = Vec::new();
    while left > 0 {
        let batch = left.min(64);
        for result in purgatory.watch_batch((0..batch).map(|_| (Request, [0u64]))) {
            if let Ok(WatchOutcome::Pending(handle)) = result {
                handles.push(handle);
            }
        }
        left -= batch;
    }
    let forced = purgatory.force_complete_batch(
        handles
            .iter()
            .step_by(100 / dead.max(1))
            .take(n * dead / 100),
    );
    report("no checker", &watch_for(&purgatory, Duration::from_secs(2)));
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (purgatory, stop) = (purgatory.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut checks = 0;
            while !stop.load(Ordering::Relaxed) {
                purgatory.check_and_complete(&0);
                checks += 1;
            }
            checks
        })
    };
    let took = watch_for(&purgatory, Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    let checks = checker.join().unwrap();
    report(
        &format!("checking key 0 ({n} entries, {forced} forced first, {checks} checks)"),
        &took,
    );
    purgatory.shutdown();
}
