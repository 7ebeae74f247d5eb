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

/// A panic payload whose own `Drop` panics (user data too).
struct PanicsWhenDropped;

impl Drop for PanicsWhenDropped {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            panic!("a panic payload's drop panics (on purpose)");
        }
    }
}

/// A `try_complete` that panics with a payload whose drop panics as well: the slot is
/// held while the payload is dropped, so that second panic must not unwind out of the
/// check (it would release the slot with the operation's expiry possibly unseen). The
/// check returns, the operation waits on and expires.
#[test]
fn a_try_complete_whose_panic_payload_panics_when_dropped_is_still_contained() {
    let purgatory: Purgatory<&str, Probe> = Purgatory::new("payload-bomb");
    let ledger = Ledger::new(1);
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bomb: Readiness = {
        let armed = Arc::clone(&armed);
        Arc::new(move |_, _| {
            if armed.load(std::sync::atomic::Ordering::SeqCst) {
                std::panic::panic_any(PanicsWhenDropped);
            }
            false
        })
    };
    let op = Probe::new(0, Duration::from_millis(50), &ledger, &bomb);
    assert!(!purgatory.try_complete_else_watch(op, ["k"]).unwrap());
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        purgatory.check_and_complete(&"k")
    }));
    assert_eq!(
        checked.ok(),
        Some(0),
        "the check returned, nothing completed"
    );
    assert!(wait_until(Duration::from_secs(10), || ledger.is_completed(0)));
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!(ledger.violations(), 0);
}

/// A key already listed is dropped by the watch that lists it again (after the shard
/// lock, with the operation's slot still held). A key whose `Drop` panics there is
/// caught: the watch returns, and the operation waits and is answered like any other.
#[test]
fn a_key_whose_drop_panics_while_its_operation_is_listed_is_contained() {
    #[derive(Clone)]
    struct Key(u32, Arc<std::sync::atomic::AtomicBool>);
    impl std::hash::Hash for Key {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.0.hash(state);
        }
    }
    impl PartialEq for Key {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }
    impl Eq for Key {}
    impl Drop for Key {
        fn drop(&mut self) {
            if self.1.swap(false, std::sync::atomic::Ordering::SeqCst) {
                panic!("a key's drop panics (on purpose)");
            }
        }
    }

    let purgatory: Purgatory<Key, Probe> = Purgatory::new("key-drop-bomb");
    let ledger = Ledger::new(2);
    let no = never();
    let quiet = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let first = Probe::new(0, LONG, &ledger, &no);
    assert!(!purgatory
        .try_complete_else_watch(first, [Key(1, Arc::clone(&quiet))])
        .unwrap());
    // The second watch's key is equal to the listed one: it is not kept, and its drop
    // panics.
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let second = Probe::new(1, Duration::from_millis(20), &ledger, &no);
    let watched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        purgatory.try_complete_else_watch(second, [Key(1, Arc::clone(&armed))])
    }));
    assert!(
        matches!(watched, Ok(Ok(false))),
        "the watch returned, waiting"
    );
    assert!(
        !armed.load(std::sync::atomic::Ordering::SeqCst),
        "the key was dropped"
    );
    assert!(wait_until(Duration::from_secs(10), || ledger.is_completed(1)));
    assert_eq!(ledger.how(1), Some(Completion::Expired));
    purgatory.shutdown();
    assert_eq!(
        ledger.how(0),
        Some(Completion::Shutdown),
        "answered at shutdown"
    );
    assert_eq!(ledger.violations(), 0);
}
