//! Shutdown and refusal: `shutdown` (and drop) expire every pending operation so each
//! request gets an answer, are prompt whatever the pending timeouts, and afterwards the
//! purgatory refuses operations by giving them back; an empty key list is refused the
//! same way.
//!
//! Shutting down joins the reaper: a test that hangs there fails through a bounded wait
//! on another thread instead of hanging the suite.

mod probe;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use probe::{never, wait_until, within, DropBomb, Ledger, Probe, Rng};
use purgatory::{
    Clock, Completion, DelayedOperation, Purgatory, PurgatoryBuilder, SystemClock, TimerBuilder,
    WatchError, WatchOutcome,
};

const LONG: Duration = Duration::from_secs(200);

/// Issue #28, finding 1: a service answers a timeout (204) and a shutdown (503)
/// differently, so the operation is told which, and what it is told is what was counted.
#[test]
fn an_operation_is_told_a_shutdown_from_a_timeout_as_the_stats_count_them() {
    let clock = purgatory::ManualClock::new();
    let purgatory: Purgatory<&str, Probe> = probe::manual_purgatory(&clock);
    let ledger = Ledger::new(2);
    let no = never();
    assert!(!purgatory
        .try_complete_else_watch(
            Probe::new(0, Duration::from_millis(10), &ledger, &no),
            ["a"]
        )
        .unwrap());
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(1, LONG, &ledger, &no), ["a"])
        .unwrap());
    clock.advance(Duration::from_millis(20));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
    purgatory.shutdown();
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!(ledger.how(1), Some(Completion::Shutdown));
    // on_expiration follows both: neither was ready.
    assert_eq!((ledger.expirations(0), ledger.expirations(1)), (1, 1));
    let stats = purgatory.stats();
    assert_eq!((stats.expired, stats.expired_at_shutdown), (1, 1));
    assert!(Completion::Shutdown.is_expiry() && Completion::Expired.is_expiry());
    assert!(!Completion::Ready.is_expiry() && !Completion::Forced.is_expiry());
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn shutdown_expires_every_pending_operation_promptly() {
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("shutdown");
    let ledger = Ledger::new(3);
    let no = never();
    for (id, keys) in [vec!["a"], vec!["a", "b"], vec!["c"]]
        .into_iter()
        .enumerate()
    {
        assert!(!purgatory
            .try_complete_else_watch(Probe::new(id, LONG, &ledger, &no), keys)
            .unwrap());
    }
    // Let the reaper fall asleep on the 200 s timeouts.
    std::thread::sleep(Duration::from_millis(20));

    let start = Instant::now();
    let shut = purgatory.clone();
    within(Duration::from_secs(10), "shutdown", move || shut.shutdown());
    let took = start.elapsed();
    assert!(took < Duration::from_millis(500), "shutdown took {took:?}");

    assert!(purgatory.is_shutdown());
    for id in 0..3 {
        assert_eq!(ledger.how(id), Some(Completion::Shutdown));
        assert_eq!(ledger.completions(id), 1);
        assert_eq!(ledger.expirations(id), 1);
        assert_eq!(ledger.drops(id), 1);
    }
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (0, 0, 0));
    assert_eq!(
        (stats.expired, stats.expired_at_shutdown),
        (0, 3),
        "expired by shutdown, not by their timeouts"
    );

    purgatory.shutdown();
    assert_eq!(
        ledger.total_completions(),
        3,
        "a second shutdown does nothing"
    );
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn after_shutdown_operations_are_given_back() {
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("closed");
    purgatory.shutdown();
    let ledger = Ledger::new(2);
    let no = never();

    match purgatory.try_complete_else_watch(Probe::new(0, LONG, &ledger, &no), ["k"]) {
        Err(WatchError::Shutdown(op)) => assert_eq!(op.id, 0),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let refused = purgatory
        .watch(Probe::new(1, LONG, &ledger, &no), ["k"])
        .expect_err("refused after shutdown");
    assert!(!refused.to_string().is_empty());
    assert_eq!(refused.into_operation().id, 1);
    assert_eq!(purgatory.check_and_complete(&"k"), 0);
    assert!(purgatory.cancel_for_key(&"k").is_empty());
    assert_eq!(
        ledger.total_completions(),
        0,
        "refused operations are not completed"
    );
    assert_eq!(ledger.tries(0) + ledger.tries(1), 0);
    assert_eq!(ledger.drops(0) + ledger.drops(1), 2, "we dropped them");
}

#[test]
fn an_empty_key_list_is_refused_with_the_operation() {
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("no-keys");
    let ledger = Ledger::new(1);
    let no = never();
    match purgatory.try_complete_else_watch(Probe::new(0, LONG, &ledger, &no), Vec::new()) {
        Err(error @ WatchError::NoKeys(_)) => {
            assert!(!error.to_string().is_empty());
            assert_eq!(error.into_operation().id, 0);
        }
        other => panic!("expected NoKeys, got {other:?}"),
    }
    assert_eq!(ledger.total_completions(), 0);
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched), (0, 0));
}

