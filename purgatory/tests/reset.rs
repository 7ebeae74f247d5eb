//! `Purgatory::reset_timeout` (issue #37): a waiting operation's deadline moved, by its
//! handle, in O(1). The operation then expires at the new deadline and never at the old
//! one, unless an event, a force, a cancel or shutdown answers it first; a reset that
//! comes too late (answered, taken back, timed out, shut down, a stale or foreign handle)
//! moves nothing and says so. One test per row of the call table's entry
//! (`docs/purgatory.md`, "Using the purgatory"); the races are the loom models'
//! (`tests/loom.rs`) and the ledger's (`tests/ledger.rs`).

mod probe;

use std::sync::atomic::Ordering::Release;
use std::sync::Arc;
use std::time::Duration;

use probe::{flags, manual_purgatory, never, Ledger, Probe};
use purgatory::{
    Completion, DelayedOperation, ManualClock, OperationHandle, Purgatory, WatchOutcome,
};

fn pending<O>(watched: WatchOutcome<O>) -> OperationHandle<O> {
    match watched {
        WatchOutcome::Pending(handle) => handle,
        WatchOutcome::Completed => panic!("a never-ready operation must wait"),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn move_clock(clock: &ManualClock, purgatory: &Purgatory<u32, Probe>, by: Duration) {
    clock.advance(by);
    purgatory.advance_clock(Duration::ZERO);
}

/// A purgatory on a manual clock and operation 0 waiting on key 1 with `timeout`.
fn one_waiting(
    clock: &ManualClock,
    ledger: &Arc<Ledger>,
    timeout: Duration,
) -> (Purgatory<u32, Probe>, OperationHandle<Probe>) {
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(clock);
    let op = Probe::new(0, timeout, ledger, &never());
    let handle = pending(purgatory.watch(op, [1]).unwrap());
    (purgatory, handle)
}

#[test]
fn a_later_deadline_replaces_the_old_one() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(50));
    move_clock(&clock, &purgatory, ms(40));
    assert!(purgatory.reset_timeout(&handle, ms(100)));
    move_clock(&clock, &purgatory, ms(30));
    assert!(
        !purgatory.is_completed(&handle),
        "the old deadline (50 ms) fired nothing"
    );
    move_clock(&clock, &purgatory, ms(69));
    assert!(!purgatory.is_completed(&handle), "not before 140 ms");
    move_clock(&clock, &purgatory, ms(1));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!((ledger.completions(0), ledger.expirations(0)), (1, 1));
    assert_eq!(purgatory.stats().expired, 1);
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn an_earlier_deadline_replaces_the_old_one() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, Duration::from_secs(3_600));
    assert!(purgatory.reset_timeout(&handle, ms(10)));
    move_clock(&clock, &purgatory, ms(9));
    assert!(!purgatory.is_completed(&handle), "never early");
    move_clock(&clock, &purgatory, ms(1));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!(purgatory.pending(), 0);
}

#[test]
fn a_zero_timeout_expires_it_at_the_next_tick() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(500));
    assert!(purgatory.reset_timeout(&handle, Duration::ZERO));
    assert!(
        !purgatory.is_completed(&handle),
        "not on the caller's thread: the reaper's next round answers it"
    );
    move_clock(&clock, &purgatory, ms(1));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
}

#[test]
fn a_huge_timeout_is_clamped_and_the_operation_still_answered_at_shutdown() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(10));
    assert!(purgatory.reset_timeout(&handle, Duration::MAX));
    move_clock(&clock, &purgatory, Duration::from_secs(86_400 * 365));
    assert!(!purgatory.is_completed(&handle));
    purgatory.shutdown();
    assert_eq!(ledger.how(0), Some(Completion::Shutdown));
    assert_eq!(ledger.completions(0), 1);
}

#[test]
fn an_event_after_a_reset_completes_it_once_and_neither_deadline_fires() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (ready, readiness) = flags(1);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let op = Probe::new(0, ms(50), &ledger, &readiness);
    let handle = pending(purgatory.watch(op, [1]).unwrap());
    assert!(purgatory.reset_timeout(&handle, ms(200)));
    ready[0].store(true, Release);
    assert_eq!(purgatory.check_and_complete(&1), 1);
    move_clock(&clock, &purgatory, ms(300));
    assert_eq!(ledger.how(0), Some(Completion::Ready));
    assert_eq!((ledger.completions(0), ledger.expirations(0)), (1, 0));
    assert!(
        !purgatory.reset_timeout(&handle, ms(10)),
        "answered: nothing to move"
    );
}

