//! The `tokio-delayqueue` peer: one task on a current-thread runtime of its own thread
//! drives a `tokio_util::time::DelayQueue` of every waiting request's deadline; watches
//! hand requests to it through an unbounded `tokio::sync::mpsc` channel (one message per
//! watch batch). Watcher lists, forcing and events are the shared front
//! ([`DashMapPurgatory`]).
//!
//! Deletion is lazy: a request completed by force or by an event leaves its entry in
//! the queue, and the driver skips it when its deadline comes (removing it would need
//! the queue's key back on the completing thread, i.e. a second message to the driver).
//! The driver also sweeps the watcher lists every [`SWEEP_EVERY`] once enough completed
//! entries are listed ([`Watchers::sweep_if_due`]), so no request's path ever rescans
//! them.
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
//! - Shutdown: the driver stops and drops its queue and channel; the front then
//!   expires every request still listed (the queue cannot hand back its entries in
//!   linear time: `peek` scans a wheel slot). A request whose message the stopped
//!   driver refuses expires on the spot.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use purgatory::{Completion, DelayedOperation};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_util::time::DelayQueue;

use super::dashmap_purgatory::{DashMapPurgatory, Pending, Timeouts};
use super::dashmap_watchers::{Slot, Watchers};

type QueuedSlot<O> = Arc<Slot<O, ()>>;

/// How often the driver looks whether the watcher lists need a sweep (our reaper's
/// longest sleep while anything is pending).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// What watches send the driver.
enum Message<O> {
    /// One request and its deadline.
    One(Pending<O, ()>),
    /// The waiting requests of one watch batch, with their deadlines.
    Batch(Vec<Pending<O, ()>>),
    /// Stop.
    Shutdown,
}

/// A purgatory whose timeouts are one `DelayQueue` driven by one tokio task.
pub type TokioDelayQueuePurgatory<O> = DashMapPurgatory<O, DelayQueueDriver<O>>;

/// The timer of [`TokioDelayQueuePurgatory`]: the channel to the driver, and its thread.
pub struct DelayQueueDriver<O> {
    to_driver: UnboundedSender<Message<O>>,
    driver: Mutex<Option<JoinHandle<()>>>,
}

impl<O: DelayedOperation> TokioDelayQueuePurgatory<O> {
    /// Starts the driver's thread and runtime; the driver sweeps the watcher lists once
    /// `purge_interval` completed entries are listed (Kafka's default is 1,000).
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
        let timeouts = DelayQueueDriver {
            to_driver,
            driver: Mutex::new(Some(driver)),
        };
        Ok(DashMapPurgatory::new(watchers, timeouts))
    }
}

impl<O: DelayedOperation> DelayQueueDriver<O> {
    /// Hands `message` to the driver; if the driver is gone, expires its requests here.
    fn send(&self, watchers: &Watchers<O, ()>, message: Message<O>) {
        let Err(refused) = self.to_driver.send(message) else {
            return;
        };
        let refused = match refused.0 {
            Message::One(one) => vec![one],
            Message::Batch(batch) => batch,
            Message::Shutdown => return,
        };
        for (slot, _) in refused {
            watchers.complete(&slot, Completion::Expired);
        }
    }
}

impl<O> DelayQueueDriver<O> {
    /// Tells the driver to stop and waits for it (once; later calls do nothing).
    fn stop(&self) {
        let _ = self.to_driver.send(Message::Shutdown);
        if let Some(driver) = self.driver.lock().take() {
            let _ = driver.join();
        }
    }
}

impl<O: DelayedOperation> Timeouts<O> for DelayQueueDriver<O> {
    type Wake = ();

    fn arm(&self, watchers: &Arc<Watchers<O, ()>>, pending: Pending<O, ()>) {
        self.send(watchers, Message::One(pending));
    }

    /// One message for the whole batch.
    fn arm_batch(&self, watchers: &Arc<Watchers<O, ()>>, pending: Vec<Pending<O, ()>>) {
        self.send(watchers, Message::Batch(pending));
    }

    /// Stops the driver and waits for it.
    fn shutdown(&self) {
        self.stop();
    }
}

impl<O> Drop for DelayQueueDriver<O> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Messages the driver takes off its channel at a time.
const INBOX_BATCH: usize = 256;

/// The driver task: files deadlines as they arrive and expires requests as their
/// deadlines pass, until told to shut down (or every sender is gone). What it leaves
/// pending, the purgatory's shutdown expires. Each wake-up drains what is there: up to
/// [`INBOX_BATCH`] messages at once, then every deadline already due, so the task pays
/// one turn of its `select!` per batch, not per request.
async fn drive<O: DelayedOperation>(
    mut inbox: UnboundedReceiver<Message<O>>,
    watchers: &Watchers<O, ()>,
) {
    let mut queue: DelayQueue<QueuedSlot<O>> = DelayQueue::new();
    let mut messages = Vec::with_capacity(INBOX_BATCH);
    let mut sweep = tokio::time::interval(SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = sweep.tick() => {
                watchers.sweep_if_due();
            }
            received = inbox.recv_many(&mut messages, INBOX_BATCH) => {
                if received == 0 {
                    break; // every sender is gone
                }
                for message in messages.drain(..) {
                    match message {
                        Message::One((slot, at)) => {
                            queue.insert_at(slot, at.into());
                        }
                        Message::Batch(batch) => {
                            for (slot, at) in batch {
                                queue.insert_at(slot, at.into());
                            }
                        }
                        Message::Shutdown => return,
                    }
                }
            }
            // Ready(None) when the queue is empty: the branch is off until the next turn.
            Some(expired) = poll_fn(|cx| queue.poll_expired(cx)) => {
                expire(watchers, expired.into_inner());
                // And every other deadline already due, without another turn.
                while let Poll::Ready(Some(expired)) =
                    poll_fn(|cx| Poll::Ready(queue.poll_expired(cx))).await
                {
                    expire(watchers, expired.into_inner());
                }
            }
        }
    }
}

/// Expires the request of `slot` unless it completed meanwhile (lazy deletion).
fn expire<O: DelayedOperation>(watchers: &Watchers<O, ()>, slot: QueuedSlot<O>) {
    if !slot.is_done() {
        watchers.complete(&slot, Completion::Expired);
    }
}
