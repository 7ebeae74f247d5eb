//! The locks and atomics of the op table and the watcher lists, swapped for loom's under
//! `cfg(loom)` so the loom model (`tests/loom.rs`) explores their interleavings.
//! Crate-private: not part of the purgatory's API.
//!
//! Normal builds use `parking_lot`'s mutex (small, no poisoning) and std atomics.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU32};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU32};
#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;

/// Loom's mutex with `parking_lot`'s signature (`lock` cannot fail).
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().expect("loom mutex poisoned")
    }

    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.0.try_lock().ok()
    }
}