#[test]
fn dropping_the_purgatory_expires_pending_operations() {
    let ledger = Ledger::new(2);
    let no = never();
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("dropped");
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(0, LONG, &ledger, &no), ["a"])
        .unwrap());
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(1, LONG, &ledger, &no), ["a", "b"])
        .unwrap());
    within(Duration::from_secs(10), "drop", move || drop(purgatory));
    for id in 0..2 {
        assert_eq!(ledger.how(id), Some(Completion::Shutdown));
        assert_eq!(ledger.expirations(id), 1);
        assert_eq!(ledger.drops(id), 1);
    }
    assert_eq!(ledger.violations(), 0);
}

/// The reaper may be anywhere in its loop when shutdown comes: just started, between
/// rounds, about to sleep with nothing pending (an unbounded sleep) or with something
/// pending. Shutdown must wake it wherever it is.
#[test]
fn shutdown_never_waits_for_the_reaper_to_wake_by_itself() {
    const ROUNDS: usize = 300;
    let ledger = Ledger::new(ROUNDS);
    let no = never();
    let mut rng = Rng::new(7);
    for round in 0..ROUNDS {
        let purgatory: Purgatory<usize, Probe> = PurgatoryBuilder::new()
            .name("shutdown-race")
            .build()
            .unwrap();
        // Odd rounds: the reaper sleeps at most its 200 ms wait; even rounds: nothing is
        // pending, it sleeps until woken.
        if round % 2 == 1 {
            assert!(!purgatory
                .try_complete_else_watch(Probe::new(round, LONG, &ledger, &no), [round])
                .unwrap());
        }
        let pause = rng.below(300);
        if pause > 0 {
            std::thread::sleep(Duration::from_micros(pause));
        }
        let start = Instant::now();
        within(Duration::from_secs(10), "shutdown", move || {
            purgatory.shutdown()
        });
        let took = start.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "round {round}: shutdown took {took:?}"
        );
        if round % 2 == 1 {
            assert_eq!(ledger.how(round), Some(Completion::Shutdown));
        }
    }
    assert_eq!(ledger.violations(), 0);
}

/// A real clock that can hold the reaper inside one of its rounds: armed, the next read
/// of the clock on the reaper thread (named `gate-reaper`) waits until the gate opens.
#[derive(Clone)]
struct GateClock {
    clock: SystemClock,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    armed: AtomicBool,
    entered: AtomicBool,
    open: AtomicBool,
}

impl Clock for GateClock {
    fn now(&self) -> Duration {
        let on_reaper = std::thread::current().name() == Some("gate-reaper");
        if on_reaper && self.gate.armed.swap(false, SeqCst) {
            self.gate.entered.store(true, SeqCst);
            wait_until(Duration::from_secs(20), || self.gate.open.load(SeqCst));
        }
        self.clock.now()
    }
}

/// Shutdown comes while the reaper is inside a round, past its last look at the shutdown
/// flag and before it sleeps (with nothing pending: until woken). The shutdown's wake-up
/// must not be lost in that window, or shutdown waits forever to join the reaper.
#[test]
fn shutdown_wakes_a_reaper_that_is_about_to_sleep() {
    let gate = Arc::new(Gate::default());
    gate.armed.store(true, SeqCst);
    let clock = GateClock {
        clock: SystemClock::new(),
        gate: Arc::clone(&gate),
    };
    let purgatory: Purgatory<u32, Probe> = PurgatoryBuilder::new()
        .name("gate")
        .timer(TimerBuilder::new().clock(clock))
        .build()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || gate.entered.load(SeqCst)),
        "the reaper never read the clock"
    );

    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        purgatory.shutdown();
        let _ = done_tx.send(());
    });
    // Give shutdown time to raise its flag and send its wake-up while the reaper is held.
    std::thread::sleep(Duration::from_millis(50));
    gate.open.store(true, SeqCst);
    assert!(
        done_rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "shutdown is stuck joining a reaper that slept through its wake-up"
    );
}

