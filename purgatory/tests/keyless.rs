//! `Purgatory::watch_keyless` (issue #37): an operation on no key, answered by its
//! timeout, a force or shutdown, or taken back by a cancel or a guard, exactly once; it
//! costs no watcher entry, and checks, cancels by key and purges never see it. One test
//! per row of the call table's entry (`docs/purgatory.md`, "Using the purgatory").

mod probe;

use std::sync::atomic::Ordering::Release;
use std::time::Duration;

use probe::{flags, manual_purgatory, never, Ledger, Probe};
use purgatory::{Completion, ManualClock, OperationHandle, Purgatory, WatchError, WatchOutcome};

fn pending<O>(watched: WatchOutcome<O>) -> OperationHandle<O> {
    match watched {
        WatchOutcome::Pending(handle) => handle,
        WatchOutcome::Completed => panic!("a never-ready operation must wait"),
    }
}

/// A purgatory on a manual clock, and a keyless operation `id` waiting in it.
fn one_waiting(
    clock: &ManualClock,
    ledger: &std::sync::Arc<Ledger>,
    timeout: Duration,
) -> (Purgatory<u32, Probe>, OperationHandle<Probe>) {
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(clock);
    let op = Probe::new(0, timeout, ledger, &never());
    let handle = pending(purgatory.watch_keyless(op).unwrap());
    (purgatory, handle)
}

fn expire_all(clock: &ManualClock, purgatory: &Purgatory<u32, Probe>, by: Duration) {
    clock.advance(by);
    purgatory.advance_clock(Duration::ZERO);
}

#[test]
fn it_is_tried_once_then_expires_on_its_timeout_with_no_watcher_entry() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, Duration::from_millis(10));
    assert_eq!(
        ledger.tries(0),
        1,
        "tried once, at the watch, and not again"
    );
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.keys, stats.pending), (0, 0, 1));
    expire_all(&clock, &purgatory, Duration::from_millis(5));
    assert!(!purgatory.is_completed(&handle), "not before its timeout");
    expire_all(&clock, &purgatory, Duration::from_millis(10));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!(ledger.expirations(0), 1);
    assert_eq!(ledger.completions(0), 1);
    assert!(purgatory.is_completed(&handle));
    assert_eq!(purgatory.stats().expired, 1);
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn ready_at_once_it_completes_in_the_call() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (ready, readiness) = flags(1);
    ready[0].store(true, Release);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let op = Probe::new(0, Duration::from_secs(60), &ledger, &readiness);
    assert!(matches!(
        purgatory.watch_keyless(op),
        Ok(WatchOutcome::Completed)
    ));
    assert_eq!(ledger.how(0), Some(Completion::Ready));
    assert_eq!((purgatory.pending(), purgatory.stats().completed), (0, 1));
}

#[test]
fn a_force_answers_it_once_and_disarms_its_timeout() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, Duration::from_millis(10));
    assert!(purgatory.force_complete(&handle));
    assert!(!purgatory.force_complete(&handle), "answered once");
    assert_eq!(ledger.how(0), Some(Completion::Forced));
    assert_eq!(purgatory.pending(), 0, "its timeout disarmed");
    expire_all(&clock, &purgatory, Duration::from_millis(20));
    assert_eq!(ledger.completions(0), 1);
    assert_eq!(ledger.expirations(0), 0);
}

#[test]
fn a_cancel_hands_it_back_and_it_never_expires() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, Duration::from_millis(10));
    let back = purgatory.cancel(&handle).expect("it waits");
    assert_eq!(back.id, 0);
    assert!(purgatory.cancel(&handle).is_none(), "taken back once");
    expire_all(&clock, &purgatory, Duration::from_millis(20));
    assert_eq!(ledger.completions(0), 0, "a cancel runs no callback");
    assert_eq!(purgatory.stats().cancelled, 1);
}

#[test]
fn a_guard_dropped_cancels_it() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, Duration::from_millis(10));
    drop(purgatory.cancel_on_drop(handle));
    assert_eq!(ledger.drops(0), 1, "dropped with the guard");
    assert_eq!(purgatory.pending(), 0);
    expire_all(&clock, &purgatory, Duration::from_millis(20));
    assert_eq!(ledger.completions(0), 0);
}

#[test]
fn shutdown_answers_it() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (purgatory, handle) = one_waiting(&clock, &ledger, Duration::from_secs(60));
    purgatory.shutdown();
    assert_eq!(ledger.how(0), Some(Completion::Shutdown));
    assert!(purgatory.is_completed(&handle));
    assert_eq!(purgatory.stats().expired_at_shutdown, 1);
}

#[test]
fn refused_as_a_watch_is_but_never_for_its_keys() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(3);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    // A keyed watch on no key is still refused: a list left empty by mistake.
    let op = Probe::new(0, Duration::from_secs(1), &ledger, &never());
    assert!(matches!(
        purgatory.watch(op, []),
        Err(WatchError::NoKeys(_))
    ));
    purgatory.shutdown();
    let op = Probe::new(2, Duration::from_secs(1), &ledger, &never());
    match purgatory.watch_keyless(op) {
        Err(WatchError::Shutdown(op)) => assert_eq!(op.id, 2, "given back"),
        _ => panic!("refused after shutdown"),
    }
    assert_eq!(ledger.total_completions(), 0);
    assert_eq!(purgatory.stats().refused, 2);
}

#[test]
fn checks_cancels_by_key_and_purges_never_see_it() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let (ready, readiness) = flags(2);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let keyless = pending(
        purgatory
            .watch_keyless(Probe::new(0, Duration::from_secs(60), &ledger, &readiness))
            .unwrap(),
    );
    let keyed = pending(
        purgatory
            .watch(
                Probe::new(1, Duration::from_secs(60), &ledger, &readiness),
                [7],
            )
            .unwrap(),
    );
    ready[0].store(true, Release);
    ready[1].store(true, Release);
    assert_eq!(purgatory.check_and_complete(&7), 1, "the keyed one only");
    assert!(purgatory.is_completed(&keyed));
    assert_eq!(ledger.tries(0), 1, "no check tried the keyless one");
    assert!(purgatory.cancel_for_key(&7).is_empty());
    assert!(purgatory.cancel_for_key(&0).is_empty());
    purgatory.purge();
    assert!(!purgatory.is_completed(&keyless));
    assert_eq!(purgatory.pending(), 1);
    // Its answer comes only by its handle (or timeout, or shutdown).
    assert!(purgatory.force_complete(&keyless));
    assert_eq!(ledger.how(0), Some(Completion::Forced));
}
