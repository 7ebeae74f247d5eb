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
//! The slot hand-overs (`slot.rs`): an expiry never waits for a slot's holder, it leaves
//! the expiry in the slot's word for the holder's unlock. The models that reach it:
//! - a watch, and a check of a never-ready operation, each holding the slot when its
//!   timeout fires: the unlock expires it (nothing else ever would);
//! - a stale name (a cancel, a force, a guard's drop, a `cancel_for_key`, a check whose
//!   entry's tag collides) used while the slot's next occupant B is watched and expires:
//!   B is expired exactly once, whatever the stale call did meanwhile;
//! - a check holding X while X expires, X forced and its slot reused by Y, which expires
//!   too: neither expiry is lost.
//!
//! The holder answers an expiry handed over at once, under `Driver::expiry_work`, taken
//! before it takes the operation out of its slot, so a shutdown that begins once the
//! operation is out waits for the answer. The models that reach it:
//! - a check holding an operation when its timeout fires, and a shutdown on the expiring
//!   thread: if the operation was out of its slot when the shutdown began, it is answered
//!   when the shutdown returns (`Driver::work`, counted before the take);
//! - a force racing a shutdown: the same for an operation the force took;
//! - a watch chunk (under loom a batch of two is a chunk) whose operations' timeouts fire
//!   while it holds their slots, at its unlocks after arming or around its tries: each
//!   expires exactly once.
//!
//! Under loom every tag collides with every generation (`op_table.rs`, `TAG_MASK`), so a
//! check looks at the slot behind every entry. Before `slot.rs` (a slot was a mutex, a
//! holder under a stale name unlocked without honouring the expiry left for it), the
//! stale-name and reuse models failed, with loom's mutex replaced by a lock on one atomic
//! flag (loom does not reorder a failed `try_lock` of its own mutex, and so had missed
//! every one of these races).
//!
//! The purgatory's op-table slot words, watcher shard locks and the timer's locks and
//! atomics come from each crate's private `sync` module, which is loom's under
//! `--cfg loom`. Run with `RUSTFLAGS="--cfg loom" cargo test -p kafka-purgatory --test loom
//! --release`. CI bounds preemptions at 3 (`LOOM_MAX_PREEMPTIONS=3`); each model prints how
//! many interleavings it explored.
#![cfg(loom)]

use std::sync::atomic::{
    AtomicU8, AtomicUsize,
    Ordering::{Acquire, Release, SeqCst},
};
use std::time::Duration;

use loom::sync::atomic::AtomicBool;
use loom::sync::Arc;
use purgatory::{
    Completion, DelayedOperation, ManualClock, Purgatory, PurgatoryBuilder, TimerBuilder,
    WatchOutcome,
};

