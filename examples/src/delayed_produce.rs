//! The delayed operation of an acks=all produce: done when the high watermark of every
//! partition it wrote has reached the end of what it wrote.
//!
//! Watched on every partition it wrote; woken by `check_and_complete` when a follower
//! advances. Its answer goes out through a one-shot channel, once, from `on_complete`.
//!
//! Invariants:
//! - `try_complete` reads only atomics (the partitions' high watermarks): it takes no lock, so
//!   it is safe to call `check_and_complete` from any thread that holds no purgatory lock.
//! - The reply holds one acknowledgement per partition, in the order the partitions were
//!   given; a partition is acknowledged when its high watermark reached its required offset
//!   by the time of completion. On expiry the others are "request timed out".

use std::sync::Arc;
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Reply};

use crate::partition::{Partition, PartitionKey};

/// One partition an acks=all produce waits on.
#[derive(Debug, Clone)]
pub struct ReplicaWait {
    /// The partition's purgatory key.
    pub key: PartitionKey,
    /// The partition.
    pub partition: Arc<Partition>,
    /// The offset after the request's last record in this partition.
    pub required_offset: i64,
}

impl ReplicaWait {
    fn acknowledged(&self) -> bool {
        self.partition.high_watermark() >= self.required_offset
    }
}

/// How an acks=all produce ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceCompletion {
    /// What completed the operation.
    pub how: Completion,
    /// Per partition (in request order): whether its records reached every in-sync replica.
    pub acknowledged: Vec<bool>,
    /// When the operation completed.
    pub completed_at: Instant,
}

/// An acks=all produce waiting for its followers.
pub struct DelayedProduce {
    timeout: Duration,
    waits: Vec<ReplicaWait>,
    reply: Reply<ProduceCompletion>,
}

impl DelayedProduce {
    /// A produce that waits up to `timeout` for `waits`, answering through `reply` (made
    /// by `Purgatory::park_with`).
    pub fn new(
        timeout: Duration,
        waits: Vec<ReplicaWait>,
        reply: Reply<ProduceCompletion>,
    ) -> DelayedProduce {
        DelayedProduce {
            timeout,
            waits,
            reply,
        }
    }

    /// The keys to watch it on (each partition once).
    pub fn keys(&self) -> Vec<PartitionKey> {
        PartitionKey::distinct(self.waits.iter().map(|w| w.key))
    }
}

impl DelayedOperation for DelayedProduce {
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn try_complete(&mut self) -> bool {
        self.waits.iter().all(ReplicaWait::acknowledged)
    }

    fn on_complete(&mut self, how: Completion) {
        let acknowledged = self.waits.iter().map(ReplicaWait::acknowledged).collect();
        // The requester may have gone away; then nobody needs the answer.
        self.reply.send(
            how,
            ProduceCompletion {
                how,
                acknowledged,
                completed_at: Instant::now(),
            },
        );
    }
}
