//! The `tokio-delayqueue` peer: one task on a current-thread runtime of its own thread
//! drives a `tokio_util::time::DelayQueue` of every waiting request's deadline; watches
//! hand requests to it through an unbounded `tokio::sync::mpsc` channel (one message per
//! watch batch); watcher lists are the shared [`Watchers`] in a `DashMap`.
//!
//! Deletion is lazy: a request completed by force or by an event leaves its entry in
//! the queue, and the driver skips it when its deadline comes (removing it would need
//! the queue's key back on the completing thread, i.e. a second message to the driver).
//!
//! The hand-off never pushes back: a watch returns as soon as its message is queued,
//! however far behind the driver is. At an offered rate the driver cannot serve, the
//! load tool still sees its rate "held" while the channel grows, expiries come later
//! and later, and memory climbs: read this peer's held rate next to its expiry lateness
//! and peak RSS.
//!
//! # Invariants
//! - Exactly-once completion is the slot's (see [`Watchers`]); the driver's expiry of an
//!   entry whose request already completed does nothing.
//! - The deadline is read on the watching thread, before the hand-off, so time spent in
//!   the channel counts as lateness, never as extra timeout.
//! - Shutdown: the driver stops and drops its queue and channel; every request still
//!   pending is listed under some key, and [`Watchers::expire_all`] expires it (the
//!   queue has no way to hand back its entries in linear time: `peek` scans a wheel
//!   slot). A watch whose message the stopped driver refuses expires its requests on
//!   the spot.

use std::future::poll_fn;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;
use purgatory::{Completion, DelayedOperation};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::time::DelayQueue;

use super::dashmap_watchers::{Slot, Watched, WatcherStats, Watchers};

type QueuedSlot<O> = Arc<Slot<O, ()>>;

/// A watched request of a [`TokioDelayQueuePurgatory`], for forced completion.
pub struct DelayQueueHandle<O>(QueuedSlot<O>);

/// What watches send the driver.
enum Message<O> {
    /// One request and its deadline.
    One(QueuedSlot<O>, Instant),
    /// The waiting requests of one watch batch, with their deadlines.
    Batch(Vec<(QueuedSlot<O>, Instant)>),
    /// Stop.
    Shutdown,
}

/// A purgatory whose timeouts are one `DelayQueue` driven by one tokio task.
pub struct TokioDelayQueuePurgatory<O> {
    watchers: Arc<Watchers<O, ()>>,
    to_driver: UnboundedSender<Message<O>>,
    driver: Mutex<Option<JoinHandle<()>>>,
}

impl<O: DelayedOperation> TokioDelayQueuePurgatory<O> {
    /// Starts the driver's thread and runtime; purges once `purge_interval` completed
    /// entries are listed (Kafka's default is 1,000).
    pub fn start(purge_interval: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        let watchers = Arc::new(Watchers::new(purge_interval));
        let (to_driver, inbox) = unbounded_channel();
        let for_driver = Arc::clone(&watchers);
        let driver = std::thread::Builder::new()
            .name("tokio-delayqueue".into())
            .spawn(move || runtime.block_on(drive(inbox, &for_driver)))?;
        Ok(TokioDelayQueuePurgatory {
            watchers,
            to_driver,
            driver: Mutex::new(Some(driver)),
        })
    }

    /// Tries `op`; if not ready, lists it on `keys` and hands its deadline to the
    /// driver. Returns a handle while it waits, `None` if it completed here.
    pub fn watch(&self, op: O, keys: &[u64]) -> Option<DelayQueueHandle<O>> {
        let deadline = Instant::now() + op.timeout();
        let Watched::Pending(slot) = self.watchers.watch(op, keys) else {
            return None;
        };
        self.send(Message::One(Arc::clone(&slot), deadline));
        Some(DelayQueueHandle(slot))
    }

    /// Watches a batch like [`watch`](Self::watch) on each, with one message to the
    /// driver for all the requests that wait. Appends one result per request to `out`.
    pub fn watch_batch<'k>(
        &self,
        batch: impl IntoIterator<Item = (O, &'k [u64])>,
        out: &mut Vec<Option<DelayQueueHandle<O>>>,
    ) {
        let mut waiting = Vec::new();
        for (op, keys) in batch {
            let deadline = Instant::now() + op.timeout();
            match self.watchers.watch(op, keys) {
                Watched::Pending(slot) => {
                    waiting.push((Arc::clone(&slot), deadline));
                    out.push(Some(DelayQueueHandle(slot)));
                }
                Watched::Completed => out.push(None),
            }
        }
        if !waiting.is_empty() {
            self.send(Message::Batch(waiting));
        }
    }