const KEY: u8 = 7;

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
    /// Set (a loom atomic) by `on_complete`, for a model whose assertion must be ordered
    /// after the answer it checks (loom does not see the plain `Outcome`).
    seen: Option<Arc<AtomicBool>>,
    outcome: std::sync::Arc<Outcome>,
    timeout: Duration,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        self.ready.load(SeqCst)
    }

    fn on_complete(&mut self, how: Completion) {
        if let Some(seen) = &self.seen {
            seen.store(true, SeqCst);
        }
        self.outcome.completions.fetch_add(1, SeqCst);
        let code = match how {
            Completion::Ready => 1,
            Completion::Forced => 2,
            Completion::Expired => 3,
            Completion::Shutdown => 4,
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
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let ready = Arc::new(AtomicBool::new(false));
    let outcome = std::sync::Arc::new(Outcome::default());

    let (event, expiry) = event_and_expiry(&purgatory, Arc::clone(&ready), clock);
    let op = Op {
        ready,
        seen: None,
        outcome: std::sync::Arc::clone(&outcome),
        timeout: TIMEOUT,
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
    let expired = how == 3; // no shutdown in this model: never 4
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
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let ready = Arc::new(AtomicBool::new(false));
    let outcome = std::sync::Arc::new(Outcome::default());
    let op = Op {
        ready: Arc::clone(&ready),
        seen: None,
        outcome: std::sync::Arc::clone(&outcome),
        timeout: TIMEOUT,
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

/// Runs `model` in every interleaving loom explores, and reports how many there were.
/// The count is this call's own (tests run in parallel each explore theirs).
fn explore(name: &str, model: fn()) {
    let explored = std::sync::Arc::new(AtomicUsize::new(0));
    let mut builder = loom::model::Builder::new();
    // The op table's free lists and the slots set aside are loom's own locks (the
    // give-back's hand-over with a vacate goes through them), so every watch, expiry and
    // give-back step is a few more branch points than loom's default bound of 1,000
    // allows the longest models (the give-back's, about 1,200). `LOOM_MAX_BRANCHES` still
    // overrides.
    if std::env::var_os("LOOM_MAX_BRANCHES").is_none() {
        builder.max_branches = 2_000;
    }
    let count = std::sync::Arc::clone(&explored);
    builder.check(move || {
        count.fetch_add(1, SeqCst);
        spawn(model).join().unwrap()
    });
    eprintln!(
        "loom {name}: {} interleavings explored (preemption bound {:?})",
        explored.load(SeqCst),
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

/// What the stale thread of [`stale_name_model`] does with the name of operation A, whose
/// slot B now occupies.
#[derive(Clone, Copy, Debug)]
enum StaleAction {
    Cancel,
    Force,
    DropGuard,
    CancelForKey,
    /// A check of A's key, whose entry for A is still listed: under loom every tag
    /// collides, so the check looks at the slot behind it, as it does in a real run once
    /// the slot was reused a multiple of 256 times.
    Check,
    /// A reset of A's timeout to an hour: had it moved B's, B would never expire.
    Reset,
}

/// Operation A (60 s) is watched and forced; B (1 ms) reuses A's slot. One thread acts
/// on A's stale name while B's timeout fires on another: B must be answered, exactly
/// once, whatever the stale thread did with the slot meanwhile.
fn stale_name_model(action: StaleAction) {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let a_outcome = std::sync::Arc::new(Outcome::default());
    let b_outcome = std::sync::Arc::new(Outcome::default());
    let never = Arc::new(AtomicBool::new(false));
    let a = Op {
        ready: Arc::clone(&never),
        seen: None,
        outcome: std::sync::Arc::clone(&a_outcome),
        timeout: Duration::from_secs(60),
    };
    let WatchOutcome::Pending(a) = purgatory.watch(a, [KEY]).expect("accepted") else {
        panic!("A waits");
    };
    let guard = purgatory.cancel_on_drop(a);
    assert!(purgatory.force_complete(&a));
    let guard = match action {
        StaleAction::DropGuard => Some(guard),
        _ => {
            guard.disarm();
            None
        }
    };
    let stale = {
        let purgatory = purgatory.clone();
        spawn(move || match action {
            StaleAction::Cancel => assert!(purgatory.cancel(&a).is_none()),
            StaleAction::Force => assert!(!purgatory.force_complete(&a)),
            StaleAction::DropGuard => drop(guard),
            StaleAction::CancelForKey => assert!(purgatory.cancel_for_key(&KEY).is_empty()),
            StaleAction::Check => assert_eq!(purgatory.check_and_complete(&KEY), 0),
            StaleAction::Reset => {
                assert!(!purgatory.reset_timeout(&a, Duration::from_secs(3_600)))
            }
        })
    };
    // B waits on another key, so a cancel of A's key never takes it.
    let b = Op {
        ready: never,
        seen: None,
        outcome: std::sync::Arc::clone(&b_outcome),
        timeout: TIMEOUT,
    };
    let WatchOutcome::Pending(b) = purgatory.watch(b, [KEY + 1]).expect("accepted") else {
        panic!("B waits");
    };
    let expiry = {
        let purgatory = purgatory.clone();
        spawn(move || {
            clock.advance(TIMEOUT);
            purgatory.advance_clock(Duration::ZERO);
        })
    };
    stale.join().unwrap();
    expiry.join().unwrap();
    assert_eq!(a_outcome.completions.load(SeqCst), 1, "A forced once");
    assert_eq!(
        b_outcome.completions.load(SeqCst),
        1,
        "B answered exactly once ({action:?}, B {})",
        if purgatory.is_completed(&b) {
            "taken"
        } else {
            "still in its slot"
        }
    );
    assert_eq!(b_outcome.how.load(SeqCst), 3, "B expired");
    assert_eq!(b_outcome.expirations.load(SeqCst), 1);
    let stats = purgatory.stats();
    assert_eq!(
        (stats.forced, stats.expired, stats.cancelled),
        (1, 1, 0),
        "{stats:?}"
    );
}

#[test]
fn a_stale_cancel_never_takes_away_the_next_occupants_expiry() {
    explore("stale cancel", || stale_name_model(StaleAction::Cancel));
}

#[test]
fn a_stale_force_never_takes_away_the_next_occupants_expiry() {
    explore("stale force", || stale_name_model(StaleAction::Force));
}

#[test]
fn a_stale_guard_drop_never_takes_away_the_next_occupants_expiry() {
    explore("stale guard drop", || {
        stale_name_model(StaleAction::DropGuard)
    });
}

#[test]
fn a_stale_cancel_for_key_never_takes_away_the_next_occupants_expiry() {
    explore("stale cancel_for_key", || {
        stale_name_model(StaleAction::CancelForKey)
    });
}

#[test]
fn a_stale_check_never_takes_away_the_next_occupants_expiry() {
    explore("stale check", || stale_name_model(StaleAction::Check));
}

#[test]
fn a_stale_reset_never_moves_the_next_occupants_deadline() {
    explore("stale reset", || stale_name_model(StaleAction::Reset));
}

/// A reset of a waiting operation's timeout (1 ms) to an hour on one thread, while the
/// clock passes the old deadline and the timer is driven on another; then shutdown. The
/// reset and the old deadline have one winner: a reset that returned `true` left it
/// waiting (shutdown answers it), one that returned `false` found its timeout fired (the
/// round, or the reset's own unlock, expired it). Answered exactly once either way.
fn reset_and_expiry_model(keyless: bool) {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, outcome) = never_ready(TIMEOUT);
    let watched = if keyless {
        purgatory.watch_keyless(op)
    } else {
        purgatory.watch(op, [KEY])
    };
    let WatchOutcome::Pending(handle) = watched.expect("accepted") else {
        panic!("never ready");
    };
    let reset = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.reset_timeout(&handle, Duration::from_secs(3_600)))
    };
    let expiry = expire_on_a_thread(&purgatory, clock);
    let moved = reset.join().unwrap();
    expiry.join().unwrap();
    assert_eq!(
        outcome.completions.load(SeqCst),
        usize::from(!moved),
        "expired iff the reset lost"
    );
    purgatory.shutdown();
    assert_eq!(outcome.completions.load(SeqCst), 1, "answered exactly once");
    let stats = purgatory.stats();
    assert_eq!(
        (stats.expired, stats.expired_at_shutdown),
        if moved { (0, 1) } else { (1, 0) },
        "{stats:?}"
    );
}

#[test]
fn a_reset_racing_its_old_deadline_has_one_winner() {
    explore("reset vs expiry", || reset_and_expiry_model(false));
}

#[test]
fn a_keyless_reset_racing_its_old_deadline_has_one_winner() {
    explore("keyless reset vs expiry", || reset_and_expiry_model(true));
}

/// A waiting operation (60 s) reset to expire now on one thread, made ready and its key
/// checked on another, the timer driven on this one: the new deadline may come while
/// the reset still holds the slot (its unlock then answers the expiry), or while the
/// check does. Answered exactly once, ready or expired; a reset that found it answered
/// already (`false`) can only have lost to the event.
fn reset_and_completion_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, outcome) = never_ready(Duration::from_secs(60));
    let ready = Arc::clone(&op.ready);
    let WatchOutcome::Pending(handle) = purgatory.watch(op, [KEY]).expect("accepted") else {
        panic!("not ready yet");
    };
    let reset = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.reset_timeout(&handle, Duration::ZERO))
    };
    let event = {
        let purgatory = purgatory.clone();
        spawn(move || {
            ready.store(true, SeqCst);
            purgatory.check_and_complete(&KEY)
        })
    };
    purgatory.advance_clock(Duration::ZERO);
    let moved = reset.join().unwrap();
    let checked = event.join().unwrap();
    // A reset to now that won is due at once: this round, or the next one, fires it
    // unless the event completed it first.
    purgatory.advance_clock(Duration::ZERO);
    assert_eq!(outcome.completions.load(SeqCst), 1, "answered exactly once");
    let how = outcome.how.load(SeqCst);
    assert!(how == 1 || how == 3, "ready or expired, not {how}");
    assert_eq!(
        checked == 1,
        how == 1,
        "the check reports its own completion"
    );
    if !moved {
        assert_eq!(
            how, 1,
            "only the event can have answered it before the reset"
        );
    }
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.completed + stats.expired), (0, 1));
}

