//! The synchronisation primitives the timer uses, swapped for loom's under `cfg(loom)`.
//!
//! Private to this crate: a crate layered on the timer (the purgatory) keeps its own
//! switch for its own locks.
//!
//! Normal builds use `parking_lot` (small, fast uncontended locks, no poisoning) and std
//! atomics. Under `RUSTFLAGS="--cfg loom"` every lock, condition variable and atomic the
//! thread-safe timer touches is loom's, so a loom model explores their interleavings.
//! Loom has no notion of time: a timed wait there waits until notified.
//!
//! The one exception: the core's sleeper (`sleeper.rs`) waits on [`SleepMutex`] and
//! [`SleepCondvar`], the standard library's (on Linux a bare futex each). The driving
//! thread waits there once a round, and `parking_lot`'s timed wait (its parking lot's
//! queue and bucket lock, two clock readings and a subtraction of instants) cost about
//! 340 instructions a wait against about 120 for the standard one, which reads the
//! clock once and waits on an absolute deadline (callgrind, `expiring_watches`: a
//! round's `Sleeper::sleep` 432 -> 228). Its notifies are rare (an add earlier than
//! the sleeper's plan, a wake, a shutdown), and the standard `notify_all` makes a system
//! call even with no waiter, so the sleeper notifies only while a thread sleeps.

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

    /// The guard of a locked [`SleepMutex`].
    pub type SleepGuard<'a, T> = std::sync::MutexGuard<'a, T>;

    /// The sleeper's mutex (see the module doc): the standard library's, whose
    /// poisoning is ignored (nothing that can panic runs under it).
    #[derive(Debug, Default)]
    pub struct SleepMutex<T>(std::sync::Mutex<T>);

    impl<T> SleepMutex<T> {
        /// A new unlocked mutex holding `value`.
        pub fn new(value: T) -> Self {
            SleepMutex(std::sync::Mutex::new(value))
        }

        /// Blocks until the lock is held.
        #[inline]
        pub fn lock(&self) -> SleepGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    /// The sleeper's condition variable, paired with [`SleepMutex`] (see the module doc).
    #[derive(Debug, Default)]
    pub struct SleepCondvar(std::sync::Condvar);

    impl SleepCondvar {
        /// Waits for a notification or `timeout` (forever when `None`); may also return
        /// early, spuriously.
        #[inline]
        pub fn wait_for<'a, T>(
            &self,
            guard: SleepGuard<'a, T>,
            timeout: Option<std::time::Duration>,
        ) -> SleepGuard<'a, T> {
            use std::sync::PoisonError;
            match timeout {
                Some(timeout) => {
                    self.0
                        .wait_timeout(guard, timeout)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => self.0.wait(guard).unwrap_or_else(PoisonError::into_inner),
            }
        }

        /// Wakes every waiter (a system call on Linux, waiters or not).
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

    pub type SleepMutex<T> = Mutex<T>;
    pub type SleepGuard<'a, T> = MutexGuard<'a, T>;

    #[derive(Debug, Default)]
    pub struct SleepCondvar(Condvar);

    impl SleepCondvar {
        pub fn wait_for<'a, T>(
            &self,
            guard: SleepGuard<'a, T>,
            _timeout: Option<std::time::Duration>,
        ) -> SleepGuard<'a, T> {
            self.0.wait_until(guard, None)
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
