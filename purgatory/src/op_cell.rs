//! The shared state of one watched operation: where "exactly once" is decided.
//!
//! # Invariants
//! - The operation lives in `state.op` until exactly one thread takes it out, under the
//!   cell's lock. Whoever takes it is the one that completes it (or hands it back, for a
//!   cancel); every later attempt finds `None` and does nothing. So `on_complete` runs at
//!   most once, and `try_complete` (called under the same lock, on the value still in
//!   place) never runs concurrently with itself or after the operation was taken.
//! - `completed` becomes true, once, when the operation is taken, before the lock is
//!   released. Readers without the lock (purge, list scans) may see it late, never early.
//! - `state.timer` is the operation's armed timeout; it is taken together with the
//!   operation, so the taker (and only it) disarms the timer (at once, or through the
//!   batched queue of `cancels.rs`). The watcher arms the timer
//!   while holding the lock, so a completion can never miss a timer armed after it.
//! - The cell itself carries no reference to the purgatory: the caller that takes the
//!   operation does the accounting.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};

use timer_core::sync::{AtomicBool, Mutex, MutexGuard};
use timer_core::TimerHandle;

use crate::operation::DelayedOperation;

pub(crate) struct OpState<O> {
    pub(crate) op: Option<O>,
    pub(crate) timer: Option<TimerHandle>,
}

/// An operation taken out of its cell, with the timer it still has armed (if any).
pub(crate) struct Taken<O> {
    pub(crate) op: O,
    pub(crate) timer: Option<TimerHandle>,
}

pub(crate) struct OpCell<O> {
    state: Mutex<OpState<O>>,
    completed: AtomicBool,
    /// How many watcher entries name this cell (its key count). Written by the watcher
    /// while it holds the lock, before anyone else can take the operation.
    keys: AtomicU32,
}

/// Result of asking a cell whether it is ready.
pub(crate) enum Attempt<O> {
    /// Ready: the operation was taken; the caller completes it.
    Ready(Taken<O>),
    /// Not ready (or its `try_complete` panicked, reported in `panicked`).
    NotReady { panicked: bool },
    /// Someone else took it already.
    Gone,
}

impl<O: DelayedOperation> OpCell<O> {
    pub(crate) fn new(op: O) -> Self {
        OpCell {
            state: Mutex::new(OpState {
                op: Some(op),
                timer: None,
            }),
            completed: AtomicBool::new(false),
            keys: AtomicU32::new(0),
        }
    }

    pub(crate) fn keys(&self) -> u32 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Records the key count; call while holding the lock, before releasing it.
    pub(crate) fn set_keys(&self, keys: u32) {
        self.keys.store(keys, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn is_completed(&self) -> bool {
        self.completed.load(Ordering::Acquire)
    }

    /// Locks the cell; the watcher holds it across its try, its watches and arming.
    pub(crate) fn lock(&self) -> MutexGuard<'_, OpState<O>> {
        self.state.lock()
    }

    /// Takes the operation out of a locked cell and marks it completed.
    pub(crate) fn take_locked(&self, state: &mut OpState<O>) -> Option<Taken<O>> {
        let op = state.op.take()?;
        self.completed.store(true, Ordering::Release);
        Some(Taken {
            op,
            timer: state.timer.take(),
        })
    }

    /// Runs `try_complete` on the operation still in a locked cell and takes it out if it
    /// is ready.
    pub(crate) fn take_if_ready_locked(&self, state: &mut OpState<O>) -> Attempt<O> {
        let Some(op) = state.op.as_mut() else {
            return Attempt::Gone;
        };
        match try_complete_caught(op) {
            Ok(true) => Attempt::Ready(
                self.take_locked(state)
                    .expect("the operation was present under the same lock"),
            ),
            Ok(false) => Attempt::NotReady { panicked: false },
            Err(()) => Attempt::NotReady { panicked: true },
        }
    }

    /// Locks the cell, runs `try_complete` and takes the operation if it is ready.
    pub(crate) fn attempt(&self) -> Attempt<O> {
        self.take_if_ready_locked(&mut self.state.lock())
    }

    /// Takes the operation whatever its readiness (force, expiry, cancel, shutdown).
    pub(crate) fn take(&self) -> Option<Taken<O>> {
        let mut state = self.state.lock();
        self.take_locked(&mut state)
    }
}

/// Calls `try_complete`, turning a panic into `Err` (reported through `tracing`).
pub(crate) fn try_complete_caught<O: DelayedOperation>(op: &mut O) -> Result<bool, ()> {
    catch_unwind(AssertUnwindSafe(|| op.try_complete())).map_err(|payload| {
        tracing::error!(
            target: "purgatory",
            panic = panic_message(&*payload),
            "try_complete panicked; treated as not ready"
        );
    })
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}