#[test]
fn a_reset_racing_an_event_and_its_new_deadline_answers_once() {
    explore("reset vs event vs expiry", reset_and_completion_model);
}

/// A reset (to now) on one thread, shutdown on another: answered once, and told
/// `Shutdown` (no round runs: its new deadline never fires); a reset after the shutdown
/// drained it moves nothing.
fn reset_and_shutdown_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, outcome) = never_ready(Duration::from_secs(60));
    let WatchOutcome::Pending(handle) = purgatory.watch_keyless(op).expect("accepted") else {
        panic!("never ready");
    };
    let reset = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.reset_timeout(&handle, Duration::ZERO))
    };
    purgatory.shutdown();
    reset.join().unwrap();
    assert_eq!(outcome.completions.load(SeqCst), 1, "answered exactly once");
    assert_eq!(outcome.how.load(SeqCst), 4, "told Shutdown");
    assert_eq!(purgatory.stats().expired_at_shutdown, 1);
}

#[test]
fn a_reset_racing_shutdown_leaves_one_answer() {
    explore("reset vs shutdown", reset_and_shutdown_model);
}

/// An operation that is never ready; its outcome.
fn never_ready(timeout: Duration) -> (Op, std::sync::Arc<Outcome>) {
    let outcome = std::sync::Arc::new(Outcome::default());
    let op = Op {
        ready: Arc::new(AtomicBool::new(false)),
        seen: None,
        outcome: std::sync::Arc::clone(&outcome),
        timeout,
    };
    (op, outcome)
}

/// Advances the clock past `TIMEOUT` and drives the timer, on its own thread.
fn expire_on_a_thread(
    purgatory: &Purgatory<u8, Op>,
    clock: ManualClock,
) -> loom::thread::JoinHandle<()> {
    let purgatory = purgatory.clone();
    spawn(move || {
        clock.advance(TIMEOUT);
        purgatory.advance_clock(Duration::ZERO);
    })
}

/// Moves the clock past `TIMEOUT` once more and drives the timer, on this thread.
fn expire_now(purgatory: &Purgatory<u8, Op>, clock: &ManualClock) {
    clock.advance(TIMEOUT);
    purgatory.advance_clock(Duration::ZERO);
}

fn assert_expired_once(outcome: &Outcome, what: &str) {
    assert_eq!(
        outcome.completions.load(SeqCst),
        1,
        "{what}: answered exactly once"
    );
    assert_eq!(outcome.how.load(SeqCst), 3, "{what}: expired");
    assert_eq!(
        outcome.expirations.load(SeqCst),
        1,
        "{what}: on_expiration once"
    );
}

/// A watch of an operation that is never ready races its expiry: the timeout may fire
/// while the watch still holds the slot (between arming the timer and unlocking), and the
/// watch's unlock must then expire it. Nothing else would ever answer it.
fn watch_and_expiry_model() {
    watch_and_expiry(false);
}

/// [`watch_and_expiry_model`] for a keyless watch, which lists nothing and tries once.
fn keyless_watch_and_expiry_model() {
    watch_and_expiry(true);
}

fn watch_and_expiry(keyless: bool) {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let expiry = expire_on_a_thread(&purgatory, clock.clone());
    let (op, outcome) = never_ready(TIMEOUT);
    let watched = if keyless {
        purgatory.watch_keyless(op)
    } else {
        purgatory.watch(op, [KEY])
    };
    let handle = match watched.expect("accepted") {
        WatchOutcome::Pending(handle) => handle,
        WatchOutcome::Completed => panic!("never ready"),
    };
    expiry.join().unwrap();
    // Armed after the expiry thread moved the clock: its timeout is a tick later.
    expire_now(&purgatory, &clock);
    assert_expired_once(&outcome, "the watched operation");
    assert!(purgatory.is_completed(&handle));
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.expired), (0, 1), "{stats:?}");
}

