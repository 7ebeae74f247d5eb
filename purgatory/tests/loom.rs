//! A loom model of the purgatory's central race: one operation being watched
//! (`try_complete_else_watch`) while an event makes it ready and fires
//! (`check_and_complete`) and the timer expires it (`advance_clock` after the manual clock
//! passed its 1 ms timeout), each on its own thread.
//!
//! In every interleaving loom can produce:
//! - the operation is completed exactly once, by the time all three threads are done
//!   (never twice; never zero times: the event either precedes the watcher's second try
//!   or finds the operation listed, so a ready operation is never left waiting);
//! - `on_expiration` runs exactly when the timeout completed it;
//! - the watch call and the event report a completion exactly when theirs was the one;
//! - nothing is left armed in the timer.
//!
//! The purgatory's op-table slot locks, watcher shard locks and the timer's locks and atomics
//! come from each crate's private `sync` module, which is loom's under `--cfg loom`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p purgatory --test loom --release`. Without
//! `LOOM_MAX_PREEMPTIONS` the exploration is exhaustive (4,588 interleavings with the op
//! table, under a second in release).
#![cfg(loom)]

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use loom::sync::atomic::AtomicBool;
use loom::sync::Arc;
use purgatory::{
    Completion, DelayedOperation, ManualClock, Purgatory, PurgatoryBuilder, TimerBuilder,
};

const KEY: u8 = 7;

/// Interleavings explored, reported at the end.
static EXPLORED: AtomicUsize = AtomicUsize::new(0);
const TIMEOUT: Duration = Duration::from_millis(1);

/// Bookkeeping only (plain std atomics: loom need not interleave the test's own records).
#[derive(Default)]
struct Outcome {
    completions: AtomicUsize,
    /// 0 = none, 1 = ready, 2 = forced, 3 = expired.
    how: AtomicU8,
    expirations: AtomicUsize,
}

struct Op {
    ready: Arc<AtomicBool>,
    outcome: std::sync::Arc<Outcome>,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        TIMEOUT
    }

    fn try_complete(&mut self) -> bool {
        self.ready.load(SeqCst)
    }

    fn on_complete(&mut self, how: Completion) {
        self.outcome.completions.fetch_add(1, SeqCst);
        let code = match how {
            Completion::Ready => 1,
            Completion::Forced => 2,
            Completion::Expired => 3,
        };
        self.outcome.how.store(code, SeqCst);
    }

    fn on_expiration(&mut self) {
        self.outcome.expirations.fetch_add(1, SeqCst);
    }
}

fn model() {
    EXPLORED.fetch_add(1, SeqCst);
    let clock = ManualClock::new();
    let purgatory: Arc<Purgatory<u8, Op>> = Arc::new(
        PurgatoryBuilder::new()
            .name("loom")
            .shards(1)
            .timer(
                TimerBuilder::new()
                    .shards(1)
                    .clock(clock.clone())
                    .reaper(false),
            )
            .build()
            .expect("valid configuration"),
    );
    let ready = Arc::new(AtomicBool::new(false));
    let outcome = std::sync::Arc::new(Outcome::default());

    let event = {
        let purgatory = Arc::clone(&purgatory);
        let ready = Arc::clone(&ready);
        loom::thread::spawn(move || {
            ready.store(true, SeqCst);
            purgatory.check_and_complete(&KEY)
        })
    };
    let expiry = {
        let purgatory = Arc::clone(&purgatory);
        loom::thread::spawn(move || {
            clock.advance(TIMEOUT);
            purgatory.advance_clock(Duration::ZERO);
        })
    };
    let op = Op {
        ready,
        outcome: std::sync::Arc::clone(&outcome),
    };
    let completed_by_watch = purgatory
        .try_complete_else_watch(op, [KEY])
        .expect("accepted");
    let completed_by_event = event.join().unwrap();
    expiry.join().unwrap();

    assert_eq!(
        outcome.completions.load(SeqCst),
        1,
        "exactly one on_complete"
    );
    let how = outcome.how.load(SeqCst);
    let expired = how == 3;
    assert_eq!(
        outcome.expirations.load(SeqCst),
        usize::from(expired),
        "on_expiration iff the timeout completed it"
    );
    assert!(completed_by_event <= 1);
    assert_eq!(
        completed_by_watch || completed_by_event == 1,
        how == 1,
        "the watch or the event reports the completion iff it was theirs"
    );
    assert!(!(completed_by_watch && completed_by_event == 1));
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 0, "no timer left armed");
    assert_eq!(stats.completed + stats.expired, 1, "{stats:?}");
    assert_eq!(stats.expired, u64::from(expired));
}

#[test]
fn watch_event_and_expiry_complete_an_operation_exactly_once() {
    let builder = loom::model::Builder::new();
    builder.check(model);
    eprintln!(
        "loom: {} interleavings explored (preemption bound {:?})",
        EXPLORED.load(SeqCst),
        builder.preemption_bound
    );
}