#[test]
fn a_force_after_a_reset_answers_it_once() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(50));
    assert!(purgatory.reset_timeout(&handle, ms(10)));
    assert!(purgatory.force_complete(&handle));
    move_clock(&clock, &purgatory, ms(100));
    assert_eq!(ledger.how(0), Some(Completion::Forced));
    assert_eq!(ledger.completions(0), 1);
    assert!(!purgatory.reset_timeout(&handle, ms(10)));
}

#[test]
fn a_cancel_after_a_reset_takes_it_back_uncompleted() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(50));
    assert!(purgatory.reset_timeout(&handle, ms(10)));
    let op = purgatory.cancel(&handle).expect("still waiting");
    move_clock(&clock, &purgatory, ms(100));
    assert_eq!(ledger.completions(0), 0, "taken back: nothing answered it");
    assert!(!purgatory.reset_timeout(&handle, ms(10)));
    assert_eq!(purgatory.pending(), 0);
    drop(op);
}

#[test]
fn after_its_timeout_fired_a_reset_moves_nothing() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(10));
    move_clock(&clock, &purgatory, ms(10));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert!(!purgatory.reset_timeout(&handle, Duration::from_secs(60)));
    assert_eq!(ledger.completions(0), 1);
}

#[test]
fn a_passed_deadline_no_round_reached_yet_can_still_be_moved() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(10));
    clock.advance(ms(30));
    assert!(
        purgatory.reset_timeout(&handle, ms(10)),
        "until a round takes it out of the timer, it waits"
    );
    purgatory.advance_clock(Duration::ZERO);
    assert!(!purgatory.is_completed(&handle), "due at 40 ms now, not 10");
    move_clock(&clock, &purgatory, ms(10));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
}

#[test]
fn after_shutdown_a_reset_moves_nothing_and_the_answer_stands() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, ms(50));
    assert!(purgatory.reset_timeout(&handle, ms(100)));
    purgatory.shutdown();
    assert_eq!(ledger.how(0), Some(Completion::Shutdown));
    assert!(!purgatory.reset_timeout(&handle, ms(100)));
    assert_eq!(ledger.completions(0), 1);
}

#[test]
fn a_stale_handle_never_moves_the_slots_next_occupant() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let (purgatory, first) = one_waiting(&clock, &ledger, ms(50));
    assert!(purgatory.force_complete(&first));
    // The freed slot is the next one handed out.
    let second = pending(
        purgatory
            .watch(Probe::new(1, ms(50), &ledger, &never()), [2])
            .unwrap(),
    );
    assert!(!purgatory.reset_timeout(&first, Duration::from_secs(3_600)));
    move_clock(&clock, &purgatory, ms(50));
    assert_eq!(
        ledger.how(1),
        Some(Completion::Expired),
        "the occupant kept its own deadline"
    );
    assert!(purgatory.is_completed(&second));
}

#[test]
fn a_handle_of_another_purgatory_moves_nothing() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let (a, from_a) = one_waiting(&clock, &ledger, ms(50));
    let b: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let _from_b = pending(
        b.watch(Probe::new(1, ms(50), &ledger, &never()), [1])
            .unwrap(),
    );
    assert!(!b.reset_timeout(&from_a, Duration::from_secs(3_600)));
    move_clock(&clock, &a, ms(50));
    move_clock(&clock, &b, Duration::ZERO);
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!(ledger.how(1), Some(Completion::Expired));
}

#[test]
fn a_keyless_session_kept_alive_by_heartbeats_expires_once_they_stop() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let session = pending(
        purgatory
            .watch_keyless(Probe::new(0, ms(100), &ledger, &never()))
            .unwrap(),
    );
    for _ in 0..50 {
        move_clock(&clock, &purgatory, ms(60));
        assert!(purgatory.reset_timeout(&session, ms(100)), "heartbeat");
    }
    assert_eq!(ledger.completions(0), 0, "3 s of heartbeats every 60 ms");
    let stats = purgatory.stats();
    assert_eq!(
        (stats.watched, stats.pending),
        (0, 1),
        "no entry, one timer"
    );
    move_clock(&clock, &purgatory, ms(99));
    assert_eq!(ledger.completions(0), 0);
    move_clock(&clock, &purgatory, ms(1));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
}