/// An operation that takes a while to answer its expiry, counting answers.
struct SlowAnswer {
    answered: Arc<std::sync::atomic::AtomicUsize>,
}

impl purgatory::DelayedOperation for SlowAnswer {
    fn timeout(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {
        std::thread::sleep(Duration::from_micros(500));
        self.answered.fetch_add(1, SeqCst);
    }
}

#[test]
fn with_a_pool_shutdown_returns_only_after_every_pending_operation_was_answered() {
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let pool = purgatory::Executor::pool(2).unwrap();
    let purgatory: Purgatory<u32, SlowAnswer> = PurgatoryBuilder::new()
        .name("pool-shutdown")
        .timer(TimerBuilder::new().executor(pool))
        .build()
        .unwrap();
    for key in 0..200 {
        let op = SlowAnswer {
            answered: Arc::clone(&answered),
        };
        assert!(!purgatory.try_complete_else_watch(op, [key]).unwrap());
    }
    // Let the timeouts come due and batches reach the pool, then shut down while the
    // pool is still answering.
    assert!(wait_until(Duration::from_secs(10), || answered
        .load(SeqCst)
        > 0));
    purgatory.shutdown();
    assert_eq!(
        answered.load(SeqCst),
        200,
        "shutdown returned before every answer"
    );
}

#[test]
fn a_second_concurrent_shutdown_waits_for_the_first() {
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let purgatory: Purgatory<u32, Counted> = PurgatoryBuilder::new()
        .name("two-shutdowns")
        .build()
        .unwrap();
    const OPS: usize = 20_000;
    for key in 0..OPS as u32 {
        let op = Counted {
            answered: Arc::clone(&answered),
        };
        assert!(!purgatory.try_complete_else_watch(op, [key]).unwrap());
    }
    let barrier = Arc::new(std::sync::Barrier::new(2));
    let shutters: Vec<_> = (0..2)
        .map(|_| {
            let (purgatory, barrier, answered) = (
                purgatory.clone(),
                Arc::clone(&barrier),
                Arc::clone(&answered),
            );
            std::thread::spawn(move || {
                barrier.wait();
                purgatory.shutdown();
                answered.load(SeqCst)
            })
        })
        .collect();
    for shutter in shutters {
        assert_eq!(shutter.join().unwrap(), OPS, "a shutdown returned early");
    }
}

/// A never-ready, long-waiting operation that counts its answer.
struct Counted {
    answered: Arc<std::sync::atomic::AtomicUsize>,
}

impl purgatory::DelayedOperation for Counted {
    fn timeout(&self) -> Duration {
        Duration::from_secs(600)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {
        self.answered.fetch_add(1, SeqCst);
    }
}

/// Shuts its own purgatory down from inside its expiry callback.
struct ShutsDown {
    purgatory: Arc<std::sync::OnceLock<Purgatory<u32, ShutsDown>>>,
    answered: Arc<std::sync::atomic::AtomicUsize>,
}

impl purgatory::DelayedOperation for ShutsDown {
    fn timeout(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {
        self.answered.fetch_add(1, SeqCst);
        if let Some(purgatory) = self.purgatory.get() {
            purgatory.shutdown();
        }
    }
}

#[test]
fn a_shutdown_from_inside_an_expiry_callback_does_not_hang() {
    for executor in [
        purgatory::Executor::Inline,
        purgatory::Executor::pool(1).unwrap(),
    ] {
        let cell = Arc::new(std::sync::OnceLock::new());
        let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let purgatory: Purgatory<u32, ShutsDown> = PurgatoryBuilder::new()
            .name("self-shutdown")
            .timer(TimerBuilder::new().executor(executor))
            .build()
            .unwrap();
        cell.set(purgatory.clone()).ok().unwrap();
        for key in 0..3 {
            let op = ShutsDown {
                purgatory: Arc::clone(&cell),
                answered: Arc::clone(&answered),
            };
            assert!(!purgatory.try_complete_else_watch(op, [key]).unwrap());
        }
        assert!(
            wait_until(Duration::from_secs(10), || purgatory.is_shutdown()
                && answered.load(SeqCst) == 3),
            "every operation is answered and the purgatory is shut down"
        );
        // Another caller's shutdown returns (the callback's did the work).
        purgatory.shutdown();
        assert_eq!(answered.load(SeqCst), 3);
    }
}

/// Shutdown drops the lists' keys; one whose `Drop` panics is caught and counted (it used
/// to reach the caller that shut down), and a concurrent shutdown returns too.
#[test]
fn a_key_drop_that_panics_at_shutdown_is_caught_and_every_caller_returns() {
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let purgatory: Purgatory<DropBomb, Counted> =
        PurgatoryBuilder::new().name("drop-bomb").build().unwrap();
    let (key, armed) = DropBomb::armed(1);
    armed.store(false, SeqCst);
    let op = Counted {
        answered: Arc::clone(&answered),
    };
    assert!(!purgatory.try_complete_else_watch(op, [key]).unwrap());
    armed.store(true, SeqCst);
    // Two callers at once: whichever shuts down meets the key's panic, caught; neither
    // waits forever.
    let callers: Vec<_> = (0..2)
        .map(|_| {
            let purgatory = purgatory.clone();
            std::thread::spawn(move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| purgatory.shutdown()))
                    .is_err()
            })
        })
        .collect();
    let panicked: Vec<bool> = callers
        .into_iter()
        .map(|caller| caller.join().expect("every shutdown call returns"))
        .collect();
    assert_eq!(panicked, [false, false], "the key's panic is caught");
    assert!(!armed.load(SeqCst), "the key was dropped");
    assert_eq!(purgatory.stats().panicked, 1);
    assert_eq!(answered.load(SeqCst), 1, "the operation was answered");
    purgatory.shutdown();
}