/// A waiting operation that is never ready: a check of its key (which holds its slot
/// while `try_complete` runs) races its expiry. The expiry never waits for the check; the
/// check's unlock must honour it.
fn check_and_expiry_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, outcome) = never_ready(TIMEOUT);
    let WatchOutcome::Pending(_) = purgatory.watch(op, [KEY]).expect("accepted") else {
        panic!("never ready");
    };
    let check = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.check_and_complete(&KEY))
    };
    let expiry = expire_on_a_thread(&purgatory, clock);
    assert_eq!(check.join().unwrap(), 0, "never ready");
    expiry.join().unwrap();
    assert_expired_once(&outcome, "the checked operation");
}

/// A check holds X (never ready) while X's timeout fires; meanwhile X is forced and Y
/// (1 ms) reuses X's slot, and Y's timeout fires too. Whatever the check's unlock finds
/// when it lets go of X, Y's expiry must not be lost to it: X is answered once (forced,
/// or expired if the expiry came first), Y expires once.
fn check_racing_a_reuse_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (x, x_outcome) = never_ready(TIMEOUT);
    let WatchOutcome::Pending(x) = purgatory.watch(x, [KEY]).expect("accepted") else {
        panic!("never ready");
    };
    let check = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.check_and_complete(&KEY))
    };
    let expiry = expire_on_a_thread(&purgatory, clock.clone());
    purgatory.force_complete(&x);
    let (y, y_outcome) = never_ready(TIMEOUT);
    let y = match purgatory.watch(y, [KEY + 1]).expect("accepted") {
        WatchOutcome::Pending(y) => y,
        WatchOutcome::Completed => panic!("never ready"),
    };
    assert_eq!(check.join().unwrap(), 0, "never ready");
    expiry.join().unwrap();
    // Y armed after the expiry thread moved the clock: its timeout is a tick later.
    expire_now(&purgatory, &clock);
    assert_eq!(
        x_outcome.completions.load(SeqCst),
        1,
        "X answered exactly once"
    );
    assert_expired_once(&y_outcome, "Y");
    assert!(purgatory.is_completed(&y));
}

/// A check holds B (never ready) while B's timeout fires; the expiring thread then shuts
/// the purgatory down. Whatever the interleaving, B is answered once, and if B was already
/// out of its slot when the shutdown began (taken by the check's unlock, or by the round),
/// it was answered by the time the shutdown returned.
fn handed_over_check_and_shutdown_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, outcome) = never_ready(TIMEOUT);
    let WatchOutcome::Pending(b) = purgatory.watch(op, [KEY]).expect("accepted") else {
        panic!("never ready");
    };
    let check = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.check_and_complete(&KEY))
    };
    let shutdown = {
        let purgatory = purgatory.clone();
        let outcome = std::sync::Arc::clone(&outcome);
        spawn(move || {
            clock.advance(TIMEOUT);
            purgatory.advance_clock(Duration::ZERO);
            let out_before = purgatory.is_completed(&b);
            purgatory.shutdown();
            if out_before {
                assert_eq!(
                    outcome.completions.load(SeqCst),
                    1,
                    "out of its slot before the shutdown began, unanswered after it returned"
                );
            }
        })
    };
    assert_eq!(check.join().unwrap(), 0, "never ready");
    shutdown.join().unwrap();
    assert_eq!(outcome.completions.load(SeqCst), 1, "answered exactly once");
    // Its timeout fired before the shutdown began: a timeout's answer, whoever gave it
    // (the round, or the check as it let go, maybe after the shutdown), and counted so.
    assert_eq!(outcome.how.load(SeqCst), 3, "expired by its timeout");
    let stats = purgatory.stats();
    assert_eq!((stats.expired, stats.expired_at_shutdown), (1, 0));
}

/// A waiting operation (its 60 s timeout far off) is held by a check on one thread while
/// another shuts the purgatory down: the drain of its timer meets the held slot and
/// leaves the expiry to the check, marked as shutdown's. However they interleave, it is
/// answered once, told `Shutdown`, and counted so (not as a timeout).
fn drained_while_checked_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, outcome) = never_ready(Duration::from_secs(60));
    let WatchOutcome::Pending(_) = purgatory.watch(op, [KEY]).expect("accepted") else {
        panic!("never ready");
    };
    let check = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.check_and_complete(&KEY))
    };
    purgatory.shutdown();
    assert_eq!(check.join().unwrap(), 0, "never ready");
    assert_eq!(outcome.completions.load(SeqCst), 1, "answered exactly once");
    assert_eq!(outcome.how.load(SeqCst), 4, "told Shutdown");
    let stats = purgatory.stats();
    assert_eq!((stats.expired, stats.expired_at_shutdown), (0, 1));
}

/// A waiting operation is forced on one thread while another shuts the purgatory down. If
/// the force had taken it out of its slot when the shutdown began, it was answered by the
/// time the shutdown returned; either way it is answered exactly once (forced, or expired
/// by the shutdown).
fn force_and_shutdown_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (mut op, outcome) = never_ready(Duration::from_secs(60));
    let seen = Arc::new(AtomicBool::new(false));
    op.seen = Some(Arc::clone(&seen));
    let WatchOutcome::Pending(handle) = purgatory.watch(op, [KEY]).expect("accepted") else {
        panic!("never ready");
    };
    let force = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.force_complete(&handle))
    };
    let out_before = purgatory.is_completed(&handle);
    purgatory.shutdown();
    if out_before {
        assert!(
            seen.load(SeqCst),
            "taken by the force before the shutdown began, unanswered after it returned"
        );
    }
    force.join().unwrap();
    assert_eq!(outcome.completions.load(SeqCst), 1, "answered exactly once");
    let stats = purgatory.stats();
    assert_eq!(
        (stats.forced, stats.expired_at_shutdown),
        match outcome.how.load(SeqCst) {
            2 => (1, 0),
            4 => (0, 1),
            how => panic!("forced or shut down, not {how}"),
        }
    );
}

