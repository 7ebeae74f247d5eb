//! Test operations for the purgatory peers' unit tests: each is ready once released,
//! logs how it completed, and notes an expiry that came before its deadline.
//!
//! # Invariants
//! - Operation `i` (the `i`-th made by one [`Logged`]) is ready once `release(i)` was
//!   called; the log holds completions in the order they happened.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use purgatory::{Completion, DelayedOperation};

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
