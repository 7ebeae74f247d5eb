//! How the driving thread sleeps until the earliest bucket is due without missing an
//! earlier bucket that appears while it falls asleep.
//!
//! # Protocol
//! `wake_at` holds the tick at which the sleeping driver will wake by itself, or
//! [`AWAKE`] (0) while no driver sleeps.
//!
//! - Driver: takes `lock`, stores its planned wake tick in `wake_at`, then re-reads every
//!   shard's earliest expiration (`recheck`); only if nothing earlier appeared does it wait
//!   on `cond`, which releases `lock` atomically.
//! - Adder: after publishing an earlier expiration `e` in its shard, reads `wake_at`; if
//!   `e < wake_at` it takes `lock` and notifies.
//!
//! Both sides store then load with `SeqCst`, so at least one sees the other (the
//! store-buffer litmus test cannot produce "neither"): either the driver's re-read sees
//! `e`, or the adder sees the planned tick and notifies. Taking `lock` before notifying
//! means the notification cannot fall between the driver's re-read and its wait.
//!
//! A wake-up is also *sticky*: `wake` sets a flag under `lock`, and a driver about to
//! sleep that finds the flag set clears it and returns at once. So a wake that arrives
//! while no driver sleeps (say, a shutdown request racing the driver's loop condition)
//! is not lost; it costs at most one early return.

use std::time::Instant;

use crate::sync::{AtomicU64, Condvar, Mutex};
use std::sync::atomic::Ordering::SeqCst;

/// `wake_at` while no driver is asleep.
const AWAKE: u64 = 0;

#[derive(Debug, Default)]
pub(crate) struct Sleeper {
    /// Guards the wait; holds whether a wake-up arrived that no sleep consumed yet.
    lock: Mutex<bool>,
    cond: Condvar,
    wake_at: AtomicU64,
}

impl Sleeper {
    pub(crate) fn new() -> Self {
        Sleeper {
            lock: Mutex::new(false),
            cond: Condvar::default(),
            wake_at: AtomicU64::new(AWAKE),
        }
    }

    /// Sleeps until tick `wake_tick` (at real instant `deadline`, forever if `None`) or a
    /// notification. `recheck` returns true when the driver must not sleep after all (an
    /// earlier bucket is due, or the timer is closing); it runs after `wake_at` is
    /// published and under the lock.
    pub(crate) fn sleep(
        &self,
        wake_tick: u64,
        deadline: Option<Instant>,
        recheck: impl FnOnce(u64) -> bool,
    ) {
        let mut woken = self.lock.lock();
        if std::mem::take(&mut *woken) {
            return;
        }
        self.wake_at.store(wake_tick.max(1), SeqCst);
        if !recheck(wake_tick) {
            woken = self.cond.wait_until(woken, deadline);
            *woken = false;
        }
        self.wake_at.store(AWAKE, SeqCst);
        drop(woken);
    }

    /// Wakes the driver if it plans to sleep past `expiration`. Call after publishing
    /// `expiration` with `SeqCst`.
    pub(crate) fn wake_if_later_than(&self, expiration: u64) {
        if expiration < self.wake_at.load(SeqCst) {
            self.wake();
        }
    }

    /// Wakes a sleeping driver unconditionally (shutdown, or a user's request); if none
    /// sleeps, the next sleep returns at once.
    pub(crate) fn wake(&self) {
        let mut woken = self.lock.lock();
        *woken = true;
        self.cond.notify_all();
    }
}
