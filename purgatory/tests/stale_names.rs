//! A stale name never takes away another operation's expiry, tried as a hostile caller
//! would: operation A is answered, B reuses A's slot with a 1-2 ms timeout, and one or two
//! threads keep acting on A's name (cancel, force, a guard's drop, a check of A's key
//! after A's one-byte tag collides with B's, a cancel of A's keys) until B is answered.
//! B must be answered, once, by its timeout, in every round.
//!
//! Also the hand-over the other way round: a check that holds X (not ready) while X's
//! timeout fires, racing a force of X and a reuse of its slot by Y, whose timeout must
//! not be lost either.
//!
//! These race real threads on the real reaper; the loom models in `tests/loom.rs` explore
//! the same scenarios exhaustively on a manual clock.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use purgatory::{
    Completion, DelayedOperation, OperationHandle, Purgatory, PurgatoryBuilder, WatchOutcome,
};

/// Rounds per scenario: on the protocol before `slot.rs` (a holder under a stale name
/// could unlock without honouring the expiry left for it) every scenario lost B's expiry
/// in 10 to 68 of 200 rounds here.
const ROUNDS: u64 = 200;

/// How long the stale threads keep at it in a round, at most.
const STALE_FOR: Duration = Duration::from_millis(50);

/// Longest a 1-2 ms timeout may take to be answered before the round counts it lost (far
/// beyond any scheduling delay; a lost expiry is never answered at all).
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// An operation that is never ready; it counts its `on_complete` calls.
struct Op {
    timeout: Duration,
    answers: Arc<AtomicU32>,
    expired: Arc<AtomicBool>,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, how: Completion) {
        // How first, then the count: a reader that sees the count sees how. (The other
        // order failed a CI run: the reaper, preempted between the two, left a round
        // reading B answered once and not expired.)
        self.expired.store(how == Completion::Expired, SeqCst);
        self.answers.fetch_add(1, SeqCst);
    }
}

/// An operation's answer count and whether it expired.
#[derive(Clone, Default)]
struct Answers {
    count: Arc<AtomicU32>,
    expired: Arc<AtomicBool>,
}

impl Answers {
    fn op(&self, timeout: Duration) -> Op {
        Op {
            timeout,
            answers: Arc::clone(&self.count),
            expired: Arc::clone(&self.expired),
        }
    }

    fn count(&self) -> u32 {
        self.count.load(SeqCst)
    }
}

fn watch(purgatory: &Purgatory<u64, Op>, op: Op, keys: &[u64]) -> OperationHandle<Op> {
    match purgatory.watch(op, keys.iter().copied()) {
        Ok(WatchOutcome::Pending(handle)) => handle,
        other => panic!("expected a waiting operation, got {:?}", other.map(|_| ())),
    }
}

/// What the stale threads do with A's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stale {
    Cancel,
    Force,
    GuardDrop,
    /// A check of A's key, A listed there 64 times, after A's slot was reused 256 times
    /// (B's tag equals A's).
    CheckAfterTagCollision,
    /// `cancel_for_key` over 128 keys, each listing A 512 times, 64 keys to a stale
    /// thread (a list is gone once cancelled: the stale threads spend them around B's
    /// timeout).
    CancelForKey,
}

