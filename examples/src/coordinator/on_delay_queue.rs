//! The coordinator's sessions on a tokio-util `DelayQueue`, written as a careful tokio
//! user writes it: the queue is not `Sync` and wants `&mut`, so one task on the server's
//! runtime owns it, with each session's key and deadline, and takes commands through an
//! unbounded channel, many at a time (`recv_many`). A heartbeat computes its new deadline
//! and sends it (`reset_at`), then answers at once from the member's "alive" flag, which
//! the task clears when the session expires; it never waits for the task.
//!
//! # Invariants
//! - Only the task touches the queue and the keys, so a key is never used after its
//!   entry expired (`reset_at` on a dead key panics): the task forgets a key when its
//!   entry expires, and a later reset for that member does nothing.
//! - A heartbeat racing its session's expiry may be answered `NONE` (the flag was still
//!   set) for a session the task then finds expired: the one answer this version can get
//!   wrong, which the purgatory's `reset_timeout` (one winner, told to the caller) does not.
//! - Joins wait on a oneshot each; the group's last joiner fires them all, under the
//!   group's lock, so the barrier opens exactly once.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::time::{delay_queue, DelayQueue};

use super::protocol::{Stats, NONE, REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID};
use super::{BoxFuture, Config, Coordinator, Record};

/// What the handlers tell the queue's task.
enum Command {
    /// A session starts, due at the deadline.
    Start(u32, Instant),
    /// A heartbeat: the session's new deadline.
    Reset(u32, Instant),
}

/// A group's barrier.
#[derive(Default)]
struct Barrier {
    joined: u32,
    waiting: Vec<oneshot::Sender<()>>,
}

struct Shared {
    config: Config,
    alive: Box<[AtomicBool]>,
    joined: Box<[AtomicBool]>,
    groups: Box<[Mutex<Barrier>]>,
    record: Record,
}

/// The coordinator on a `DelayQueue`.
pub struct OnDelayQueue {
    shared: Arc<Shared>,
    to_queue: mpsc::UnboundedSender<Command>,
    queue_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl OnDelayQueue {
    /// Spawns the queue's task on the current tokio runtime.
    pub fn new(config: Config) -> Self {
        let members = config.members as usize;
        let shared = Arc::new(Shared {
            config,
            alive: (0..members).map(|_| AtomicBool::new(false)).collect(),
            joined: (0..members).map(|_| AtomicBool::new(false)).collect(),
            groups: (0..config.groups())
                .map(|_| Mutex::new(Barrier::default()))
                .collect(),
            record: Record::default(),
        });
        let (to_queue, commands) = mpsc::unbounded_channel();
        let task = tokio::spawn(drive(commands, Arc::clone(&shared)));
        OnDelayQueue {
            shared,
            to_queue,
            queue_task: Mutex::new(Some(task)),
        }
    }
}

/// The queue's task: applies commands and expires sessions until the channel closes.
async fn drive(mut commands: mpsc::UnboundedReceiver<Command>, shared: Arc<Shared>) {
    let members = shared.config.members as usize;
    let mut queue: DelayQueue<u32> = DelayQueue::with_capacity(members);
    let mut keys: Vec<Option<(delay_queue::Key, Instant)>> = vec![None; members];
    let mut batch = Vec::with_capacity(256);
    let mut expired = Vec::new();
    loop {
        tokio::select! {
            received = commands.recv_many(&mut batch, 256) => {
                if received == 0 {
                    return;
                }
                for command in batch.drain(..) {
                    match command {
                        Command::Start(member, deadline) => {
                            let key = queue.insert_at(member, deadline);
                            keys[member as usize] = Some((key, deadline));
                        }
                        Command::Reset(member, deadline) => {
                            if let Some((key, at)) = &mut keys[member as usize] {
                                queue.reset_at(key, deadline);
                                *at = deadline;
                            }
                        }
                    }
                }
            }
            // Every entry that is due, in one pass (not one per turn of the loop).
            Some(()) = poll_fn(|cx| drain_expired(&mut queue, cx, &mut expired)) => {
                let now = Instant::now();
                for member in expired.drain(..) {
                    if let Some((_, deadline)) = keys[member as usize].take() {
                        shared.alive[member as usize].store(false, Ordering::Release);
                        shared.record.expired(now.saturating_duration_since(deadline));
                    }
                }
            }
        }
    }
}

/// Moves every due entry of `queue` into `into`: `Ready(Some(()))` if there was one,
/// `Ready(None)` when the queue is empty, `Pending` otherwise (the queue then wakes the
/// task when its next entry is due).
fn drain_expired(
    queue: &mut DelayQueue<u32>,
    cx: &mut std::task::Context<'_>,
    into: &mut Vec<u32>,
) -> std::task::Poll<Option<()>> {
    use std::task::Poll;
    loop {
        match queue.poll_expired(cx) {
            Poll::Ready(Some(expired)) => into.push(expired.into_inner()),
            Poll::Ready(None) if into.is_empty() => return Poll::Ready(None),
            Poll::Pending if into.is_empty() => return Poll::Pending,
            Poll::Ready(None) | Poll::Pending => return Poll::Ready(Some(())),
        }
    }
}

impl Coordinator for OnDelayQueue {
    fn join(&self, member: u32) -> BoxFuture<u8> {
        let shared = Arc::clone(&self.shared);
        if member >= shared.config.members {
            return Box::pin(async { UNKNOWN_MEMBER_ID });
        }
        if shared.joined[member as usize].swap(true, Ordering::AcqRel) {
            return Box::pin(async { REBALANCE_IN_PROGRESS });
        }
        let group = member / shared.config.group_size;
        let (opened, barrier) = oneshot::channel();
        {
            let mut group_barrier = shared.groups[group as usize].lock();
            group_barrier.joined += 1;
            group_barrier.waiting.push(opened);
            if group_barrier.joined == shared.config.group_members(group) {
                for waiting in group_barrier.waiting.drain(..) {
                    let _ = waiting.send(());
                }
            }
        }
        let to_queue = self.to_queue.clone();
        Box::pin(async move {
            match tokio::time::timeout(shared.config.rebalance_timeout, barrier).await {
                Ok(Ok(())) => {
                    shared.alive[member as usize].store(true, Ordering::Release);
                    let deadline = Instant::now() + shared.config.session_timeout;
                    match to_queue.send(Command::Start(member, deadline)) {
                        Ok(()) => NONE,
                        Err(_) => REBALANCE_IN_PROGRESS,
                    }
                }
                _ => REBALANCE_IN_PROGRESS,
            }
        })
    }

    fn heartbeat(&self, member: u32) -> u8 {
        let shared = &self.shared;
        let alive = shared
            .alive
            .get(member as usize)
            .is_some_and(|alive| alive.load(Ordering::Acquire));
        let deadline = Instant::now() + shared.config.session_timeout;
        if alive && self.to_queue.send(Command::Reset(member, deadline)).is_ok() {
            NONE
        } else {
            shared.record.unknown();
            UNKNOWN_MEMBER_ID
        }
    }

    fn stats(&self) -> Stats {
        self.shared.record.stats()
    }

    fn shutdown(&self) -> BoxFuture<()> {
        let task = self.queue_task.lock().take();
        Box::pin(async move {
            if let Some(task) = task {
                task.abort();
                let _ = task.await;
            }
        })
    }
}
