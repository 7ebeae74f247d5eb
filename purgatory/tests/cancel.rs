//! `Purgatory::cancel`: one operation taken back by its handle, uncompleted, with its
//! timeout disarmed, exactly once against completion, force and expiry.

mod probe;

use std::time::Duration;

use probe::{flags, manual_purgatory, never, Ledger, Probe};
use purgatory::{ManualClock, Purgatory, WatchOutcome};

fn pending<O>(watched: WatchOutcome<O>) -> purgatory::OperationHandle<O> {
    match watched {
        WatchOutcome::Pending(handle) => handle,
        WatchOutcome::Completed => panic!("a never-ready operation must wait"),
    }
}

#[test]
fn cancel_hands_the_operation_back_and_it_never_expires() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let a = pending(
        purgatory
            .watch(
                Probe::new(0, Duration::from_millis(10), &ledger, &never()),
                [1, 2],
            )
            .unwrap(),
    );
    let _b = pending(
        purgatory
            .watch(
                Probe::new(1, Duration::from_millis(10), &ledger, &never()),
                [1],
            )
            .unwrap(),
    );
    let back = purgatory.cancel(&a).expect("a is waiting");
    assert_eq!(ledger.completions(0), 0, "a cancel runs no callback");
    assert!(purgatory.is_completed(&a));
    assert!(purgatory.cancel(&a).is_none(), "taken back once");
    assert!(
        !purgatory.force_complete(&a),
        "a cancelled handle forces nothing"
    );
    assert_eq!(purgatory.pending(), 1, "its timeout is disarmed at once");
    let stats = purgatory.stats();
    assert_eq!(stats.cancelled, 1);
    drop(back);
    assert_eq!(ledger.drops(0), 1, "the caller owned it and dropped it");
    clock.advance(Duration::from_millis(20));
    purgatory.advance_clock(Duration::ZERO);
    assert_eq!(
        ledger.completions(0),
        0,
        "a cancelled operation never expires"
    );
    assert_eq!(ledger.how(1), Some(purgatory::Completion::Expired));
    // Its stale entries go with the next check of their key.
    assert_eq!(purgatory.check_and_complete(&2), 0);
    assert_eq!(purgatory.check_and_complete(&1), 0);
    assert_eq!(purgatory.watched(), 0);
}

#[test]
fn cancel_after_completion_returns_none() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(1);
    let (ready, readiness) = flags(1);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let a = pending(
        purgatory
            .watch(
                Probe::new(0, Duration::from_secs(60), &ledger, &readiness),
                [7],
            )
            .unwrap(),
    );
    ready[0].store(true, std::sync::atomic::Ordering::Release);
    assert_eq!(purgatory.check_and_complete(&7), 1);
    assert!(purgatory.cancel(&a).is_none());
    assert_eq!(ledger.completions(0), 1);
    assert_eq!(purgatory.stats().cancelled, 0);
}

#[test]
fn a_handle_of_another_purgatory_cancels_nothing() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(2);
    let produce: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let fetch: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let a = pending(
        produce
            .watch(
                Probe::new(0, Duration::from_secs(60), &ledger, &never()),
                [1],
            )
            .unwrap(),
    );
    let _b = pending(
        fetch
            .watch(
                Probe::new(1, Duration::from_secs(60), &ledger, &never()),
                [1],
            )
            .unwrap(),
    );
    assert!(fetch.cancel(&a).is_none());
    assert_eq!(fetch.pending(), 1);
    assert!(produce.cancel(&a).is_some());
}

#[test]
fn a_dropped_guard_takes_its_waiting_operation_back_and_a_disarmed_one_does_not() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(3);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    let watch = |id| {
        pending(
            purgatory
                .watch(
                    Probe::new(id, Duration::from_millis(10), &ledger, &never()),
                    [id as u32],
                )
                .unwrap(),
        )
    };
    let (a, b, c) = (watch(0), watch(1), watch(2));
    // A request future holding the guard is dropped (its client left).
    let guard = purgatory.cancel_on_drop(a);
    assert!(!purgatory.is_completed(&guard.handle()));
    drop(guard);
    assert!(purgatory.is_completed(&a));
    assert_eq!(
        (ledger.completions(0), ledger.drops(0)),
        (0, 1),
        "freed, not answered"
    );
    // Disarmed: the operation goes on waiting and expires as usual.
    let kept = purgatory.cancel_on_drop(b).disarm();
    assert!(!purgatory.is_completed(&kept));
    // Already answered when the guard goes: nothing happens.
    let late = purgatory.cancel_on_drop(c);
    assert!(purgatory.force_complete(&c));
    drop(late);
    clock.advance(Duration::from_millis(20));
    purgatory.advance_clock(Duration::ZERO);
    assert_eq!(ledger.how(1), Some(purgatory::Completion::Expired));
    assert_eq!(ledger.how(2), Some(purgatory::Completion::Forced));
    assert_eq!(purgatory.stats().cancelled, 1);
    assert_eq!(ledger.violations(), 0);
}

/// The dashboard after a burst of disconnects on an idle service: the cancelled (and
/// expired) operations' entries stay in `watched` (Kafka's `PurgatorySize`) until a check
/// of their key or a purge, which a quiet purgatory may not run for a long time (fewer
/// stale entries than the purge interval); `watched_live` drops them as the operations
/// end.
#[test]
fn ended_operations_leave_watched_live_at_once_and_watched_at_a_purge() {
    let clock = ManualClock::new();
    let ledger = Ledger::new(220);
    let purgatory: Purgatory<u32, Probe> = manual_purgatory(&clock);
    // 200 to be cancelled, 10 to expire, 10 to wait; each on two keys.
    let handles: Vec<_> = (0..220u32)
        .map(|id| {
            let timeout = if (200..210).contains(&id) { 10 } else { 60_000 };
            let op = Probe::new(
                id as usize,
                Duration::from_millis(timeout),
                &ledger,
                &never(),
            );
            pending(purgatory.watch(op, [id % 10, 10 + id % 7]).unwrap())
        })
        .collect();
    let stats = purgatory.stats();
    assert_eq!(
        (stats.pending, stats.watched, stats.watched_live),
        (220, 440, 440)
    );

    // 200 clients leave, 10 operations expire; the reaper's round finds no purge due
    // (420 stale entries, fewer than the interval of 1,000).
    for handle in &handles[..200] {
        assert!(purgatory.cancel(handle).is_some());
    }
    clock.advance(Duration::from_millis(20));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 10);
    let stats = purgatory.stats();
    assert_eq!(
        (stats.pending, stats.watched, stats.watched_live),
        (10, 440, 20)
    );

    // The rest leave too: nothing waits, and watched_live says so.
    for handle in &handles[210..] {
        assert!(purgatory.cancel(handle).is_some());
    }
    purgatory.advance_clock(Duration::ZERO);
    let stats = purgatory.stats();
    assert_eq!(
        (
            stats.pending,
            stats.watched,
            stats.watched_live,
            stats.cancelled
        ),
        (0, 440, 0, 210)
    );
    assert_eq!(purgatory.purge(), 440);
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.watched_live, stats.keys), (0, 0, 0));
}
