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
//!
//! Several threads may drive one timer (the reaper and a caller of `advance_clock`).
//! `wake_at` is then the earliest planned wake of all sleepers; an add earlier than it
//! wakes them all, and the earliest one wakes by itself before any later add is due. When
//! a sleeper leaves while others still sleep, their earliest plan is unknown, so
//! `wake_at` becomes `u64::MAX`: every add notifies until they have all left. And the
//! leaving sleeper wakes the others, so they re-plan: an add that came while its earlier
//! plan was published did not notify, yet may be earlier than theirs (or may change the
//! bound they sleep under, see `NextRound`). That costs spurious wake-ups, never a missed
//! one.
//!
//! # A driver that waits elsewhere
//! A driver that sleeps outside this module (an async task on a runtime, which must not
//! block its thread on `cond`) cannot publish a plan under `lock`. It installs a wake hook
//! instead ([`Sleeper::set_hook`]); from then on every add that lowers a shard's earliest
//! expiration calls [`wake`](Sleeper::wake), whatever `wake_at` says, and `wake` calls the
//! hook after notifying. Such a driver reads the earliest expiration, then waits for its
//! own timer or the hook: an add before the read is seen by the read, an add after it
//! calls the hook. The hook must remember a call that comes before the driver waits (a
//! `tokio::sync::Notify`'s permit does).

use std::sync::OnceLock;
use std::time::Duration;

use crate::sync::{AtomicU64, SleepCondvar, SleepMutex};
use std::sync::atomic::Ordering::SeqCst;

/// `wake_at` while no driver is asleep.
const AWAKE: u64 = 0;

/// What the sleeper's lock guards.
#[derive(Debug, Default)]
struct SleepState {
    /// A wake-up arrived that no sleep consumed yet.
    woken: bool,
    /// Threads currently waiting.
    sleepers: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Sleeper {
    /// The standard library's pair (`sync.rs` says why): a notify is a system call even
    /// with no waiter, so this module notifies only while `sleepers` is not 0.
    lock: SleepMutex<SleepState>,
    cond: SleepCondvar,
    wake_at: AtomicU64,
    /// The wake hook of a driver that waits elsewhere (see the module doc).
    hook: OnceLock<WakeHook>,
}

/// What a driver that waits elsewhere is woken by.
pub(crate) struct WakeHook(pub(crate) Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for WakeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WakeHook")
    }
}

impl Sleeper {
    pub(crate) fn new() -> Self {
        Sleeper {
            lock: SleepMutex::new(SleepState::default()),
            cond: SleepCondvar::default(),
            wake_at: AtomicU64::new(AWAKE),
            hook: OnceLock::new(),
        }
    }

    /// Installs the wake hook of a driver that waits elsewhere; returns false (and drops
    /// `hook`) if one is installed already.
    pub(crate) fn set_hook(&self, hook: WakeHook) -> bool {
        self.hook.set(hook).is_ok()
    }

    /// Sleeps until tick `wake_tick` (`timeout` from now in real time, forever if `None`)
    /// or a notification. `recheck` returns true when the driver must not sleep after all
    /// (an earlier bucket is due, or the timer is closing); it runs after `wake_at` is
    /// published and under the lock.
    pub(crate) fn sleep(
        &self,
        wake_tick: u64,
        timeout: Option<Duration>,
        recheck: impl FnOnce(u64) -> bool,
    ) {
        let mut state = self.lock.lock();
        if std::mem::take(&mut state.woken) {
            return;
        }
        state.sleepers += 1;
        let planned = wake_tick.max(1);
        let published = if state.sleepers == 1 {
            planned
        } else {
            self.wake_at.load(SeqCst).min(planned)
        };
        self.wake_at.store(published, SeqCst);
        if !recheck(wake_tick) {
            state = self.cond.wait_for(state, timeout);
            state.woken = false;
        }
        state.sleepers -= 1;
        let after = if state.sleepers == 0 { AWAKE } else { u64::MAX };
        self.wake_at.store(after, SeqCst);
        if state.sleepers > 0 {
            // An add made while this thread's earlier plan was published may not have
            // notified, though it is earlier than the others' plans: let them re-plan.
            self.cond.notify_all();
        }
        drop(state);
    }

    /// Wakes the driver if it plans to sleep past `expiration`. Call after publishing
    /// `expiration` with `SeqCst`.
    pub(crate) fn wake_if_later_than(&self, expiration: u64) {
        if expiration < self.wake_at.load(SeqCst) || self.hook.get().is_some() {
            self.wake();
        }
    }

    /// Wakes a sleeping driver unconditionally (shutdown, or a user's request); if none
    /// sleeps, the next sleep returns at once.
    pub(crate) fn wake(&self) {
        let mut state = self.lock.lock();
        state.woken = true;
        // A thread not counted yet takes the lock after this and finds `woken`.
        if state.sleepers > 0 {
            self.cond.notify_all();
        }
        drop(state);
        if let Some(hook) = self.hook.get() {
            crate::user_code::caught("the wake hook panicked", || (hook.0)());
        }
    }
}