/// Runs the scenario for `stale` [`ROUNDS`] times with `threads` stale threads; returns
/// the rounds in which B was not answered exactly once by its timeout.
fn stale_rounds(stale: Stale, threads: usize) -> Vec<String> {
    // No purges: they would drop A's stale entries before the stale threads get to them.
    let purgatory: Purgatory<u64, Op> = PurgatoryBuilder::new()
        .name("stale-names")
        .purge_interval(usize::MAX)
        .build()
        .unwrap();
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        // Keys of this round only.
        let base = round * 10_000;
        let a_keys: Vec<u64> = match stale {
            Stale::CheckAfterTagCollision => vec![base; 64],
            Stale::CancelForKey => (0..128 * 512).map(|i| base + i % 128).collect(),
            _ => vec![base],
        };
        let a_answers = Answers::default();
        let a = watch(&purgatory, a_answers.op(Duration::from_secs(60)), &a_keys);
        assert!(purgatory.force_complete(&a));
        if stale == Stale::CheckAfterTagCollision {
            // The slot goes back to this thread's free list each time: 255 more
            // occupants, so B's generation is A's + 256.
            for _ in 0..255 {
                let x = watch(
                    &purgatory,
                    Answers::default().op(Duration::from_secs(60)),
                    &[base + 5_001],
                );
                assert!(purgatory.force_complete(&x));
            }
        }
        let b_answers = Answers::default();
        let b_timeout = Duration::from_micros(1_000 + round % 2 * 1_000);
        let b = watch(&purgatory, b_answers.op(b_timeout), &[base + 5_000]);
        let start = Instant::now();
        let stale_threads: Vec<_> = (0..threads)
            .map(|t| {
                let purgatory = purgatory.clone();
                let b_answers = b_answers.clone();
                let a_keys = a_keys.clone();
                std::thread::spawn(move || {
                    if stale == Stale::CancelForKey {
                        // Each list can be cancelled once: spend them around B's timeout.
                        let from = b_timeout.saturating_sub(Duration::from_micros(400));
                        while start.elapsed() < from {
                            std::hint::spin_loop();
                        }
                    }
                    while b_answers.count() == 0 && start.elapsed() < STALE_FOR {
                        match stale {
                            Stale::Cancel => assert!(purgatory.cancel(&a).is_none()),
                            Stale::Force => assert!(!purgatory.force_complete(&a)),
                            Stale::GuardDrop => drop(purgatory.cancel_on_drop(a)),
                            Stale::CheckAfterTagCollision => {
                                assert_eq!(purgatory.check_and_complete(&a_keys[0]), 0)
                            }
                            Stale::CancelForKey => {
                                for key in &a_keys[t * 64..(t + 1) * 64] {
                                    assert!(purgatory.cancel_for_key(key).is_empty());
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        for thread in stale_threads {
            thread.join().unwrap();
        }
        let deadline = Instant::now() + ANSWER_WITHIN;
        while b_answers.count() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if b_answers.count() != 1 || !b_answers.expired.load(SeqCst) || a_answers.count() != 1 {
            failures.push(format!(
                "round {round}: B answered {} times (expired: {}), is_completed {}; A answered {} times",
                b_answers.count(),
                b_answers.expired.load(SeqCst),
                purgatory.is_completed(&b),
                a_answers.count(),
            ));
        }
    }
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 0, "{stats:?}");
    assert_eq!(
        stats.cancelled, 0,
        "a stale name cancelled something: {stats:?}"
    );
    failures
}

fn assert_none_lost(stale: Stale, threads: usize) {
    let failures = stale_rounds(stale, threads);
    assert!(
        failures.is_empty(),
        "{stale:?} with {threads} stale threads: {} of {ROUNDS} rounds failed, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

#[test]
fn a_stale_cancel_never_takes_away_an_expiry() {
    assert_none_lost(Stale::Cancel, 1);
    assert_none_lost(Stale::Cancel, 2);
}

#[test]
fn a_stale_force_never_takes_away_an_expiry() {
    assert_none_lost(Stale::Force, 1);
    assert_none_lost(Stale::Force, 2);
}

#[test]
fn a_stale_guard_drop_never_takes_away_an_expiry() {
    assert_none_lost(Stale::GuardDrop, 1);
    assert_none_lost(Stale::GuardDrop, 2);
}

#[test]
fn a_check_after_a_tag_collision_never_takes_away_an_expiry() {
    assert_none_lost(Stale::CheckAfterTagCollision, 1);
}

#[test]
fn a_stale_cancel_for_key_never_takes_away_an_expiry() {
    assert_none_lost(Stale::CancelForKey, 2);
}

/// A check holds X (never ready) again and again while X's 1-2 ms timeout fires; this
/// thread forces X and watches Y (1-2 ms) into the slot X leaves. X is answered once
/// (expired or forced); Y's expiry is never lost to the check's hold of X's name.
#[test]
fn a_check_racing_a_reuse_of_its_slot_never_loses_an_expiry() {
    let purgatory: Purgatory<u64, Op> = Purgatory::new("check-racing-reuse");
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let key = round * 10;
        let x_answers = Answers::default();
        let timeout = Duration::from_micros(1_000 + round % 2 * 1_000);
        let x = watch(&purgatory, x_answers.op(timeout), &[key]);
        let y_answers = Answers::default();
        let checker = {
            let purgatory = purgatory.clone();
            let y_answers = y_answers.clone();
            let start = Instant::now();
            std::thread::spawn(move || {
                while y_answers.count() == 0 && start.elapsed() < STALE_FOR {
                    purgatory.check_and_complete(&key);
                }
            })
        };
        std::thread::sleep(timeout / 2 + Duration::from_micros(round % 7 * 100));
        purgatory.force_complete(&x);
        let y = watch(&purgatory, y_answers.op(timeout), &[key + 1]);
        checker.join().unwrap();
        let deadline = Instant::now() + ANSWER_WITHIN;
        while y_answers.count() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if x_answers.count() != 1 || y_answers.count() != 1 || !y_answers.expired.load(SeqCst) {
            failures.push(format!(
                "round {round}: X answered {} times, Y {} times (expired: {}, is_completed {})",
                x_answers.count(),
                y_answers.count(),
                y_answers.expired.load(SeqCst),
                purgatory.is_completed(&y)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {ROUNDS} rounds failed, first: {:#?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

// Deterministic: a stale name neither waits for the slot's new occupant nor touches it.
//
// B's `try_complete` is held inside a check (so B's slot is held, as long as the test
// wants), a stale call on A's name is made meanwhile, then B's timeout fires (a manual
// clock): the stale call must return at once, without waiting for B's `try_complete`,
// and B must be expired exactly once, by the check's unlock. (Before `slot.rs`, a stale
// call waited for the slot's lock, that is for another operation's user code, and
// whoever held the lock under a stale name at the expiry dropped it.)

mod deterministic {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
    use std::sync::mpsc;
    use std::sync::{Arc, Condvar, Mutex};
    use std::time::Duration;

    use purgatory::{
        Completion, DelayedOperation, ManualClock, OperationHandle, Purgatory, PurgatoryBuilder,
        TimerBuilder, WatchOutcome,
    };

    use super::Stale;

    /// Opened once by the test; a held `try_complete` waits for it.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl Gate {
        fn wait(&self) {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
        }

        fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    /// Never ready; when `hold` is set, its `try_complete` says so on `entered` and waits
    /// for the gate.
    struct Held {
        timeout: Duration,
        hold: Arc<AtomicBool>,
        gate: Arc<Gate>,
        entered: mpsc::Sender<()>,
        answers: Arc<AtomicU32>,
        expired: Arc<AtomicBool>,
    }

    impl DelayedOperation for Held {
        fn timeout(&self) -> Duration {
            self.timeout
        }
        fn try_complete(&mut self) -> bool {
            if self.hold.load(SeqCst) {
                let _ = self.entered.send(());
                self.gate.wait();
            }
            false
        }
        fn on_complete(&mut self, how: Completion) {
            self.expired.store(how == Completion::Expired, SeqCst);
            self.answers.fetch_add(1, SeqCst);
        }
    }

    struct Scene {
        clock: ManualClock,
        purgatory: Purgatory<u64, Held>,
        gate: Arc<Gate>,
        entered: mpsc::Receiver<()>,
        sender: mpsc::Sender<()>,
    }

    impl Scene {
        fn new() -> Self {
            let clock = ManualClock::new();
            let purgatory = PurgatoryBuilder::new()
                .name("stale-deterministic")
                .purge_interval(usize::MAX)
                .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
                .build()
                .unwrap();
            let (sender, entered) = mpsc::channel();
            Scene {
                clock,
                purgatory,
                gate: Arc::default(),
                entered,
                sender,
            }
        }

        /// Watches an operation on `keys`; returns its handle, its hold switch, its
        /// answer count and whether it expired.
        #[allow(clippy::type_complexity)]
        fn watch(
            &self,
            timeout: Duration,
            keys: &[u64],
        ) -> (
            OperationHandle<Held>,
            Arc<AtomicBool>,
            Arc<AtomicU32>,
            Arc<AtomicBool>,
        ) {
            let hold = Arc::new(AtomicBool::new(false));
            let answers = Arc::new(AtomicU32::new(0));
            let expired = Arc::new(AtomicBool::new(false));
            let op = Held {
                timeout,
                hold: Arc::clone(&hold),
                gate: Arc::clone(&self.gate),
                entered: self.sender.clone(),
                answers: Arc::clone(&answers),
                expired: Arc::clone(&expired),
            };
            match self.purgatory.watch(op, keys.iter().copied()) {
                Ok(WatchOutcome::Pending(handle)) => (handle, hold, answers, expired),
                other => panic!("expected a waiting operation, got {:?}", other.map(|_| ())),
            }
        }
    }

    const A_KEY: u64 = 1;
    const B_KEY: u64 = 2;
    const OTHER_KEY: u64 = 3;

    fn stale_call_while_the_occupant_is_held(stale: Stale) {
        let scene = Scene::new();
        let a = scene.watch(Duration::from_secs(60), &[A_KEY]).0;
        assert!(scene.purgatory.force_complete(&a));
        if stale == Stale::CheckAfterTagCollision {
            for _ in 0..255 {
                let x = scene.watch(Duration::from_secs(60), &[OTHER_KEY]).0;
                assert!(scene.purgatory.force_complete(&x));
            }
        }
        let timeout = Duration::from_millis(1);
        let (b, hold, b_answers, b_expired) = scene.watch(timeout, &[B_KEY]);
        // B's slot is held: a check of B's key is inside B's `try_complete`.
        hold.store(true, SeqCst);
        let checker = {
            let purgatory = scene.purgatory.clone();
            std::thread::spawn(move || purgatory.check_and_complete(&B_KEY))
        };
        scene.entered.recv().unwrap();
        // The stale call, on a thread of its own: it must come back while B is held.
        let (done, finished) = mpsc::channel();
        let stale_call = {
            let purgatory = scene.purgatory.clone();
            std::thread::spawn(move || {
                match stale {
                    Stale::Cancel => assert!(purgatory.cancel(&a).is_none()),
                    Stale::Force => assert!(!purgatory.force_complete(&a)),
                    Stale::GuardDrop => drop(purgatory.cancel_on_drop(a)),
                    Stale::CheckAfterTagCollision => {
                        assert_eq!(purgatory.check_and_complete(&A_KEY), 0)
                    }
                    Stale::CancelForKey => assert!(purgatory.cancel_for_key(&A_KEY).is_empty()),
                }
                done.send(()).unwrap();
            })
        };
        let returned = finished.recv_timeout(Duration::from_secs(5)).is_ok();
        // B's timeout fires while the check still holds B.
        scene.clock.advance(timeout);
        assert_eq!(
            scene.purgatory.advance_clock(Duration::ZERO),
            1,
            "B's timer fired"
        );
        assert_eq!(
            b_answers.load(SeqCst),
            0,
            "the expiry did not wait for the holder"
        );
        scene.gate.open();
        assert_eq!(checker.join().unwrap(), 0, "B is never ready");
        stale_call.join().unwrap();
        assert!(
            returned,
            "{stale:?} on a stale name waited for the slot's new occupant"
        );
        assert_eq!(b_answers.load(SeqCst), 1, "{stale:?}: B answered once");
        assert!(b_expired.load(SeqCst), "{stale:?}: B expired");
        assert!(scene.purgatory.is_completed(&b));
        let stats = scene.purgatory.stats();
        assert_eq!(
            (stats.expired, stats.cancelled, stats.pending),
            (1, 0, 0),
            "{stats:?}"
        );
    }

    #[test]
    fn a_stale_cancel_neither_waits_for_nor_touches_the_next_occupant() {
        stale_call_while_the_occupant_is_held(Stale::Cancel);
    }

    #[test]
    fn a_stale_force_neither_waits_for_nor_touches_the_next_occupant() {
        stale_call_while_the_occupant_is_held(Stale::Force);
    }

    #[test]
    fn a_stale_guard_drop_neither_waits_for_nor_touches_the_next_occupant() {
        stale_call_while_the_occupant_is_held(Stale::GuardDrop);
    }

    #[test]
    fn a_check_after_a_tag_collision_neither_waits_for_nor_touches_the_next_occupant() {
        stale_call_while_the_occupant_is_held(Stale::CheckAfterTagCollision);
    }

    #[test]
    fn a_stale_cancel_for_key_neither_waits_for_nor_touches_the_next_occupant() {
        stale_call_while_the_occupant_is_held(Stale::CancelForKey);
    }

    /// The hand-over the other way: a check holds X when X's timeout fires, and a force of
    /// X waits for the check. The check's unlock expires X (the force gets nothing); Y then
    /// reuses the slot and its own timeout is honoured.
    #[test]
    fn an_expiry_that_finds_a_check_holding_the_slot_is_honoured_by_its_unlock() {
        let scene = Scene::new();
        let timeout = Duration::from_millis(1);
        let (x, hold, x_answers, x_expired) = scene.watch(timeout, &[A_KEY]);
        hold.store(true, SeqCst);
        let checker = {
            let purgatory = scene.purgatory.clone();
            std::thread::spawn(move || purgatory.check_and_complete(&A_KEY))
        };
        scene.entered.recv().unwrap();
        scene.clock.advance(timeout);
        assert_eq!(scene.purgatory.advance_clock(Duration::ZERO), 1);
        let forcer = {
            let purgatory = scene.purgatory.clone();
            std::thread::spawn(move || purgatory.force_complete(&x))
        };
        scene.gate.open();
        assert_eq!(checker.join().unwrap(), 0);
        assert!(
            !forcer.join().unwrap(),
            "the check's unlock expired X first"
        );
        assert_eq!(x_answers.load(SeqCst), 1);
        assert!(x_expired.load(SeqCst));
        let (y, _, y_answers, y_expired) = scene.watch(timeout, &[B_KEY]);
        scene.clock.advance(timeout);
        assert_eq!(scene.purgatory.advance_clock(Duration::ZERO), 1);
        assert_eq!(y_answers.load(SeqCst), 1);
        assert!(y_expired.load(SeqCst));
        assert!(scene.purgatory.is_completed(&y));
        let stats = scene.purgatory.stats();
        assert_eq!(
            (stats.expired, stats.forced, stats.pending),
            (2, 0, 0),
            "{stats:?}"
        );
    }
}
