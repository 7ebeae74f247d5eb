//! The atomics, lock, condition variable and thread of [`super`], swapped for loom's under
//! `cfg(loom)` so that its models (`loom_models.rs`) explore their interleavings.
//!
//! Normal builds use std's atomics and threads and `parking_lot`'s mutex and condvar,
//! exactly as before the shim: the wrappers only adapt signatures and are inlined.

use std::io;

#[cfg(loom)]
pub(super) use loom::sync::atomic::AtomicU8;
#[cfg(loom)]
pub(super) use loom::thread::{Builder, JoinHandle};
#[cfg(not(loom))]
pub(super) use std::sync::atomic::AtomicU8;
#[cfg(not(loom))]
pub(super) use std::thread::{Builder, JoinHandle};

#[cfg(loom)]
pub(super) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;
#[cfg(not(loom))]
pub(super) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

/// A mutex whose `lock` cannot fail (`parking_lot`'s signature).
pub(super) struct Mutex<T>(
    #[cfg(loom)] loom::sync::Mutex<T>,
    #[cfg(not(loom))] parking_lot::Mutex<T>,
);

impl<T> Mutex<T> {
    pub(super) fn new(value: T) -> Self {
        #[cfg(loom)]
        return Mutex(loom::sync::Mutex::new(value));
        #[cfg(not(loom))]
        return Mutex(parking_lot::Mutex::new(value));
    }

    #[inline]
    pub(super) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(loom)]
        return self.0.lock().expect("loom mutex poisoned");
        #[cfg(not(loom))]
        return self.0.lock();
    }
}

/// A condition variable whose `wait` takes the guard and gives it back (std's and loom's
/// shape, which `parking_lot`'s `wait(&mut guard)` fits).
pub(super) struct Condvar(
    #[cfg(loom)] loom::sync::Condvar,
    #[cfg(not(loom))] parking_lot::Condvar,
);

impl Condvar {
    pub(super) fn new() -> Self {
        #[cfg(loom)]
        return Condvar(loom::sync::Condvar::new());
        #[cfg(not(loom))]
        return Condvar(parking_lot::Condvar::new());
    }

    #[inline]
    pub(super) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        #[cfg(loom)]
        return self.0.wait(guard).expect("loom mutex poisoned");
        #[cfg(not(loom))]
        {
            let mut guard = guard;
            self.0.wait(&mut guard);
            guard
        }
    }

    #[inline]
    pub(super) fn notify_one(&self) {
        self.0.notify_one();
    }

    #[inline]
    pub(super) fn notify_all(&self) {
        self.0.notify_all();
    }
}

/// Spawns the thread `name` running `f`.
pub(super) fn spawn_named<F>(name: &str, f: F) -> io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    Builder::new().name(name.to_string()).spawn(f)
}
