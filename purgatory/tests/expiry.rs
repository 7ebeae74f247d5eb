//! Expiry: an operation completes by its timeout never before the timeout has passed, with
//! `on_complete(Expired)` followed by `on_expiration`, and only the operations whose
//! timeout passed expire. Checked on the real clock (reaper thread) and on a manual clock
//! (driven by `advance_clock`), plus the edge timeouts: zero (due now, expired by the next
//! advance, never on the watching thread) and `Duration::MAX` (accepted, never due).

mod probe;

use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use probe::{manual_purgatory, never, wait_until, Ledger, Probe};
use purgatory::{
    Completion, DelayedOperation, ManualClock, Purgatory, PurgatoryBuilder, SystemClock,
    TimerBuilder,
};

/// Records when and where its callbacks ran.
struct Timed {
    timeout: Duration,
    done: crossbeam_channel::Sender<(Completion, Instant, ThreadId)>,
    expirations: Arc<Mutex<u32>>,
}

impl DelayedOperation for Timed {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        false
    }

    fn on_complete(&mut self, how: Completion) {
        let _ = self
            .done
            .send((how, Instant::now(), std::thread::current().id()));
    }

    fn on_expiration(&mut self) {
        *self.expirations.lock().unwrap() += 1;
    }
}

#[test]
fn a_timeout_expires_its_operation_no_earlier_than_the_timeout_on_the_real_clock() {
    let purgatory: Purgatory<&str, Timed> = Purgatory::new("expiry-real");
    let (short_tx, short_rx) = crossbeam_channel::unbounded();
    let (long_tx, long_rx) = crossbeam_channel::unbounded();
    let short_expired = Arc::new(Mutex::new(0));
    let long_expired = Arc::new(Mutex::new(0));

    let start = Instant::now();
    let short = Timed {
        timeout: Duration::from_millis(20),
        done: short_tx,
        expirations: Arc::clone(&short_expired),
    };
    assert!(!purgatory.try_complete_else_watch(short, ["test1"]).unwrap());
    let long = Timed {
        timeout: Duration::from_secs(200),
        done: long_tx,
        expirations: Arc::clone(&long_expired),
    };
    assert!(!purgatory.try_complete_else_watch(long, ["test2"]).unwrap());

    let (how, at, thread) = short_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the 20 ms operation expires");
    assert_eq!(how, Completion::Expired);
    assert!(
        at.duration_since(start) >= Duration::from_millis(20),
        "expired after {:?}, before its 20 ms timeout",
        at.duration_since(start)
    );
    assert_ne!(thread, std::thread::current().id(), "the reaper expires it");
    assert!(wait_until(Duration::from_secs(5), || *short_expired
        .lock()
        .unwrap()
        == 1));

    assert!(
        long_rx.try_recv().is_err(),
        "the 200 s operation still waits"
    );
    assert_eq!(*long_expired.lock().unwrap(), 0);
    let stats = purgatory.stats();
    assert_eq!(stats.pending, 1);
    assert_eq!(stats.expired, 1);
    // Its entry under test1 is stale until a check or a purge drops it.
    assert_eq!(purgatory.check_and_complete(&"test1"), 0);
    let stats = purgatory.stats();
    assert_eq!((stats.watched, stats.keys), (1, 1));
}

#[test]
fn a_timeout_expires_exactly_at_its_deadline_on_a_manual_clock() {
    let clock = ManualClock::new();
    let purgatory: Purgatory<&str, Probe> = manual_purgatory(&clock);
    let ledger = Ledger::new(2);
    let no = never();
    let twenty = Probe::new(0, Duration::from_millis(20), &ledger, &no);
    let forever = Probe::new(1, Duration::from_secs(200), &ledger, &no);
    assert!(!purgatory
        .try_complete_else_watch(twenty, ["test1"])
        .unwrap());
    assert!(!purgatory
        .try_complete_else_watch(forever, ["test2"])
        .unwrap());

    clock.advance(Duration::from_millis(19));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 0);
    assert!(!ledger.is_completed(0), "not expired at 19 ms");

    clock.advance(Duration::from_millis(1));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
    assert_eq!(ledger.how(0), Some(Completion::Expired), "expired at 20 ms");
    assert_eq!(ledger.expirations(0), 1);
    assert!(!ledger.is_completed(1));
    assert_eq!(ledger.expirations(1), 0);

    clock.advance(Duration::from_secs(100));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 0);
    assert!(!ledger.is_completed(1), "not expired at 100 s");
    clock.advance(Duration::from_secs(100));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
    assert_eq!(ledger.how(1), Some(Completion::Expired), "expired at 200 s");

    let stats = purgatory.stats();
    assert_eq!((stats.pending, stats.expired), (0, 2));
    assert_eq!(ledger.violations(), 0);
}

#[test]
fn a_zero_timeout_expires_at_the_next_advance_not_on_the_watching_thread() {
    // Manual clock: nothing happens inside the watch call, the next advance expires it
    // without the clock moving.
    let clock = ManualClock::new();
    let purgatory: Purgatory<&str, Probe> = manual_purgatory(&clock);
    let ledger = Ledger::new(1);
    let no = never();
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(0, Duration::ZERO, &ledger, &no), ["k"])
        .unwrap());
    assert!(
        !ledger.is_completed(0),
        "not expired by the watch call itself"
    );
    assert_eq!(purgatory.stats().pending, 1);
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
    assert_eq!(ledger.how(0), Some(Completion::Expired));
    assert_eq!(ledger.expirations(0), 1);

    // Real clock with a reaper: it expires on the reaper thread.
    let purgatory: Purgatory<&str, Timed> = PurgatoryBuilder::new()
        .timer(TimerBuilder::new().clock(SystemClock::new()))
        .build()
        .unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    let expirations = Arc::new(Mutex::new(0));
    let op = Timed {
        timeout: Duration::ZERO,
        done: tx,
        expirations: Arc::clone(&expirations),
    };
    assert!(!purgatory.try_complete_else_watch(op, ["k"]).unwrap());
    let (how, _, thread) = rx.recv_timeout(Duration::from_secs(10)).expect("expires");
    assert_eq!(how, Completion::Expired);
    assert_ne!(thread, std::thread::current().id());
}

#[test]
fn a_timeout_of_duration_max_is_accepted_and_never_comes_due() {
    let clock = ManualClock::new();
    let purgatory: Purgatory<&str, Probe> = manual_purgatory(&clock);
    let ledger = Ledger::new(1);
    let no = never();
    assert!(!purgatory
        .try_complete_else_watch(Probe::new(0, Duration::MAX, &ledger, &no), ["k"])
        .unwrap());
    assert_eq!(purgatory.stats().pending, 1);
    clock.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 0);
    assert!(!ledger.is_completed(0), "not due after ten years");
    // Shutdown still answers it.
    purgatory.shutdown();
    assert_eq!(ledger.how(0), Some(Completion::Shutdown));
    assert_eq!(ledger.expirations(0), 1);
    assert_eq!(ledger.violations(), 0);
}
