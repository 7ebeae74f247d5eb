//! The `tokio-task` peer: every waiting request is a tokio task of its own that waits
//! for whichever comes first, a wake-up (`tokio::sync::Notify`) from whoever completed
//! the request, or a `tokio::time::sleep_until` of its deadline; watcher lists are the
//! shared [`Watchers`] in a `DashMap`. This is what a broker written on tokio does
//! first: one future per parked request, the runtime's timer wheel for its timeout.
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
//! - The deadline is read on the watching thread before the spawn, so time spent in the
//!   runtime's queues counts as lateness, never as extra timeout.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use purgatory::{Completion, DelayedOperation};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Notify;

use super::dashmap_watchers::{Slot, Wake, Watched, WatcherStats, Watchers};

impl Wake for Notify {
    #[inline]
    fn wake(&self) {
        self.notify_one();
    }
}

type TaskSlot<O> = Slot<O, Notify>;

/// A watched request of a [`TokioTaskPurgatory`], for forced completion.
pub struct TokioTaskHandle<O>(Arc<TaskSlot<O>>);

/// A purgatory of one tokio task per waiting request.
pub struct TokioTaskPurgatory<O> {
    watchers: Arc<Watchers<O, Notify>>,
    runtime: Mutex<Option<Runtime>>,
    spawner: Handle,
}

/// Expires its request, if still pending, when dropped.
struct ExpireOnDrop<O: DelayedOperation> {
    watchers: Arc<Watchers<O, Notify>>,
    slot: Arc<TaskSlot<O>>,
}

impl<O: DelayedOperation> Drop for ExpireOnDrop<O> {
    fn drop(&mut self) {
        self.watchers.complete(&self.slot, Completion::Expired);
    }
}

impl<O: DelayedOperation> TokioTaskPurgatory<O> {
    /// Starts a multi-threaded runtime with one worker per core; purges once
    /// `purge_interval` completed entries are listed (Kafka's default is 1,000).
    pub fn start(purge_interval: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name("tokio-task-worker")
            .enable_time()
            .build()?;
        Ok(TokioTaskPurgatory {
            watchers: Arc::new(Watchers::new(purge_interval)),
            spawner: runtime.handle().clone(),
            runtime: Mutex::new(Some(runtime)),
        })
    }

    /// Tries `op`; if not ready, lists it on `keys` and spawns its waiting task. Returns
    /// a handle while it waits, `None` if it completed here.
    pub fn watch(&self, op: O, keys: &[u64]) -> Option<TokioTaskHandle<O>> {
        let deadline = Instant::now() + op.timeout();
        let Watched::Pending(slot) = self.watchers.watch(op, keys) else {
            return None;
        };
        let expire = ExpireOnDrop {
            watchers: Arc::clone(&self.watchers),
            slot: Arc::clone(&slot),
        };
        // After shutdown the runtime drops the task unpolled, and with it the guard,
        // which expires the request at once.
        self.spawner.spawn(async move {
            tokio::select! {
                biased;
                () = expire.slot.waker().notified() => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
            drop(expire);
        });
        Some(TokioTaskHandle(slot))
    }

    /// Completes the request now unless it already completed; true if this call did.
    pub fn force_complete(&self, handle: &TokioTaskHandle<O>) -> bool {
        self.watchers.complete(&handle.0, Completion::Forced)
    }

    /// Tries every request watched on `key`; returns how many this call completed.
    pub fn check_and_complete(&self, key: u64) -> usize {
        self.watchers.check_and_complete(key)
    }

    /// Counters.
    pub fn stats(&self) -> WatcherStats {
        self.watchers.stats()
    }

    /// Shuts the runtime down: every task still waiting is dropped, which expires its
    /// request (on this thread or a worker's); later watches expire at once.
    pub fn shutdown(&self) {
        if let Some(runtime) = self.runtime.lock().take() {
            drop(runtime);
        }
        self.watchers.expire_all();
    }
}

impl<O: DelayedOperation> crate::workloads::w3::LoadPurgatory<O> for TokioTaskPurgatory<O> {
    type Handle = TokioTaskHandle<O>;

    #[inline]
    fn watch(&self, op: O, keys: &[u64]) -> Option<TokioTaskHandle<O>> {
        TokioTaskPurgatory::watch(self, op, keys)
    }

    #[inline]
    fn force_complete(&self, handle: &TokioTaskHandle<O>) -> bool {
        TokioTaskPurgatory::force_complete(self, handle)
    }

    #[inline]
    fn check_and_complete(&self, key: u64) -> usize {
        TokioTaskPurgatory::check_and_complete(self, key)
    }

    fn shutdown(&self) {
        TokioTaskPurgatory::shutdown(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::test_ops::{wait_for, Logged};

    #[test]
    fn event_force_and_expiry_each_complete_once() {
        let p = TokioTaskPurgatory::start(10).unwrap();
        let ops = Logged::default();
        assert!(p.watch(ops.op(60_000), &[1, 2]).is_some());
        let forced = p.watch(ops.op(60_000), &[2]).unwrap();
        assert!(p.watch(ops.op(20), &[3]).is_some());
        ops.release(0);
        assert_eq!(p.check_and_complete(2), 1);
        assert_eq!(p.check_and_complete(1), 0, "already completed via key 2");
        assert!(p.force_complete(&forced));
        assert!(!p.force_complete(&forced));
        wait_for(|| p.stats().expired == 1);
        assert_eq!(
            ops.log(),
            [Completion::Ready, Completion::Forced, Completion::Expired]
        );
        assert_eq!(ops.early_expiries(), 0);
        p.shutdown();
    }

    #[test]
    fn shutdown_expires_what_waits_and_what_comes_after() {
        let p = TokioTaskPurgatory::start(10).unwrap();
        let ops = Logged::default();
        assert!(p.watch(ops.op(60_000), &[1]).is_some());
        p.shutdown();
        assert_eq!(p.stats().expired, 1);
        p.watch(ops.op(60_000), &[1]);
        wait_for(|| p.stats().expired == 2);
        assert_eq!(ops.log(), [Completion::Expired, Completion::Expired]);
    }
}
