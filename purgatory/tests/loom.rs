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
//! A second model races a cancel by handle against the event and the expiry: the
//! operation is handed back or completed, exactly one of the two.
//!
//! The expiry never waits for a slot lock (it leaves a request for the lock's holder,
//! see `op_table.rs`). A model of an expiry racing a not-ready check did not reach the
//! interleaving where the check holds the lock (loom 0.7 explored 9 executions, and a
//! broken hand-over passed), so that race is tested with real threads in
//! `tests/isolation.rs`, which fails when the hand-over is broken.
//!
//! The purgatory's op-table slot locks, watcher shard locks and the timer's locks and atomics
//! come from each crate's private `sync` module, which is loom's under `--cfg loom`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p kafka-purgatory --test loom --release`. Without
//! `LOOM_MAX_PREEMPTIONS` the exploration is exhaustive (4,532 interleavings for the watch
//! model and 124 for the cancel model, under a second in release; CI bounds preemptions
//! at 3: 687 and 106).
#![cfg(loom)]

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use loom::sync::atomic::AtomicBool;
use loom::sync::Arc;
use purgatory::{
    Completion, DelayedOperation, ManualClock, Purgatory, PurgatoryBuilder, TimerBuilder,
    WatchOutcome,
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

/// Stack of every model thread: the purgatory's calls keep their small buffers on the
/// stack, more than a loom thread has by default.
const STACK: usize = 1 << 20;

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> loom::thread::JoinHandle<T> {
    loom::thread::Builder::new()
        .stack_size(STACK)
        .spawn(f)
        .expect("spawn a model thread")
}

fn purgatory(clock: &ManualClock) -> Purgatory<u8, Op> {
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
        .expect("valid configuration")
}

/// Starts the two racing threads: an event (the operation becomes ready, its key is
/// checked) and the expiry (the clock passes its timeout and is advanced).
fn event_and_expiry(
    purgatory: &Purgatory<u8, Op>,
    ready: Arc<AtomicBool>,
    clock: ManualClock,
) -> (
    loom::thread::JoinHandle<usize>,
    loom::thread::JoinHandle<()>,
) {
    let event = {
        let purgatory = purgatory.clone();
        spawn(move || {
            ready.store(true, SeqCst);
            purgatory.check_and_complete(&KEY)
        })
    };
    let purgatory = purgatory.clone();
    let expiry = spawn(move || {
        clock.advance(TIMEOUT);
        purgatory.advance_clock(Duration::ZERO);
    });
    (event, expiry)
}

/// Watch, event and expiry race; see the module doc.
fn model() {
    EXPLORED.fetch_add(1, SeqCst);
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let ready = Arc::new(AtomicBool::new(false));
    let outcome = std::sync::Arc::new(Outcome::default());

    let (event, expiry) = event_and_expiry(&purgatory, Arc::clone(&ready), clock);
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

/// A waiting operation: an event, its expiry and a cancel by its handle race. Exactly
/// one wins: the cancel hands it back uncompleted, or it is completed once (and then the
/// cancel gets nothing).
fn cancel_model() {
    EXPLORED.fetch_add(1, SeqCst);
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let ready = Arc::new(AtomicBool::new(false));
    let outcome = std::sync::Arc::new(Outcome::default());
    let op = Op {
        ready: Arc::clone(&ready),
        outcome: std::sync::Arc::clone(&outcome),
    };
    let WatchOutcome::Pending(handle) = purgatory.watch(op, [KEY]).expect("accepted") else {
        panic!("not ready yet, so it waits");
    };
    let (event, expiry) = event_and_expiry(&purgatory, ready, clock);
    let cancelled = purgatory.cancel(&handle);
    let completed_by_event = event.join().unwrap();
    expiry.join().unwrap();

    let completions = outcome.completions.load(SeqCst);
    assert_eq!(
        usize::from(cancelled.is_some()) + completions,
        1,
        "exactly one of: handed back, completed"
    );
    let how = outcome.how.load(SeqCst);
    assert_eq!(completed_by_event == 1, how == 1);
    assert_eq!(outcome.expirations.load(SeqCst), usize::from(how == 3));
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 0, "no timer left armed");
    assert_eq!(stats.cancelled, u64::from(cancelled.is_some()));
    assert_eq!(
        stats.completed + stats.expired + stats.cancelled,
        1,
        "{stats:?}"
    );
    assert!(purgatory.is_completed(&handle));
}

fn explore(name: &str, model: fn()) {
    EXPLORED.store(0, SeqCst);
    let builder = loom::model::Builder::new();
    builder.check(move || spawn(model).join().unwrap());
    eprintln!(
        "loom {name}: {} interleavings explored (preemption bound {:?})",
        EXPLORED.load(SeqCst),
        builder.preemption_bound
    );
}

#[test]
fn watch_event_and_expiry_complete_an_operation_exactly_once() {
    explore("watch", model);
}

#[test]
fn cancel_by_handle_races_event_and_expiry_with_one_winner() {
    explore("cancel", cancel_model);
}
