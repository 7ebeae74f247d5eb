//! The front the two tokio peers share: a purgatory over [`Watchers`] (watcher lists
//! in a `DashMap`, an exactly-once slot per request) whose timeouts are a plug-in,
//! [`Timeouts`]. `tokio-task` plugs in a task per request, `tokio-delayqueue` one task
//! driving a `DelayQueue`; everything else (watch, force, check, shutdown, counters) is
//! this file's, so the two peers differ in their timers only.
//!
//! # Invariants
//! - A request's deadline is read on the watching thread, before its timeout is armed,
//!   so time the timer takes to file it counts as lateness, never as extra timeout.
//! - A timeout is armed only for a request still pending after the watch's second try.
//! - Shutdown stops the timer first, then expires every request still listed; every
//!   pending request is listed (see [`Watchers`]), so none is left unanswered.

use std::sync::Arc;
use std::time::Instant;

use purgatory::{Completion, DelayedOperation};

use super::dashmap_watchers::{Slot, Wake, Watched, WatcherStats, Watchers};
use crate::workloads::w3::LoadPurgatory;

/// A request waiting for its timeout: its slot and its deadline.
pub type Pending<O, W> = (Arc<Slot<O, W>>, Instant);

/// How a tokio peer times requests out.
pub trait Timeouts<O: DelayedOperation>: Send + Sync {
    /// How the timer of a request learns that it completed otherwise.
    type Wake: Wake;

    /// Arms one request's timeout: at its deadline the timer completes it as expired
    /// through `watchers` (a no-op if it completed meanwhile).
    fn arm(&self, watchers: &Arc<Watchers<O, Self::Wake>>, pending: Pending<O, Self::Wake>);

    /// Arms the timeouts of requests watched together; like `arm` on each by default.
    fn arm_batch(
        &self,
        watchers: &Arc<Watchers<O, Self::Wake>>,
        pending: Vec<Pending<O, Self::Wake>>,
    ) {
        for one in pending {
            self.arm(watchers, one);
        }
    }

    /// Stops the timer; what it still held is expired by the purgatory afterwards.
    fn shutdown(&self);
}

/// A watched request, for forced completion.
pub struct PendingHandle<O, W>(Arc<Slot<O, W>>);

/// A purgatory of watcher lists in a `DashMap` and a tokio timer `T`.
pub struct DashMapPurgatory<O, T: Timeouts<O>>
where
    O: DelayedOperation,
{
    watchers: Arc<Watchers<O, T::Wake>>,
    timeouts: T,
}

impl<O: DelayedOperation, T: Timeouts<O>> DashMapPurgatory<O, T> {
    /// A purgatory over `watchers` whose timeouts `timeouts` arms.
    pub(super) fn new(watchers: Arc<Watchers<O, T::Wake>>, timeouts: T) -> Self {
        DashMapPurgatory { watchers, timeouts }
    }

    /// Counters.
    pub fn stats(&self) -> WatcherStats {
        self.watchers.stats()
    }
}

impl<O: DelayedOperation, T: Timeouts<O>> LoadPurgatory<O> for DashMapPurgatory<O, T> {
    type Handle = PendingHandle<O, T::Wake>;

    fn watch(&self, op: O, keys: &[u64]) -> Option<Self::Handle> {
        let deadline = Instant::now() + op.timeout();
        let Watched::Pending(slot) = self.watchers.watch(op, keys) else {
            return None;
        };
        self.timeouts
            .arm(&self.watchers, (Arc::clone(&slot), deadline));
        Some(PendingHandle(slot))
    }

    fn watch_batch(&self, batch: &mut Vec<(O, &[u64])>, out: &mut Vec<Option<Self::Handle>>) {
        let mut pending = Vec::new();
        for (op, keys) in batch.drain(..) {
            let deadline = Instant::now() + op.timeout();
            match self.watchers.watch(op, keys) {
                Watched::Pending(slot) => {
                    pending.push((Arc::clone(&slot), deadline));
                    out.push(Some(PendingHandle(slot)));
                }
                Watched::Completed => out.push(None),
            }
        }
        if !pending.is_empty() {
            self.timeouts.arm_batch(&self.watchers, pending);
        }
    }

    fn force_complete(&self, handle: &Self::Handle) -> bool {
        self.watchers.complete(&handle.0, Completion::Forced)
    }

    fn check_and_complete(&self, key: u64) -> usize {
        self.watchers.check_and_complete(key)
    }

    fn shutdown(&self) {
        self.timeouts.shutdown();
        self.watchers.expire_all();
    }
}

#[cfg(test)]
mod tests {
    use crate::peers::test_ops::passes_the_purgatory_checks;
    use crate::peers::{TokioDelayQueuePurgatory, TokioTaskPurgatory};

    #[test]
    fn each_request_completes_once_in_both_tokio_peers() {
        let start_task = || TokioTaskPurgatory::start(10).unwrap();
        passes_the_purgatory_checks(start_task, |p| p.stats().expired);
        let start_queue = || TokioDelayQueuePurgatory::start(10).unwrap();
        passes_the_purgatory_checks(start_queue, |p| p.stats().expired);
    }
}
