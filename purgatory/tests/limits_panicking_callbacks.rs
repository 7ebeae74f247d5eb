//! Where the on-time promise stops (`docs/purgatory.md`, "Isolation"): callbacks that
//! panic, when the panic hook prints backtraces. The default hook with
//! `RUST_BACKTRACE=1` prints each under one process-wide lock (the first after loading
//! the binary's debug information), so every thread that panics waits for the others:
//! stand-ins cannot help, and the quick operations due among the panicking ones are late
//! by what the hook takes.
//!
//! A measurement, not a bound: ignored by default, run it to print the figures the docs
//! quote (std reads `RUST_BACKTRACE` once a process, so each setting is a run of its own):
//!
//! ```text
//! RUST_BACKTRACE=1 cargo test --release -p kafka-purgatory --test limits_panicking_callbacks -- --ignored --nocapture
//! RUST_BACKTRACE=0 cargo test --release -p kafka-purgatory --test limits_panicking_callbacks -- --ignored --nocapture
//! ```
//!
//! It checks what holds whatever the hook does: every operation answered once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Purgatory};

/// Whether each answer was a panicking one, its deadline and when it began.
type Answers = Arc<Mutex<Vec<(bool, Instant, Instant)>>>;

/// Never ready; its `on_expiration` records when it began, then panics if it should.
struct Op {
    timeout: Duration,
    deadline: Instant,
    panics: bool,
    answers: Answers,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
    fn on_expiration(&mut self) {
        self.answers
            .lock()
            .unwrap()
            .push((self.panics, self.deadline, Instant::now()));
        if self.panics {
            panic!("an expiry callback that panics (on purpose)");
        }
    }
}

/// 150 quick operations due one a millisecond from 10 ms, and 100 that panic: one a
/// millisecond among them (`spread`), or all at 10 ms.
fn run(spread: bool) {
    let purgatory: Purgatory<u64, Op> = Purgatory::new("panicking");
    let answers: Answers = Arc::default();
    let mut key = 0u64;
    let mut watch = |timeout: Duration, panics: bool| {
        key += 1;
        let op = Op {
            timeout,
            deadline: Instant::now() + timeout,
            panics,
            answers: Arc::clone(&answers),
        };
        assert!(!purgatory.try_complete_else_watch(op, [key]).unwrap());
    };
    for i in 0..150u64 {
        watch(Duration::from_millis(10 + i), false);
    }
    for i in 0..100u64 {
        watch(
            Duration::from_millis(if spread { 10 + i } else { 10 }),
            true,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while answers.lock().unwrap().len() < 250 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers.len(), 250, "every operation answered once");
    let mut late: Vec<Duration> = answers
        .iter()
        .filter(|(panics, _, _)| !panics)
        .map(|(_, deadline, at)| at.saturating_duration_since(*deadline))
        .collect();
    late.sort();
    println!(
        "RUST_BACKTRACE={:?}, panicking callbacks {}: the quick ones late p50 {:?}, worst {:?}; {:?}",
        std::env::var("RUST_BACKTRACE").unwrap_or_default(),
        if spread { "one a millisecond" } else { "all at once" },
        late[late.len() / 2],
        late[late.len() - 1],
        purgatory.stats()
    );
    purgatory.shutdown();
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn quick_operations_among_panicking_callbacks() {
    run(true);
    run(false);
}
