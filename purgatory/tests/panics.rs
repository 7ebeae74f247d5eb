//! User panics are contained: a panicking `try_complete` counts as "not ready", a
//! panicking `on_complete` still counts as a completion, both are counted in
//! `stats().panicked`, and neither kills the reaper nor poisons the purgatory: other
//! operations (on the same and other keys) go on being completed and expired.

mod probe;

use std::sync::Arc;
use std::time::Duration;

use probe::{flags, never, wait_until, Ledger, Probe, Readiness};
use purgatory::{Completion, Purgatory, WatchOutcome};

const LONG: Duration = Duration::from_secs(200);

#[test]
fn a_panicking_try_complete_counts_as_not_ready_and_harms_nobody_else() {
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("panicky-try");
    let ledger = Ledger::new(2);
    let panicky: Readiness = Arc::new(|id, _| panic!("try_complete of {id} panics (on purpose)"));
    let (ready, readiness) = flags(2);

    let WatchOutcome::Pending(handle) = purgatory
        .watch(Probe::new(0, LONG, &ledger, &panicky), ["shared"])
        .unwrap()
    else {
        panic!("a panicking try_complete is not a completion");
    };
    let after_watch = purgatory.stats().panicked;
    assert!(after_watch >= 1, "the watch's try panicked");
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(1, LONG, &ledger, &readiness), ["shared"])
        .unwrap());

    // An event on the shared key: the panicking op is not completed, the other one is.
    ready[1].store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(purgatory.check_and_complete(&"shared"), 1);
    assert_eq!(purgatory.stats().panicked, after_watch + 1);
    assert_eq!(ledger.how(1), Some(Completion::Ready));
    assert!(!ledger.is_completed(0));

    // Not poisoned: the op can still be forced, and the key checked again.
    assert!(purgatory.force_complete(&handle));
    assert_eq!(ledger.how(0), Some(Completion::Forced));
    assert_eq!(purgatory.check_and_complete(&"shared"), 0);
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (0, 0, 0));
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn a_panicking_on_complete_still_completes_and_the_reaper_survives_it() {
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("panicky-complete");
    let ledger = Ledger::new(4);
    let no = never();
    let (ready, readiness) = flags(4);

    // Completed by an event on the caller's thread: on_complete panics, the call returns.
    assert!(!purgatory
        .try_complete_else_watch(
            Probe::new(0, LONG, &ledger, &readiness).panicking_on_complete(),
            ["event"]
        )
        .unwrap());
    ready[0].store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(purgatory.check_and_complete(&"event"), 1);
    assert_eq!(ledger.how(0), Some(Completion::Ready));
    assert_eq!(purgatory.stats().panicked, 1);

    // Expired on the reaper: on_complete panics there; on_expiration still follows.
    assert!(!purgatory
        .try_complete_else_watch(
            Probe::new(1, Duration::from_millis(5), &ledger, &no).panicking_on_complete(),
            ["timeout"]
        )
        .unwrap());
    assert!(wait_until(Duration::from_secs(10), || ledger
        .expirations(1)
        == 1));
    assert_eq!(ledger.how(1), Some(Completion::Expired));
    assert!(wait_until(Duration::from_secs(10), || purgatory
        .stats()
        .panicked
        == 2));

    // The reaper lives on: later timeouts still expire.
    for id in 2..4 {
        assert!(!purgatory
            .try_complete_else_watch(
                Probe::new(id, Duration::from_millis(5), &ledger, &no),
                ["later"]
            )
            .unwrap());
    }
    assert!(
        wait_until(Duration::from_secs(10), || ledger.expirations(2) == 1
            && ledger.expirations(3) == 1),
        "the reaper stopped expiring after a panic"
    );
    let stats = purgatory.stats();
    assert_eq!(stats.expired, 3);
    assert_eq!(stats.completed, 1);
    assert_eq!(stats.panicked, 2);
    assert_eq!(stats.pending, 0);
    for id in 0..4 {
        assert_eq!(ledger.completions(id), 1);
        assert_eq!(ledger.drops(id), 1, "a panicking op is still dropped");
    }
    assert_eq!(ledger.violations(), 0);
}
