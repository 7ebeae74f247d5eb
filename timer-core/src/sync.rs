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
    pub use std::sync::atomic::{AtomicBool, AtomicU64};
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
    pub use loom::sync::atomic::{AtomicBool, AtomicU64};
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