/// Records its answer; the first one's `on_complete` blocks 300 ms.
struct SlowFirst {
    id: usize,
    answered: Arc<std::sync::Mutex<Vec<(usize, Instant)>>>,
    entered: Option<std::sync::mpsc::Sender<()>>,
}

impl DelayedOperation for SlowFirst {
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {
        if let Some(entered) = self.entered.take() {
            let _ = entered.send(());
            std::thread::sleep(Duration::from_millis(300));
        }
        self.answered
            .lock()
            .unwrap()
            .push((self.id, Instant::now()));
    }
}

/// Operations a force took out of their slots before shutdown began are answered before
/// shutdown returns, even while the force is still running the first one's callback
/// (a review found the second answered after shutdown returned).
#[test]
fn shutdown_waits_for_the_answers_of_operations_a_force_took_before_it_began() {
    let purgatory: Purgatory<u32, SlowFirst> = Purgatory::new("forced-then-shut");
    let answered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..3)
        .map(|id| {
            let op = SlowFirst {
                id,
                answered: Arc::clone(&answered),
                entered: (id == 0).then(|| entered_tx.clone()),
            };
            match purgatory.watch(op, [id as u32]).unwrap() {
                WatchOutcome::Pending(handle) => handle,
                WatchOutcome::Completed => panic!("never ready"),
            }
        })
        .collect();
    let forcer = {
        let purgatory = purgatory.clone();
        std::thread::spawn(move || purgatory.force_complete_batch(&handles))
    };
    entered.recv().unwrap();
    purgatory.shutdown();
    let returned = Instant::now();
    let answered_by_then = answered.lock().unwrap().clone();
    assert_eq!(
        answered_by_then.len(),
        3,
        "answered when shutdown returned: {:?}",
        answered_by_then
            .iter()
            .map(|(id, _)| id)
            .collect::<Vec<_>>()
    );
    assert!(answered_by_then.iter().all(|(_, at)| *at <= returned));
    assert_eq!(forcer.join().unwrap(), 3);
}

