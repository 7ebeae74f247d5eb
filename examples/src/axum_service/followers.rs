//! The axum service's simulated followers: tokio tasks that copy each append a fixed
//! delay after it, then tell the produce purgatory, so that a produce waiting for `acks`
//! copies completes.
//!
//! # Invariants
//! - A follower copies an append no sooner than `delay` after it: notices are queued in
//!   append order and each waits until its own due time.
//! - After recording a copy, the follower calls `check_and_complete` on the topic's key,
//!   so a produce that the copy satisfies is answered then (the purgatory never misses a
//!   copy made while the produce was being parked).
//! - [`Followers::stop`] aborts the tasks; so does dropping the `Followers` (their
//!   channels close). A follower task holds the produce purgatory weakly
//!   (`WeakPurgatory`): it never keeps it alive, and ends once it is gone.
//! - The channels are unbounded: an append never waits for a follower. A follower that
//!   falls behind holds one small notice per append it has not copied yet.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use purgatory::{Purgatory, WeakPurgatory};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::produce::DelayedProduce;
use super::topics::Topic;

/// An append a follower is to copy.
struct Notice {
    topic: Arc<Topic>,
    end: u64,
    due: Instant,
}

/// The simulated followers of every topic.
#[derive(Debug)]
pub struct Followers {
    notices: Vec<mpsc::UnboundedSender<Notice>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    delay: Duration,
}

impl Followers {
    /// Spawns `count` followers on the current runtime, each copying `delay` after an
    /// append and telling `produces`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn spawn(
        count: usize,
        delay: Duration,
        produces: &Purgatory<String, DelayedProduce>,
    ) -> Self {
        let (notices, tasks) = (0..count)
            .map(|follower| {
                let (sender, receiver) = mpsc::unbounded_channel();
                let task = tokio::spawn(follow(follower, receiver, produces.downgrade()));
                (sender, task)
            })
            .unzip();
        Followers {
            notices,
            tasks: Mutex::new(tasks),
            delay,
        }
    }

    /// How many followers there are: the most `acks` a produce can wait for.
    pub fn count(&self) -> usize {
        self.notices.len()
    }

    /// Tells every follower that `topic` now ends at `end`.
    pub fn replicate(&self, topic: &Arc<Topic>, end: u64) {
        let due = Instant::now() + self.delay;
        for notices in &self.notices {
            // A stopped follower copies nothing more: its produces time out or were
            // answered by the shutdown.
            let _ = notices.send(Notice {
                topic: Arc::clone(topic),
                end,
                due,
            });
        }
    }

    /// Stops every follower now, with whatever it had still to copy.
    pub fn stop(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }
}

/// One follower: copies each notice when it is due, then checks the topic's produces.
async fn follow(
    follower: usize,
    mut notices: mpsc::UnboundedReceiver<Notice>,
    produces: WeakPurgatory<String, DelayedProduce>,
) {
    while let Some(notice) = notices.recv().await {
        tokio::time::sleep_until(notice.due).await;
        notice.topic.copied_to(follower, notice.end);
        let Some(produces) = produces.upgrade() else {
            return; // the service is gone, and its purgatory with it
        };
        produces.check_and_complete(notice.topic.name());
    }
}
