//! Kafka's purgatory test sequences (request satisfaction, purge accounting, cancel for a
//! key), replayed step by step through the public API and checked after every step.
//!
//! Every purgatory here runs with long timeouts and a purge interval far above the number
//! of completed entries, so neither the timer nor a background purge changes what the
//! steps observe.

mod probe;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use probe::{flags, never, Ledger, Probe};
use purgatory::{Completion, Purgatory, PurgatoryBuilder, WatchOutcome};

const LONG: Duration = Duration::from_secs(200);

fn quiet_purgatory() -> Purgatory<&'static str, Probe> {
    PurgatoryBuilder::new()
        .name("kafka-sequences")
        .purge_interval(1_000_000)
        .build()
        .expect("valid configuration")
}

#[test]
fn request_satisfaction_completes_each_operation_once_when_it_becomes_ready() {
    let purgatory = quiet_purgatory();
    let ledger = Ledger::new(2);
    let (ready, readiness) = flags(2);

    assert_eq!(purgatory.check_and_complete(&"test1"), 0, "unknown key");
    let r1 = Probe::new(0, LONG, &ledger, &readiness);
    assert!(!purgatory.try_complete_else_watch(r1, ["test1"]).unwrap());
    assert_eq!(purgatory.check_and_complete(&"test1"), 0, "r1 is not ready");

    let r2 = Probe::new(1, LONG, &ledger, &readiness);
    assert!(!purgatory.try_complete_else_watch(r2, ["test2"]).unwrap());
    assert_eq!(purgatory.check_and_complete(&"test2"), 0, "r2 is not ready");
    assert_eq!(purgatory.stats().pending, 2);

    ready[0].store(true, SeqCst);
    assert_eq!(purgatory.check_and_complete(&"test1"), 1, "r1 became ready");
    assert_eq!(
        purgatory.check_and_complete(&"test1"),
        0,
        "r1 is already done"
    );
    assert_eq!(ledger.how(0), Some(Completion::Ready));
    assert!(
        !ledger.is_completed(1),
        "an event on test1 does not touch r2"
    );

    ready[1].store(true, SeqCst);
    assert_eq!(purgatory.check_and_complete(&"test2"), 1, "r2 became ready");
    assert_eq!(
        purgatory.check_and_complete(&"test2"),
        0,
        "r2 is already done"
    );
    assert_eq!(ledger.how(1), Some(Completion::Ready));

    for id in 0..2 {
        assert_eq!(ledger.completions(id), 1);
        assert_eq!(ledger.expirations(id), 0);
        assert_eq!(ledger.drops(id), 1, "dropped right after on_complete");
    }
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (0, 0, 0));
    assert_eq!(stats.completed, 2);
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn completed_entries_are_dropped_by_checks_of_each_of_their_keys() {
    let purgatory = quiet_purgatory();
    let ledger = Ledger::new(3);
    let no = never();

    let r1 = Probe::new(0, LONG, &ledger, &no);
    let r2 = Probe::new(1, LONG, &ledger, &no);
    let r3 = Probe::new(2, LONG, &ledger, &no);
    assert!(!purgatory.try_complete_else_watch(r1, ["k1"]).unwrap());
    let WatchOutcome::Pending(h2) = purgatory.watch(r2, ["k1", "k2"]).unwrap() else {
        panic!("r2 is not ready, it must wait");
    };
    let WatchOutcome::Pending(h3) = purgatory.watch(r3, ["k1", "k2", "k3"]).unwrap() else {
        panic!("r3 is not ready, it must wait");
    };
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (3, 6, 3));
    assert_eq!(stats.watched_live, 6);

    assert!(purgatory.force_complete(&h2));
    assert!(purgatory.force_complete(&h3));
    assert!(
        !purgatory.force_complete(&h3),
        "a second force does nothing"
    );
    assert!(purgatory.is_completed(&h2) && purgatory.is_completed(&h3));
    assert_eq!(ledger.how(1), Some(Completion::Forced));
    assert_eq!(ledger.how(2), Some(Completion::Forced));
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 1, "only r1 still has a timer");
    assert_eq!(
        stats.watched, 6,
        "completed entries stay listed until checked or purged"
    );
    assert_eq!(stats.watched_live, 1, "r1's entry alone is live");
    assert_eq!(stats.forced, 2);
    assert_eq!(
        ledger.drops(1) + ledger.drops(2),
        2,
        "payloads freed at completion"
    );

    assert_eq!(purgatory.check_and_complete(&"k1"), 0);
    assert_eq!(purgatory.stats().watched, 4, "k1 keeps only r1");
    assert_eq!(purgatory.check_and_complete(&"k2"), 0);
    let stats = purgatory.stats();
    assert_eq!(stats.watched, 2);
    assert_eq!(stats.keys, 2, "k2's list emptied, so k2 is gone");
    assert_eq!(purgatory.check_and_complete(&"k3"), 0);
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.keys, stats.pending), (1, 1, 1));
    assert_eq!(stats.watched_live, 1);
    assert_eq!(stats.purged, 0, "checks, not purges, dropped them");
    assert!(!ledger.is_completed(0));
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn cancel_for_key_hands_back_its_operations_and_leaves_the_others_watched() {
    let purgatory = quiet_purgatory();
    let ledger = Ledger::new(3);
    let no = never();
    let (ready, readiness) = flags(3);

    assert!(!purgatory
        .try_complete_else_watch(Probe::new(0, LONG, &ledger, &no), ["a"])
        .unwrap());
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(1, LONG, &ledger, &no), ["a", "b"])
        .unwrap());
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(2, LONG, &ledger, &readiness), ["b"])
        .unwrap());

    let mut cancelled: Vec<usize> = purgatory
        .cancel_for_key(&"a")
        .iter()
        .map(|op| op.id)
        .collect();
    cancelled.sort_unstable();
    assert_eq!(cancelled, [0, 1]);
    assert_eq!(
        ledger.drops(0) + ledger.drops(1),
        2,
        "we dropped the returned ops"
    );
    for id in [0, 1] {
        assert_eq!(ledger.completions(id), 0, "a cancelled op is not completed");
    }
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 1, "cancelled ops' timers are disarmed");
    assert_eq!(stats.cancelled, 2);

    assert!(purgatory.cancel_for_key(&"a").is_empty(), "a is gone");
    assert!(
        purgatory.cancel_for_key(&"nobody").is_empty(),
        "unknown key"
    );

    // The op on "b" is still watched there and completes on its event; the cancelled
    // op's stale entry on "b" goes with that check.
    ready[2].store(true, SeqCst);
    assert_eq!(purgatory.check_and_complete(&"b"), 1);
    assert_eq!(ledger.how(2), Some(Completion::Ready));
    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.watched, stats.keys), (0, 0, 0));
    assert_eq!(ledger.completions(0) + ledger.completions(1), 0);
    assert_eq!(ledger.violations(), 0);
}