#[test]
fn an_expiry_shutdown_leaves_to_a_check_is_told_shutdown() {
    explore("drained while checked", drained_while_checked_model);
}

#[test]
fn a_shutdown_waits_for_an_operation_a_force_took_before_it_began() {
    explore("force and shutdown", force_and_shutdown_model);
}

/// A chunk of two never-ready operations is watched while their timeouts fire on another
/// thread: each is expired exactly once (by the round, by the chunk's unlock after arming,
/// or by the unlock after its try), nothing is left armed.
fn watch_chunk_and_expiry_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let expiry = expire_on_a_thread(&purgatory, clock.clone());
    let (a, a_outcome) = never_ready(TIMEOUT);
    let (b, b_outcome) = never_ready(TIMEOUT);
    let results = purgatory.watch_batch([(a, [KEY]), (b, [KEY + 1])]);
    assert!(results
        .iter()
        .all(|r| matches!(r, Ok(WatchOutcome::Pending(_)))));
    expiry.join().unwrap();
    // Armed after the expiry thread moved the clock: their timeouts are a tick later.
    expire_now(&purgatory, &clock);
    assert_expired_once(&a_outcome, "A");
    assert_expired_once(&b_outcome, "B");
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.expired), (0, 2), "{stats:?}");
}

#[test]
fn a_shutdown_waits_for_an_expiry_a_check_took_over_before_it_began() {
    explore(
        "handed-over check and shutdown",
        handed_over_check_and_shutdown_model,
    );
}

#[test]
fn a_watch_chunk_expires_what_timed_out_while_it_held_the_slots() {
    explore("watch chunk and expiry", watch_chunk_and_expiry_model);
}

/// A keyless operation, its force on one thread, its expiry on another: exactly one
/// answer, forced or expired, and `on_expiration` only with the expiry.
fn keyless_force_and_expiry_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, outcome) = never_ready(TIMEOUT);
    let WatchOutcome::Pending(handle) = purgatory.watch_keyless(op).expect("accepted") else {
        panic!("never ready");
    };
    let force = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.force_complete(&handle))
    };
    expire_now(&purgatory, &clock);
    let forced = force.join().unwrap();
    assert_eq!(outcome.completions.load(SeqCst), 1, "answered exactly once");
    let (how, expirations) = (outcome.how.load(SeqCst), outcome.expirations.load(SeqCst));
    assert_eq!(
        (how, expirations),
        if forced { (2, 0) } else { (3, 1) },
        "forced or expired"
    );
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched), (0, 0), "{stats:?}");
}

#[test]
fn a_keyless_watch_that_holds_its_slot_when_its_timeout_fires_expires_it() {
    explore("keyless watch vs expiry", keyless_watch_and_expiry_model);
}

#[test]
fn a_keyless_operation_forced_as_it_expires_is_answered_once() {
    explore("keyless force vs expiry", keyless_force_and_expiry_model);
}

#[test]
fn a_watch_that_holds_its_slot_when_its_timeout_fires_expires_it() {
    explore("watch and expiry", watch_and_expiry_model);
}

#[test]
fn a_check_that_holds_a_slot_when_its_timeout_fires_expires_it() {
    explore("check and expiry", check_and_expiry_model);
}

#[test]
fn a_check_racing_a_reuse_of_its_slot_loses_no_expiry() {
    explore("check racing a reuse", check_racing_a_reuse_model);
}

/// What the late thread of [`give_back_model`] does with the name of X, an operation of
/// the segment given back meanwhile.
#[derive(Clone, Copy, Debug)]
enum LateAction {
    Cancel,
    Force,
    IsCompleted,
    /// A check of X's key, whose entry for X is still listed (under loom every tag
    /// collides, so the check looks at the slot behind it).
    Check,
}

/// Nine operations fill the first segment (8 slots under loom) and one slot of the
/// second (X), and are forced. One thread then uses X's stale name while another purges,
/// which gives the second segment back (nothing is in use) and frees it once no pin
/// taken before the unlink is left. Each segment carries, under loom, a cell written when
/// it is freed and read by every look-up: a look-up the grace period does not cover is a
/// data race loom reports. After both, the segment is made again by nine new
/// operations: X's name matches none of them.
fn give_back_model(action: LateAction) {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let first = watch_nine(&purgatory, KEY);
    let x = first[8];
    assert_eq!(purgatory.force_complete_batch(first.iter()), 9);
    let late = {
        let purgatory = purgatory.clone();
        spawn(move || act_late(&purgatory, &x, action))
    };
    let giver = {
        let purgatory = purgatory.clone();
        spawn(move || {
            purgatory.purge();
        })
    };
    late.join().unwrap();
    giver.join().unwrap();
    // Frees what waited for the late thread's pin (if it had to).
    purgatory.purge();
    let second = watch_nine(&purgatory, 100);
    assert_reaches_nothing(&purgatory, &x, &second, action);
}

#[test]
fn a_stale_cancel_racing_a_give_back_reads_no_freed_segment() {
    explore("give back and a late cancel", || {
        give_back_model(LateAction::Cancel)
    });
}

#[test]
fn a_stale_force_racing_a_give_back_reads_no_freed_segment() {
    explore("give back and a late force", || {
        give_back_model(LateAction::Force)
    });
}

