//! The `tokio-task` peer: every waiting request is a tokio task of its own that waits
//! for whichever comes first, a wake-up (`tokio::sync::Notify`) from whoever completed
//! the request, or a `tokio::time::sleep_until` of its deadline. Watcher lists, forcing
//! and events are the shared front ([`DashMapPurgatory`]). This is what a broker written
//! on tokio does first: one future per parked request, the runtime's timer for its
//! timeout.
//!
//! The tasks run on a multi-threaded runtime with one worker per core (tokio's default;
//! 2 here). Requests are watched from outside the runtime (the load generator's
//! thread), so each spawn goes through the runtime's injection queue.
//!
//! # Invariants
//! - Exactly-once completion is the slot's (see [`Watchers`]): a forced or event
//!   completion takes the operation, then wakes the task, which ends; a task whose
//!   sleep ran out takes the operation (if still there) and expires it.
//! - The expiry lives in a guard that the task's future owns, so it runs however the
//!   future ends: on its deadline, after a wake-up (then it finds nothing to do), or
//!   when the runtime drops the task at shutdown (then it expires the request).
//! - A `Notify` keeps one permit, so a wake-up sent before the task first waits is not
//!   lost.

use std::sync::Arc;

use parking_lot::Mutex;
use purgatory::{Completion, DelayedOperation};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Notify;

use super::dashmap_purgatory::{DashMapPurgatory, Pending, Timeouts};
use super::dashmap_watchers::{Slot, Wake, Watchers};

impl Wake for Notify {
    #[inline]
    fn wake(&self) {
        self.notify_one();
    }
}

/// A purgatory of one tokio task per waiting request.
pub type TokioTaskPurgatory<O> = DashMapPurgatory<O, TaskPerRequest>;

/// The timer of [`TokioTaskPurgatory`]: a runtime to spawn each request's task on.
pub struct TaskPerRequest {
    runtime: Mutex<Option<Runtime>>,
    spawner: Handle,
}

/// Expires its request, if still pending, when dropped.
struct ExpireOnDrop<O: DelayedOperation> {
    watchers: Arc<Watchers<O, Notify>>,
    slot: Arc<Slot<O, Notify>>,
}

impl<O: DelayedOperation> Drop for ExpireOnDrop<O> {
    fn drop(&mut self) {
        self.watchers.complete(&self.slot, Completion::Expired);
    }
}

impl<O: DelayedOperation> TokioTaskPurgatory<O> {
    /// Starts a multi-threaded runtime with one worker per core, and on it a task that
    /// sweeps the watcher lists once `purge_interval` completed entries are listed
    /// (Kafka's default is 1,000).
    pub fn start(purge_interval: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("tokio-task-worker")
            .enable_time()
            .build()?;
        let watchers = Arc::new(Watchers::new(purge_interval));
        // The timer's side sweeps the watcher lists (off every request's path), as the
        // DelayQueue peer's driver does; it ends when the runtime is dropped.
        let for_sweeps = Arc::clone(&watchers);
        runtime.spawn(async move {
            let mut sweep = tokio::time::interval(super::tokio_delay_queue::SWEEP_EVERY);
            sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                sweep.tick().await;
                for_sweeps.sweep_if_due();
            }
        });
        let timeouts = TaskPerRequest {
            spawner: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
        };
        Ok(DashMapPurgatory::new(watchers, timeouts))
    }
}

impl<O: DelayedOperation> Timeouts<O> for TaskPerRequest {
    type Wake = Notify;

    /// Spawns the request's task. After shutdown the runtime drops the task unpolled,
    /// and with it the guard, which expires the request at once.
    fn arm(&self, watchers: &Arc<Watchers<O, Notify>>, (slot, deadline): Pending<O, Notify>) {
        let expire = ExpireOnDrop {
            watchers: Arc::clone(watchers),
            slot,
        };
        self.spawner.spawn(async move {
            tokio::select! {
                biased;
                () = expire.slot.waker().notified() => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
            drop(expire);
        });
    }

    /// Shuts the runtime down: every task still waiting is dropped, which expires its
    /// request (on this thread or a worker's).
    fn shutdown(&self) {
        if let Some(runtime) = self.runtime.lock().take() {
            drop(runtime);
        }
    }
}