    /// Completes the request now unless it already completed; true if this call did.
    /// Its queue entry stays until its deadline.
    pub fn force_complete(&self, handle: &DelayQueueHandle<O>) -> bool {
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

    /// Stops the driver, waits for it, and expires every request still pending.
    pub fn shutdown(&self) {
        self.send(Message::Shutdown);
        if let Some(driver) = self.driver.lock().take() {
            let _ = driver.join();
        }
        self.watchers.expire_all();
    }

    /// Hands `message` to the driver; if the driver is gone, expires its requests here.
    fn send(&self, message: Message<O>) {
        let Err(refused) = self.to_driver.send(message) else {
            return;
        };
        let expire = |slot: &QueuedSlot<O>| self.watchers.complete(slot, Completion::Expired);
        match refused.0 {
            Message::One(slot, _) => {
                expire(&slot);
            }
            Message::Batch(batch) => {
                for (slot, _) in &batch {
                    expire(slot);
                }
            }
            Message::Shutdown => {}
        }
    }
}

impl<O> Drop for TokioDelayQueuePurgatory<O> {
    fn drop(&mut self) {
        let _ = self.to_driver.send(Message::Shutdown);
        if let Some(driver) = self.driver.lock().take() {
            let _ = driver.join();
        }
    }
}

/// The driver task: files deadlines as they arrive and expires requests as their
/// deadlines pass, until told to shut down (or every sender is gone). What it leaves
/// pending, the purgatory's shutdown expires.
async fn drive<O: DelayedOperation>(
    mut inbox: UnboundedReceiver<Message<O>>,
    watchers: &Watchers<O, ()>,
) {
    let mut queue: DelayQueue<QueuedSlot<O>> = DelayQueue::new();
    loop {
        tokio::select! {
            message = inbox.recv() => match message {
                Some(Message::One(slot, at)) => {
                    queue.insert_at(slot, at.into());
                }
                Some(Message::Batch(batch)) => {
                    for (slot, at) in batch {
                        queue.insert_at(slot, at.into());
                    }
                }
                Some(Message::Shutdown) | None => break,
            },
            // Ready(None) when the queue is empty: the branch is off until the next turn.
            Some(expired) = poll_fn(|cx| queue.poll_expired(cx)) => {
                let slot = expired.into_inner();
                if !slot.is_done() {
                    watchers.complete(&slot, Completion::Expired);
                }
            }
        }
    }
}

impl<O: DelayedOperation> crate::workloads::w3::LoadPurgatory<O> for TokioDelayQueuePurgatory<O> {
    type Handle = DelayQueueHandle<O>;

    #[inline]
    fn watch(&self, op: O, keys: &[u64]) -> Option<DelayQueueHandle<O>> {
        TokioDelayQueuePurgatory::watch(self, op, keys)
    }

    fn watch_batch(&self, batch: &mut Vec<(O, &[u64])>, out: &mut Vec<Option<Self::Handle>>) {
        TokioDelayQueuePurgatory::watch_batch(self, batch.drain(..), out);
    }

    #[inline]
    fn force_complete(&self, handle: &DelayQueueHandle<O>) -> bool {
        TokioDelayQueuePurgatory::force_complete(self, handle)
    }

    #[inline]
    fn check_and_complete(&self, key: u64) -> usize {
        TokioDelayQueuePurgatory::check_and_complete(self, key)
    }

    fn shutdown(&self) {
        TokioDelayQueuePurgatory::shutdown(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::test_ops::{wait_for, Logged};

    #[test]
    fn event_force_and_expiry_each_complete_once() {
        let p = TokioDelayQueuePurgatory::start(10).unwrap();
        let ops = Logged::default();
        assert!(p.watch(ops.op(60_000), &[1, 2]).is_some());
        let mut out = Vec::new();
        p.watch_batch([(ops.op(60_000), &[2][..]), (ops.op(20), &[3])], &mut out);
        let forced = out[0].take().unwrap();
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
        let p = TokioDelayQueuePurgatory::start(10).unwrap();
        let ops = Logged::default();
        assert!(p.watch(ops.op(60_000), &[1]).is_some());
        p.shutdown();
        assert_eq!(p.stats().expired, 1);
        p.watch(ops.op(60_000), &[1]);
        assert_eq!(ops.log(), [Completion::Expired, Completion::Expired]);
    }
}