#[test]
fn a_stale_is_completed_racing_a_give_back_reads_no_freed_segment() {
    explore("give back and a late is_completed", || {
        give_back_model(LateAction::IsCompleted)
    });
}

#[test]
fn a_stale_check_racing_a_give_back_reads_no_freed_segment() {
    explore("give back and a late check", || {
        give_back_model(LateAction::Check)
    });
}

/// What the late thread of the give-back models does with X's stale name: it finds X
/// answered, and changes nothing.
fn act_late(purgatory: &Purgatory<u8, Op>, x: &purgatory::OperationHandle<Op>, action: LateAction) {
    match action {
        LateAction::Cancel => assert!(purgatory.cancel(x).is_none()),
        LateAction::Force => assert!(!purgatory.force_complete(x)),
        LateAction::IsCompleted => assert!(purgatory.is_completed(x)),
        LateAction::Check => assert_eq!(purgatory.check_and_complete(&KEY), 0),
    }
}

/// After a give-back model: X's stale name matches none of the `second` burst's
/// operations, which all still wait.
fn assert_reaches_nothing(
    purgatory: &Purgatory<u8, Op>,
    x: &purgatory::OperationHandle<Op>,
    second: &[purgatory::OperationHandle<Op>],
    action: LateAction,
) {
    assert!(purgatory.is_completed(x), "{action:?}");
    assert!(purgatory.cancel(x).is_none(), "{action:?}");
    assert!(!purgatory.force_complete(x), "{action:?}");
    for handle in second {
        assert!(!purgatory.is_completed(handle), "{action:?}");
    }
    assert_eq!(purgatory.stats().pending, 9);
}

/// Watches nine never-ready operations on keys `first_key + 1 ..` (the ninth on `KEY`
/// when `first_key` is `KEY`): with eight before them, the ninth takes the first slot of
/// the second segment (8 slots a segment under loom).
fn watch_nine(purgatory: &Purgatory<u8, Op>, first_key: u8) -> Vec<purgatory::OperationHandle<Op>> {
    (0..9u8)
        .map(|i| {
            let (op, _) = never_ready(Duration::from_secs(60));
            let key = if first_key == KEY && i == 8 {
                KEY
            } else {
                first_key + 1 + i
            };
            let WatchOutcome::Pending(handle) = purgatory.watch(op, [key]).expect("accepted")
            else {
                panic!("waits");
            };
            handle
        })
        .collect()
}

/// [`give_back_model`] with the next burst racing the late thread: the giver purges
/// (giving the second segment back) and then watches nine operations, the ninth of which
/// needs the second segment again. While the late thread's pin lives the segment waits
/// for its grace, and the ninth watch links it again as it is: the late thread, which
/// may have found X's slot before the unlink, then reads a live segment whose slot
/// another operation may occupy. X's name matches none of the new operations.
fn relink_model(action: LateAction) {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let first = watch_nine(&purgatory, KEY);
    let x = first[8];
    assert_eq!(purgatory.force_complete_batch(first.iter()), 9);
    let late = {
        let purgatory = purgatory.clone();
        spawn(move || act_late(&purgatory, &x, action))
    };
    let giver = {
        let purgatory = purgatory.clone();
        spawn(move || {
            purgatory.purge();
            watch_nine(&purgatory, 100)
        })
    };
    late.join().unwrap();
    let second = giver.join().unwrap();
    assert_reaches_nothing(&purgatory, &x, &second, action);
}

#[test]
fn a_stale_is_completed_racing_a_relinked_segment_touches_no_new_operation() {
    explore("give back, relink and a late is_completed", || {
        relink_model(LateAction::IsCompleted)
    });
}

#[test]
fn a_stale_check_racing_a_relinked_segment_touches_no_new_operation() {
    explore("give back, relink and a late check", || {
        relink_model(LateAction::Check)
    });
}

#[test]
fn a_stale_force_racing_a_relinked_segment_touches_no_new_operation() {
    explore("give back, relink and a late force", || {
        relink_model(LateAction::Force)
    });
}

/// [`relink_model`] with the segment surely made anew: the late thread uses X's stale
/// name only once the giver's purge is done (no pin held it, so the second segment was
/// unlinked and freed), while the giver's next nine watches make the segment again. Its
/// slots are unfilled until handed out (zeroed memory, `slot.rs`), and the ninth watch
/// fills X's slot under the late thread's compare: X's name matches neither the unfilled
/// slot nor the filled one (its floor is above X's generation), and the late thread never
/// reads a state (loom reports a read of the cell the fill writes as a data race).
fn made_anew_model(action: LateAction) {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let first = watch_nine(&purgatory, KEY);
    let x = first[8];
    assert_eq!(purgatory.force_complete_batch(first.iter()), 9);
    let purged = Arc::new(AtomicBool::new(false));
    let late = {
        let purgatory = purgatory.clone();
        let purged = Arc::clone(&purged);
        spawn(move || {
            while !purged.load(SeqCst) {
                loom::thread::yield_now();
            }
            act_late(&purgatory, &x, action);
        })
    };
    let giver = {
        let purgatory = purgatory.clone();
        let purged = Arc::clone(&purged);
        spawn(move || {
            purgatory.purge();
            purged.store(true, SeqCst);
            watch_nine(&purgatory, 100)
        })
    };
    late.join().unwrap();
    let second = giver.join().unwrap();
    assert_reaches_nothing(&purgatory, &x, &second, action);
}

#[test]
fn a_stale_force_racing_the_fill_of_a_segment_made_anew_touches_nothing() {
    explore("segment made anew and a late force", || {
        made_anew_model(LateAction::Force)
    });
}