/// A weak handle (a task feeding the purgatory events) never keeps the purgatory alive:
/// the last strong handle's drop shuts it down, answering what was pending, and the weak
/// one then upgrades to nothing (issue #28, from the axum example's author).
#[test]
fn a_weak_handle_does_not_keep_the_purgatory_alive() {
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("weak");
    let weak = purgatory.downgrade();
    let ledger = Ledger::new(1);
    let no = never();
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(0, LONG, &ledger, &no), ["a"])
        .unwrap());
    // Upgraded while alive: a handle like any other, whose drop is not the last.
    let feeder = weak.upgrade().expect("alive");
    assert_eq!(feeder.check_and_complete("a"), 0);
    drop(feeder);
    assert!(!purgatory.is_shutdown());
    let kept = weak.clone();
    within(Duration::from_secs(10), "last drop", move || {
        drop(purgatory)
    });
    assert_eq!(ledger.how(0), Some(Completion::Shutdown));
    assert!(weak.upgrade().is_none() && kept.upgrade().is_none());
    assert!(format!("{weak:?}").contains("alive: false"));
    assert_eq!(ledger.violations(), 0);
}

/// Feeders that upgrade a weak handle again and again, each holding the handle for a
/// watch and a check, never keep the purgatory up: the last owner's drop shuts it down
/// while their handles are in use (from a review: with upgraded handles as owners, busy
/// feeders kept it alive for as long as they ran, accepting new operations). Every
/// operation accepted is answered once; the feeders' later watches are refused.
#[test]
fn busy_feeders_with_weak_handles_do_not_hold_the_shutdown_back() {
    const FEEDERS: usize = 3;
    const OPS: usize = 200_000;
    const ACCEPTED: u8 = 1;
    const REFUSED: u8 = 2;
    let purgatory: Purgatory<u32, Probe> = Purgatory::new("weak-feeders");
    let ledger = Arc::new(Ledger::new(OPS));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let fate: Arc<Vec<std::sync::atomic::AtomicU8>> = Arc::new(
        (0..OPS)
            .map(|_| std::sync::atomic::AtomicU8::new(0))
            .collect(),
    );
    let feeders: Vec<_> = (0..FEEDERS)
        .map(|f| {
            let (weak, ledger, next, fate) = (
                purgatory.downgrade(),
                Arc::clone(&ledger),
                Arc::clone(&next),
                Arc::clone(&fate),
            );
            std::thread::spawn(move || {
                let no = never();
                while let Some(handle) = weak.upgrade() {
                    let id = next.fetch_add(1, SeqCst);
                    if id >= OPS {
                        return;
                    }
                    let key = (id % 64) as u32 + f as u32;
                    let op = Probe::new(id, LONG, &ledger, &no);
                    let outcome = match handle.try_complete_else_watch(op, [key]) {
                        Ok(_) => ACCEPTED,
                        Err(_) => REFUSED,
                    };
                    fate[id].store(outcome, SeqCst);
                    handle.check_and_complete(&key);
                }
            })
        })
        .collect();
    while next.load(SeqCst) < 1_000 {
        std::thread::yield_now();
    }
    within(Duration::from_secs(10), "the owner's drop", move || {
        drop(purgatory)
    });
    for feeder in feeders {
        feeder.join().unwrap();
    }
    let drawn = next.load(SeqCst);
    assert!(
        drawn < OPS,
        "the feeders ran out of work: the shutdown never stopped them"
    );
    let (mut accepted, mut refused) = (0, 0);
    for id in 0..drawn.min(OPS) {
        match fate[id].load(SeqCst) {
            ACCEPTED => {
                accepted += 1;
                assert_eq!(
                    ledger.completions(id),
                    1,
                    "op {id}: accepted, answered once"
                );
                assert_eq!(ledger.how(id), Some(Completion::Shutdown), "op {id}");
            }
            REFUSED => {
                refused += 1;
                assert_eq!(
                    ledger.completions(id),
                    0,
                    "op {id}: refused, never answered"
                );
            }
            other => panic!("op {id}: drawn but never watched ({other})"),
        }
    }
    assert!(accepted >= 1_000, "{accepted} accepted");
    assert!(
        refused <= FEEDERS * 2,
        "{refused} refused: at most a watch or two each"
    );
    assert_eq!(ledger.violations(), 0);
}
