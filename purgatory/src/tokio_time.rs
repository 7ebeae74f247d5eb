//! Following tokio's clock (cargo feature `tokio`): [`TokioClock`], and the task that
//! drives a purgatory built with
//! [`follow_tokio_time`](crate::PurgatoryBuilder::follow_tokio_time) in place of a reaper
//! thread.
//!
//! # Why a task
//! A paused runtime's time moves only when the runtime moves it (`advance`, or
//! auto-advance when every task waits, straight to the earliest tokio timer). A reaper
//! thread sleeping on real time would neither see those jumps nor be a timer the runtime
//! can jump to. The driving task sleeps on a tokio timer set to the purgatory's next
//! expiry, so `advance` wakes it and auto-advance stops at it.
//!
//! # The driving task's loop
//! 1. Upgrade its weak reference to the purgatory's driver; gone or shut down: end.
//! 2. Run one round without waiting (`advance_clock(ZERO)`: due expiries, cancels,
//!    purges, metrics).
//! 3. Read the earliest expiry; let go of the driver (the task never keeps the purgatory
//!    alive, and a last reference it happens to hold is released without blocking the
//!    worker, see `purgatory::release`).
//! 4. Wait until then (at most what the round's hooks allow: `REAPER_WAIT` while anything
//!    is pending or a purge is due, none while a purge is unfinished, the next metrics
//!    publish; as the reaper thread would) or until the timer's wake hook is called.
//!
//! Purges and metrics publishes therefore run in this task, on a runtime worker.
//!
//! When the runtime drops the task (the runtime shuts down first), the purgatory shuts
//! down: its pending operations are expired then, and later watches are refused, since
//! no time would pass for them any more.
//!
//! No expiry is missed: the hook ([`TimerCore::set_wake_hook`](timer_core::TimerCore))
//! is called by every add that queues a task earlier than all others of its shard, and
//! by shutdown; an add before step 3's read is seen by the read, one after it stores a
//! `Notify` permit that ends step 4 at once.

use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::Duration;

use timer_core::{Clock, Driver};
use tokio::runtime::Handle;
use tokio::sync::Notify;

use crate::group::Group;
use crate::operation::DelayedOperation;
use crate::purgatory::{release, Purgatory};

/// A [`Clock`] that reads tokio's time (`tokio::time::Instant`) in one runtime's context:
/// paused, advanced and auto-advanced with it in tests (tokio's `test-util`), the
/// monotonic system time otherwise. Its origin is when it was made.
///
/// Reading it enters the runtime's context on the reading thread, so threads outside the
/// runtime see the same (paused) time as its tasks. A purgatory built with
/// [`follow_tokio_time`](crate::PurgatoryBuilder::follow_tokio_time) uses it; with a
/// plain timer, drive the timer yourself (a paused clock does not wake a reaper thread).
#[derive(Clone, Debug)]
pub struct TokioClock {
    runtime: Handle,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock following `runtime`'s time, at zero now.
    pub fn new(runtime: Handle) -> Self {
        let origin = {
            let _context = runtime.enter();
            tokio::time::Instant::now()
        };
        TokioClock { runtime, origin }
    }

    /// A clock following the current runtime's time.
    ///
    /// # Panics
    /// Outside a tokio runtime's context.
    pub fn current() -> Self {
        Self::new(Handle::current())
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        let _context = self.runtime.enter();
        // A paused clock never goes back; `saturating` keeps that true across the origin.
        tokio::time::Instant::now().saturating_duration_since(self.origin)
    }
}

/// Whether `runtime` has its time driver (tokio has no query for it: making a timer
/// without one panics, which is caught here).
pub(crate) fn has_timers(runtime: &Handle) -> bool {
    std::panic::catch_unwind(|| {
        let _context = runtime.enter();
        drop(tokio::time::sleep(Duration::ZERO));
    })
    .is_ok()
}

/// Spawns the task that drives `purgatory` on its runtime (the builder checked there is
/// one) and installs the timer's wake hook.
pub(crate) fn spawn_driver<K, O>(purgatory: &Purgatory<K, O>)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    let driver = purgatory.driver();
    let state = purgatory.state();
    let Some(runtime) = state.runtime.handle() else {
        return;
    };
    let wake = Arc::new(Notify::new());
    let hook = Arc::clone(&wake);
    state.timer.set_wake_hook(move || hook.notify_one());
    // The guard is made here, not in the task's body: a task the runtime drops before
    // ever polling it drops its arguments, so the purgatory shuts down then too.
    runtime.spawn(drive(ShutDownWithTheRuntime(Arc::downgrade(driver)), wake));
}

/// The driving task's loop (see the module doc).
async fn drive(driver: ShutDownWithTheRuntime, wake: Arc<Notify>) {
    loop {
        let Some(wait) = round(&driver.0) else {
            return;
        };
        match wait {
            None => wake.notified().await,
            Some(wait) if wait.is_zero() => tokio::task::yield_now().await,
            Some(wait) => {
                // Either ends the wait; a timeout is not an error here.
                let _ = tokio::time::timeout(wait, wake.notified()).await;
            }
        }
    }
}

/// Steps 1-3: one round; returns how long to wait (`Some(None)`: until woken), or `None`
/// when the purgatory is gone or shut down.
fn round(driver: &Weak<Driver<Group>>) -> Option<Option<Duration>> {
    let driver = driver.upgrade()?;
    if driver.is_shutdown() {
        release(driver, ());
        return None;
    }
    // What the round's hooks allow (a purge left unfinished, the next metrics publish),
    // as the reaper thread would wait under it.
    let (_, next) = driver.round_now();
    let timer = driver.target().timer();
    let wait = match timer.next_expiration() {
        Some(at) => at.saturating_sub(timer.now()).min(next.queued),
        None => next.empty,
    };
    release(driver, ());
    Some((wait != Duration::MAX).then_some(wait))
}

/// Held by the driving task: when the runtime drops the task (it is shutting down, or
/// gone), the purgatory shuts down with it, expiring what is pending, since nothing would
/// expire it any more. A task that ends by itself finds the purgatory shut down or gone.
struct ShutDownWithTheRuntime(Weak<Driver<Group>>);

impl Drop for ShutDownWithTheRuntime {
    fn drop(&mut self) {
        if let Some(driver) = self.0.upgrade() {
            if !driver.is_shutdown() {
                crate::group::shut_down(&driver);
            }
            release(driver, ());
        }
    }
}