#[test]
fn a_stale_check_racing_the_fill_of_a_segment_made_anew_touches_nothing() {
    explore("segment made anew and a late check", || {
        made_anew_model(LateAction::Check)
    });
}

/// Watches `n` never-ready operations on keys `first_key + 1 ..`, each with its
/// outcome.
fn watch_pending(
    purgatory: &Purgatory<u8, Op>,
    first_key: u8,
    n: u8,
) -> Vec<(purgatory::OperationHandle<Op>, std::sync::Arc<Outcome>)> {
    (0..n)
        .map(|i| {
            let (op, outcome) = never_ready(Duration::from_secs(60));
            let WatchOutcome::Pending(handle) =
                purgatory.watch(op, [first_key + 1 + i]).expect("accepted")
            else {
                panic!("waits");
            };
            (handle, outcome)
        })
        .collect()
}

/// Forces every operation of `watched` still waiting; checks that each one watched was
/// answered exactly once, forced.
fn force_all_once(
    purgatory: &Purgatory<u8, Op>,
    watched: &[(purgatory::OperationHandle<Op>, std::sync::Arc<Outcome>)],
    what: &str,
) {
    purgatory.force_complete_batch(watched.iter().map(|(handle, _)| handle));
    for (handle, outcome) in watched {
        assert!(purgatory.is_completed(handle), "{what}");
        assert_eq!(outcome.completions.load(SeqCst), 1, "{what}: once");
        assert_eq!(outcome.how.load(SeqCst), 2, "{what}: forced");
    }
}

/// The give-back's hand-over with a vacate (`op_table/give_back.rs`, "Setting aside"):
/// nine operations fill the first segment (8 slots under loom) and one slot of the
/// second (X); the first eight are forced, so the second segment could go but for X. A
/// first give-back while X waits gives nothing back: it sets the segment's free slots
/// aside and sweeps the free lists, and finds X's slot in use. Then one thread forces X,
/// whose slot is vacated (aside, as the vacate reads under its free list's lock that the
/// segment is being emptied), while another gives back again (it unlinks the segment
/// once every slot of it handed out is set aside, and frees it after its grace). In
/// every interleaving: X is answered once, no free list names a slot of a segment given
/// back (the operations watched afterwards, some in that segment made again, are each
/// answered exactly once; a slot handed out from a segment given back panics), and once
/// both are done a last give-back leaves the first segment only.
fn set_aside_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let first = watch_pending(&purgatory, KEY, 9);
    let done = purgatory.force_complete_batch(first[..8].iter().map(|(handle, _)| handle));
    assert_eq!(done, 8);
    purgatory.purge();
    assert_eq!(
        purgatory.op_table_capacity(),
        24,
        "X's segment stays while X waits"
    );
    force_x_beside_a_give_back(&purgatory, &first);
}

/// The race of [`set_aside_model`] and [`sweep_race_model`]: X (the ninth of `first`,
/// the one operation left in the second segment) forced on one thread while another
/// gives back; then, once both are done, a last give-back leaves the first segment only,
/// every operation of `first` was answered exactly once, and nine watched afterwards
/// are too (no slot handed out twice, none taken from a segment given back).
fn force_x_beside_a_give_back(
    purgatory: &Purgatory<u8, Op>,
    first: &[(purgatory::OperationHandle<Op>, std::sync::Arc<Outcome>)],
) {
    let x = first[8].0;
    let forcer = {
        let purgatory = purgatory.clone();
        spawn(move || assert!(purgatory.force_complete(&x)))
    };
    let giver = {
        let purgatory = purgatory.clone();
        spawn(move || {
            purgatory.purge();
        })
    };
    forcer.join().unwrap();
    giver.join().unwrap();
    purgatory.purge();
    assert_eq!(purgatory.op_table_capacity(), 8, "X's segment given back");
    force_all_once(purgatory, first, "the first nine");
    let second = watch_pending(purgatory, 100, 9);
    force_all_once(purgatory, &second, "the nine watched after");
    assert_eq!(purgatory.stats().pending, 0);
}

#[test]
fn a_slot_freed_while_its_segment_is_emptied_is_set_aside_and_never_lost() {
    explore("give back and a vacate into the segment", set_aside_model);
}

/// [`set_aside_model`] without the first give-back: X is forced while the other thread
/// starts setting the segment's slots aside and sweeps the free lists. A vacate reads
/// whether the segment is being emptied under its free list's lock, so X's slot never
/// lands in a list the sweep has passed: in every interleaving a last give-back, once
/// both are done, leaves the first segment only (a slot left in a list would keep the
/// segment for good: the give-back would wait for it to come aside).
fn sweep_race_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let first = watch_pending(&purgatory, KEY, 9);
    let done = purgatory.force_complete_batch(first[..8].iter().map(|(handle, _)| handle));
    assert_eq!(done, 8);
    force_x_beside_a_give_back(&purgatory, &first);
}

#[test]
fn a_slot_freed_while_the_free_lists_are_swept_is_never_left_behind() {
    explore("a vacate racing the sweep", sweep_race_model);
}

