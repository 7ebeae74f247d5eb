//! What happens when callers do unusual things: drive the clock beside the reaper, hand a
//! handle to the wrong purgatory, pass a key iterator that panics. None of it may lose an
//! operation, complete the wrong one, or leave one stranded.

mod probe;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use probe::{never, wait_until, Ledger, Probe};
use purgatory::{Purgatory, PurgatoryBuilder, TimerBuilder, WatchOutcome};

#[test]
fn a_second_driver_beside_the_reaper_does_not_make_it_miss_a_timeout() {
    let ledger = Ledger::new(1);
    let purgatory: Purgatory<u32, Probe> = Purgatory::new("two-drivers");
    // The reaper sleeps indefinitely (nothing pending); a caller drives the clock too and
    // leaves while the reaper still sleeps.
    purgatory.advance_clock(Duration::from_millis(20));
    let op = Probe::new(0, Duration::from_millis(50), &ledger, &never());
    assert!(!purgatory.try_complete_else_watch(op, [1]).unwrap());
    assert!(
        wait_until(Duration::from_secs(10), || ledger.is_completed(0)),
        "a 50 ms timeout did not expire: the reaper missed the wake-up"
    );
    assert_eq!(ledger.expirations(0), 1);
}

#[test]
fn a_handle_from_another_purgatory_completes_nothing() {
    let ledger = Ledger::new(2);
    let build = |name: &str| -> Purgatory<u32, Probe> {
        PurgatoryBuilder::new()
            .name(name)
            .timer(TimerBuilder::new().reaper(false))
            .build()
            .unwrap()
    };
    let produce = build("produce");
    let fetch = build("fetch");
    let WatchOutcome::Pending(handle) = produce
        .watch(
            Probe::new(0, Duration::from_secs(60), &ledger, &never()),
            [1],
        )
        .unwrap()
    else {
        panic!("a never-ready operation must wait");
    };
    let WatchOutcome::Pending(_) = fetch
        .watch(
            Probe::new(1, Duration::from_secs(60), &ledger, &never()),
            [1],
        )
        .unwrap()
    else {
        panic!("a never-ready operation must wait");
    };
    assert!(
        !fetch.force_complete(&handle),
        "foreign handle must be refused"
    );
    assert!(!ledger.is_completed(0));
    assert_eq!(
        fetch.stats().pending,
        1,
        "fetch's own timeout must stay armed"
    );
    assert_eq!(produce.stats().pending, 1);
    assert!(produce.force_complete(&handle));
    assert_eq!(ledger.completions(0), 1);
    assert!(!ledger.is_completed(1));
}

#[test]
fn a_panicking_key_iterator_leaves_nothing_behind() {
    let ledger = Ledger::new(1);
    let purgatory: Purgatory<u32, Probe> = PurgatoryBuilder::new()
        .timer(TimerBuilder::new().reaper(false))
        .build()
        .unwrap();
    let keys = (0..3).map(|k| if k == 2 { panic!("bad key") } else { k });
    let op = Probe::new(0, Duration::from_millis(1), &ledger, &never());
    let result = catch_unwind(AssertUnwindSafe(|| {
        purgatory.try_complete_else_watch(op, keys)
    }));
    assert!(result.is_err(), "the iterator's panic reaches the caller");
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.keys, stats.pending), (0, 0, 0));
    // The operation was never accepted: no callback, dropped once during the unwind.
    assert_eq!(ledger.completions(0), 0);
    assert_eq!(ledger.drops(0), 1);
    assert_eq!(ledger.violations(), 0);
}
