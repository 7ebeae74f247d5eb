//! Test operations for the purgatory peers' unit tests: each is ready once released,
//! logs how it completed, and notes an expiry that came before its deadline; and the
//! checks every purgatory peer passes through the W3 trait.
//!
//! # Invariants
//! - Operation `i` (the `i`-th made by one [`Logged`]) is ready once `release(i)` was
//!   called; the log holds completions in the order they happened.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use purgatory::{Completion, DelayedOperation};

use crate::workloads::w3::LoadPurgatory;

/// Makes operations and records how they complete.
#[derive(Clone, Default)]
pub(crate) struct Logged {
    ready: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    log: Arc<Mutex<Vec<Completion>>>,
    early: Arc<AtomicU64>,
}

/// One operation of a [`Logged`].
pub(crate) struct LoggedOp {
    ready: Arc<AtomicBool>,
    timeout: Duration,
    made: Instant,
    owner: Logged,
}

impl Logged {
    /// The next operation, with a timeout of `timeout_ms`.
    pub(crate) fn op(&self, timeout_ms: u64) -> LoggedOp {
        let ready = Arc::new(AtomicBool::new(false));
        self.ready.lock().push(Arc::clone(&ready));
        LoggedOp {
            ready,
            timeout: Duration::from_millis(timeout_ms),
            made: Instant::now(),
            owner: self.clone(),
        }
    }

    /// Makes operation `i` ready.
    pub(crate) fn release(&self, i: usize) {
        self.ready.lock()[i].store(true, Ordering::Release);
    }

    /// The completions so far, in order.
    pub(crate) fn log(&self) -> Vec<Completion> {
        self.log.lock().clone()
    }

    /// Expiries that came before their operation's deadline.
    pub(crate) fn early_expiries(&self) -> u64 {
        self.early.load(Ordering::Relaxed)
    }
}

impl DelayedOperation for LoggedOp {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    fn on_complete(&mut self, how: Completion) {
        if how == Completion::Expired && self.made.elapsed() < self.timeout {
            self.owner.early.fetch_add(1, Ordering::Relaxed);
        }
        self.owner.log.lock().push(how);
    }
}

/// Waits up to 5 s for `done`; panics if it does not come.
pub(crate) fn wait_for(done: impl Fn() -> bool) {
    let limit = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < limit, "condition not met within 5 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs every check below on fresh purgatories from `start`; `expired` reads a
/// purgatory's expiry counter.
pub(crate) fn passes_the_purgatory_checks<P: LoadPurgatory<LoggedOp>>(
    start: impl Fn() -> P,
    expired: impl Fn(&P) -> u64,
) {
    let p = start();
    completes_each_once(&p, || expired(&p));
    let p = start();
    shutdown_expires_every_request(&p, || expired(&p));
}

/// An event, a force and an expiry each complete their request once, in that order,
/// and the expiry is not early; `expired` reads the purgatory's expiry counter.
fn completes_each_once<P: LoadPurgatory<LoggedOp>>(p: &P, expired: impl Fn() -> u64) {
    let ops = Logged::default();
    assert!(p.watch(ops.op(60_000), &[1, 2]).is_some());
    let mut out = Vec::new();
    p.watch_batch(
        &mut vec![(ops.op(60_000), &[2][..]), (ops.op(20), &[3])],
        &mut out,
    );
    let forced = out[0].take().expect("not ready yet");
    ops.release(0);
    assert_eq!(p.check_and_complete(2), 1);
    assert_eq!(p.check_and_complete(1), 0, "already completed via key 2");
    assert!(p.force_complete(&forced));
    assert!(!p.force_complete(&forced));
    wait_for(|| expired() == 1);
    assert_eq!(
        ops.log(),
        [Completion::Ready, Completion::Forced, Completion::Expired]
    );
    assert_eq!(ops.early_expiries(), 0);
    p.shutdown();
}

/// Shutdown expires what waits, and a watch after it expires at once.
fn shutdown_expires_every_request<P: LoadPurgatory<LoggedOp>>(p: &P, expired: impl Fn() -> u64) {
    let ops = Logged::default();
    assert!(p.watch(ops.op(60_000), &[1]).is_some());
    p.shutdown();
    assert_eq!(expired(), 1);
    p.watch(ops.op(60_000), &[1]);
    wait_for(|| expired() == 2);
    assert_eq!(ops.log(), [Completion::Expired, Completion::Expired]);
}