/// [`set_aside_model`] with the load growing back meanwhile: one thread watches five new
/// operations, so what is in use grows past half the slots below the second segment, and
/// then forces X, while another gives back. The giver may find the segment no longer a
/// candidate at any of its steps and stop setting aside: the slots set aside go back to
/// a free list after each list's lock was taken once, so a vacate that read the old
/// `aside.from` has put its slot aside by then. In every interleaving every operation is
/// answered exactly once, and those watched afterwards too (no slot was handed out twice
/// or taken from a segment given back), and once all are forced a last give-back leaves
/// the first segment only (no slot of the second was lost).
fn stop_setting_aside_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let first = watch_pending(&purgatory, KEY, 9);
    let done = purgatory.force_complete_batch(first[..8].iter().map(|(handle, _)| handle));
    assert_eq!(done, 8);
    let x = first[8].0;
    let grower = {
        let purgatory = purgatory.clone();
        spawn(move || {
            let grown = watch_pending(&purgatory, 50, 5);
            assert!(purgatory.force_complete(&x));
            grown
        })
    };
    let giver = {
        let purgatory = purgatory.clone();
        spawn(move || {
            purgatory.purge();
        })
    };
    let grown = grower.join().unwrap();
    giver.join().unwrap();
    force_all_once(&purgatory, &first, "the first nine");
    force_all_once(&purgatory, &grown, "the five watched meanwhile");
    purgatory.purge();
    assert_eq!(
        purgatory.op_table_capacity(),
        8,
        "the second segment given back"
    );
    let second = watch_pending(&purgatory, 100, 9);
    force_all_once(&purgatory, &second, "the nine watched after");
    assert_eq!(purgatory.stats().pending, 0);
}

#[test]
fn a_give_back_that_stops_setting_aside_loses_no_slot() {
    explore(
        "give back stopped by a growing load",
        stop_setting_aside_model,
    );
}

/// Two purgatories on one `TimerGroup` (`group.rs`): A's operation times out while B's
/// waits on a far timeout, and a watch on B races the round that expires A (driven through
/// A's handle) and the group's shutdown (called through B's handle). Whatever the
/// interleaving: A's operation is expired by its timeout once, by the round of the shared
/// timer that hands it to A; B's waiting operation is answered once, `Shutdown`; the racing
/// watch is refused (the operation given back) or answered once; each member's figures
/// count its own.
fn group_expiry_watch_and_shutdown_model() {
    let clock = ManualClock::new();
    let group = purgatory::TimerGroup::builder()
        .name("loom-group")
        .timer(
            TimerBuilder::new()
                .shards(1)
                .clock(clock.clone())
                .reaper(false),
        )
        .build()
        .expect("valid configuration");
    let member = || -> Purgatory<u8, Op> {
        PurgatoryBuilder::new()
            .shards(1)
            .build_on(&group)
            .expect("a place in the group")
    };
    let (a, b) = (member(), member());
    let (op_a, outcome_a) = never_ready(TIMEOUT);
    let (op_b, outcome_b) = never_ready(Duration::from_secs(60));
    assert!(matches!(a.watch(op_a, [KEY]), Ok(WatchOutcome::Pending(_))));
    assert!(matches!(
        b.watch_keyless(op_b),
        Ok(WatchOutcome::Pending(_))
    ));
    let (late, outcome_late) = never_ready(Duration::from_secs(60));
    let watcher = {
        let b = b.clone();
        spawn(move || b.watch(late, [KEY]).is_ok())
    };
    let expirer = {
        let a = a.clone();
        spawn(move || {
            clock.advance(TIMEOUT);
            a.advance_clock(Duration::ZERO);
        })
    };
    expirer.join().unwrap();
    b.shutdown();
    let accepted = watcher.join().unwrap();
    assert!(a.is_shutdown(), "B's shutdown is the group's");
    assert_expired_once(&outcome_a, "A's operation");
    assert_eq!(outcome_b.completions.load(SeqCst), 1, "B's: answered once");
    assert_eq!(outcome_b.how.load(SeqCst), 4, "B's: told Shutdown");
    assert_eq!(
        outcome_late.completions.load(SeqCst),
        usize::from(accepted),
        "the racing watch: answered once if accepted, never if refused"
    );
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.expired, sa.expired_at_shutdown), (1, 0));
    assert_eq!(
        (sb.expired, sb.expired_at_shutdown, sb.refused),
        (0, 1 + u64::from(accepted), u64::from(!accepted))
    );
    assert_eq!((sa.pending, sb.pending), (0, 0));
}

#[test]
fn members_of_a_group_each_answer_their_own_once_across_expiry_and_shutdown() {
    explore(
        "group: expiry, watch and shutdown",
        group_expiry_watch_and_shutdown_model,
    );
}

/// A completion queues its timer's cancel, and `pending()` applies the queued cancels
/// before it reads the timer (`cancels.rs`): a flush skips a queue whose flag it reads
/// clear, without its lock. Here a force races a second thread's `pending()`, and the
/// model thread calls `pending()` once it has seen the force return: it must count no
/// timer left, whichever flush applied the cancel and however the flags were read.
fn flush_after_a_completion_model() {
    let clock = ManualClock::new();
    let purgatory = purgatory(&clock);
    let (op, _outcome) = never_ready(Duration::from_secs(60));
    let WatchOutcome::Pending(handle) = purgatory.watch(op, [KEY]).expect("accepted") else {
        panic!("never ready, so it waits");
    };
    let forced = Arc::new(AtomicBool::new(false));
    let forcer = {
        let (purgatory, forced) = (purgatory.clone(), Arc::clone(&forced));
        spawn(move || {
            assert!(purgatory.force_complete(&handle));
            forced.store(true, Release);
        })
    };
    let other = {
        let purgatory = purgatory.clone();
        spawn(move || purgatory.pending())
    };
    if forced.load(Acquire) {
        assert_eq!(
            purgatory.pending(),
            0,
            "a cancel queued before the flush is applied"
        );
    }
    forcer.join().unwrap();
    assert!(other.join().unwrap() <= 1);
    assert_eq!(purgatory.pending(), 0);
}

#[test]
fn a_flush_after_a_completion_applies_its_cancel_whichever_flush_took_it() {
    explore("flush after a completion", flush_after_a_completion_model);
}