/// The reaper sleeps toward its next deadline, at most `REAPER_WAIT` (200 ms) while
/// anything is pending; a reset to an earlier deadline wakes it. Best of three trials (a
/// shared machine), each on a fresh purgatory: answered within 100 ms of a reset to 5 ms
/// (without the wake, about 190 ms).
#[test]
fn a_reset_to_an_earlier_deadline_wakes_the_sleeping_reaper() {
    let mut fastest = Duration::MAX;
    for _ in 0..3 {
        let ledger = Ledger::new(1);
        let purgatory: Purgatory<u32, Probe> = Purgatory::new("reset-wakes");
        let handle = pending(
            purgatory
                .watch(
                    Probe::new(0, Duration::from_secs(3_600), &ledger, &never()),
                    [1],
                )
                .unwrap(),
        );
        std::thread::sleep(ms(10));
        let reset_at = std::time::Instant::now();
        assert!(purgatory.reset_timeout(&handle, ms(5)));
        assert!(
            probe::wait_until(Duration::from_secs(10), || ledger.is_completed(0)),
            "never answered"
        );
        fastest = fastest.min(reset_at.elapsed());
        assert_eq!(ledger.how(0), Some(Completion::Expired));
        if fastest < ms(100) {
            return;
        }
    }
    panic!("answered {fastest:?} after a reset to 5 ms at best: the reaper kept sleeping");
}

/// An operation whose completion resets another's timeout: callbacks may call any
/// method, `reset_timeout` included.
struct Resetter {
    purgatory: Purgatory<u32, Resetter>,
    target: Option<OperationHandle<Resetter>>,
    moved: Arc<std::sync::Mutex<Option<bool>>>,
    answered: Arc<std::sync::Mutex<Vec<(u32, Completion)>>>,
    id: u32,
    timeout: Duration,
}

impl DelayedOperation for Resetter {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        false
    }

    fn on_complete(&mut self, how: Completion) {
        self.answered.lock().unwrap().push((self.id, how));
        if let Some(target) = self.target.take() {
            *self.moved.lock().unwrap() = Some(self.purgatory.reset_timeout(&target, ms(500)));
        }
    }
}

#[test]
fn a_callback_may_reset_another_operations_timeout() {
    let clock = ManualClock::new();
    let purgatory: Purgatory<u32, Resetter> = manual_purgatory(&clock);
    let moved = Arc::new(std::sync::Mutex::new(None));
    let answered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let make = |id, timeout, target| Resetter {
        purgatory: purgatory.clone(),
        target,
        moved: Arc::clone(&moved),
        answered: Arc::clone(&answered),
        id,
        timeout,
    };
    let session = pending(purgatory.watch_keyless(make(0, ms(100), None)).unwrap());
    let _trigger = pending(
        purgatory
            .watch_keyless(make(1, ms(50), Some(session)))
            .unwrap(),
    );
    clock.advance(ms(50));
    purgatory.advance_clock(Duration::ZERO);
    assert_eq!(*moved.lock().unwrap(), Some(true));
    clock.advance(ms(499));
    purgatory.advance_clock(Duration::ZERO);
    assert_eq!(
        answered.lock().unwrap().as_slice(),
        &[(1, Completion::Expired)],
        "the session's deadline is 550 ms now, not 100"
    );
    clock.advance(ms(1));
    purgatory.advance_clock(Duration::ZERO);
    assert_eq!(answered.lock().unwrap().len(), 2);
    purgatory.shutdown();
}

#[test]
fn once_shutdown_has_begun_a_reset_moves_nothing_though_the_drain_is_still_to_come() {
    // The reaper is held 1 s in an expiry callback, so a shutdown from another thread
    // closes the purgatory and then waits for that round before it drains the timer.
    let ledger = Ledger::new(2);
    let purgatory: Purgatory<u32, Probe> = purgatory::PurgatoryBuilder::new()
        .timer(purgatory::TimerBuilder::new().stand_in(None))
        .build()
        .unwrap();
    let stalling = Probe::new(0, ms(10), &ledger, &never()).stalling_on_expiration(ms(1_000));
    let _ = purgatory.watch_keyless(stalling).unwrap();
    let waiting = pending(
        purgatory
            .watch_keyless(Probe::new(1, Duration::from_secs(3_600), &ledger, &never()))
            .unwrap(),
    );
    assert!(probe::wait_until(Duration::from_secs(10), || ledger.is_completed(0)));
    let shutting = {
        let purgatory = purgatory.clone();
        std::thread::spawn(move || purgatory.shutdown())
    };
    assert!(probe::wait_until(Duration::from_secs(10), || purgatory.is_shutdown()));
    assert!(
        !purgatory.reset_timeout(&waiting, Duration::from_secs(7_200)),
        "moved after is_shutdown(): shutdown answers it, whatever its deadline"
    );
    shutting.join().unwrap();
    assert_eq!(ledger.how(1), Some(Completion::Shutdown));
    assert_eq!(ledger.completions(1), 1);
}
