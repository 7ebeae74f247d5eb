//! The locks, atomics and parking of the op table and the watcher lists, swapped for
//! loom's under `cfg(loom)` so the loom models (`tests/loom.rs`) explore their
//! interleavings. Crate-private: not part of the purgatory's API.
//!
//! Normal builds use `parking_lot`'s mutex (small, no poisoning), std atomics and
//! `parking_lot_core`'s parking lot (threads park on an address; a hash table of queues
//! keyed by address, so a slot costs no memory for it).

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};

use std::sync::atomic::Ordering::Relaxed;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
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
}

/// A value whose accesses the caller makes exclusive by its own protocol (the slot
/// word, `slot.rs`): the timer's cell, which loom checks under `--cfg loom`.
pub(crate) use timer_core::UnsafeCell;

/// Where threads wait for a word to change: `park` sleeps while the word still reads as
/// the caller saw it, `unpark_all` wakes every thread parked on that word. A thread that
/// checked the word before an `unpark_all` and parks after it is not left asleep: the
/// check happens under the parking lot's lock, which `unpark_all` also takes.
#[derive(Debug, Default)]
pub(crate) struct Parker {
    #[cfg(loom)]
    lot: loom::sync::Mutex<()>,
    #[cfg(loom)]
    woken: loom::sync::Condvar,
}

impl Parker {
    /// Sleeps until woken, unless `word`, read under the parking lot's lock, has
    /// changed: its bits in `mask` are no longer `expected`. May return early; callers
    /// look again.
    #[cfg(not(loom))]
    pub(crate) fn park(&self, word: &AtomicU64, mask: u64, expected: u64) {
        let key = word as *const AtomicU64 as usize;
        let still_waiting = || word.load(Relaxed) & mask == expected;
        // SAFETY: the validate callback only reads an atomic (it neither panics nor
        // parks), the other callbacks do nothing, and the key is an address only this
        // module parks on.
        unsafe {
            parking_lot_core::park(
                key,
                still_waiting,
                || {},
                |_, _| {},
                parking_lot_core::DEFAULT_PARK_TOKEN,
                None,
            );
        }
    }

    /// Wakes every thread parked on `word`.
    #[cfg(not(loom))]
    pub(crate) fn unpark_all(&self, word: &AtomicU64) {
        let key = word as *const AtomicU64 as usize;
        // SAFETY: the key is an address this module parks on, nothing else.
        unsafe {
            parking_lot_core::unpark_all(key, parking_lot_core::DEFAULT_UNPARK_TOKEN);
        }
    }

    #[cfg(loom)]
    pub(crate) fn park(&self, word: &AtomicU64, mask: u64, expected: u64) {
        let lot = self.lot.lock().expect("loom mutex poisoned");
        if word.load(Relaxed) & mask == expected {
            drop(self.woken.wait(lot).expect("loom mutex poisoned"));
        }
    }

    #[cfg(loom)]
    pub(crate) fn unpark_all(&self, _word: &AtomicU64) {
        drop(self.lot.lock().expect("loom mutex poisoned"));
        self.woken.notify_all();
    }
}

/// Spins a little before a thread parks: most slot locks are held for a few hundred
/// nanoseconds. (Under loom: never, a spin is only more interleavings.)
pub(crate) struct SpinWait(#[cfg(not(loom))] parking_lot_core::SpinWait);

impl SpinWait {
    pub(crate) fn new() -> Self {
        #[cfg(not(loom))]
        return SpinWait(parking_lot_core::SpinWait::new());
        #[cfg(loom)]
        return SpinWait();
    }

    /// Spins once; false once the caller should park instead.
    #[inline]
    pub(crate) fn spin(&mut self) -> bool {
        #[cfg(not(loom))]
        return self.0.spin();
        #[cfg(loom)]
        return false;
    }
}
