//! The synchronisation primitives the timer uses, swapped for loom's under `cfg(loom)`.
//!
//! Private to this crate: a crate layered on the timer (the purgatory) keeps its own
//! switch for its own locks.
//!
//! Normal builds use `parking_lot` (small, fast uncontended locks, no poisoning) and std
//! atomics. Under `RUSTFLAGS="--cfg loom"` every lock, condition variable and atomic the
//! thread-safe timer touches is loom's, so a loom model explores their interleavings.
//! Loom has no notion of time: a timed wait there waits until notified.

#[cfg(not(loom))]
mod imp {
    pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
    use std::time::Instant;

    /// The guard of a locked [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    /// A mutex without poisoning (`parking_lot`'s).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        /// A new unlocked mutex holding `value`.
        pub fn new(value: T) -> Self {
            Mutex(parking_lot::Mutex::new(value))
        }

        /// Blocks until the lock is held.
        #[inline]
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(parking_lot::Condvar);

    impl Condvar {
        /// Waits for a notification or until `deadline` (forever when `None`).
        pub fn wait_until<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            deadline: Option<Instant>,
        ) -> MutexGuard<'a, T> {
            match deadline {
                Some(deadline) => {
                    self.0.wait_until(&mut guard, deadline);
                }
                None => self.0.wait(&mut guard),
            }
            guard
        }

        /// Wakes every waiter.
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(loom)]
#[allow(missing_docs)]
mod imp {
    pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
    use std::time::Instant;

    pub type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("loom mutex poisoned")
        }
    }

    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub fn wait_until<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            _deadline: Option<Instant>,
        ) -> MutexGuard<'a, T> {
            self.0.wait(guard).expect("loom mutex poisoned")
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

pub use imp::*;

/// A value whose accesses the caller makes exclusive by its own protocol (a claimed task
/// of a shared batch, `shared_batch.rs`; the purgatory's slot, under its lock bit); loom
/// checks that they are.
#[derive(Debug)]
pub struct UnsafeCell<T>(
    #[cfg(not(loom))] std::cell::UnsafeCell<T>,
    #[cfg(loom)] loom::cell::UnsafeCell<T>,
);

impl<T> UnsafeCell<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> Self {
        #[cfg(not(loom))]
        return UnsafeCell(std::cell::UnsafeCell::new(value));
        #[cfg(loom)]
        return UnsafeCell(loom::cell::UnsafeCell::new(value));
    }

    /// Runs `f` on the value.
    ///
    /// # Safety
    /// The caller has exclusive access to the value for the whole call.
    #[inline]
    pub unsafe fn with_mut<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        #[cfg(not(loom))]
        // SAFETY: exclusive access, by the caller's contract.
        return f(unsafe { &mut *self.0.get() });
        #[cfg(loom)]
        // SAFETY: exclusive access, by the caller's contract (and loom checks it).
        return self.0.with_mut(|p| f(unsafe { &mut *p }));
    }
}
