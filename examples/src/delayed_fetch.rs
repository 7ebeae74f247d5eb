//! The delayed operation of a long-polling fetch: done when at least `min_bytes` of
//! committed data lie past the fetch offsets, or at `max_wait` with whatever is there.
//!
//! Watched on every partition fetched; woken by `check_and_complete` when a partition's high
//! watermark moves (an append without followers, a follower advance with them).
//!
//! Invariants:
//! - `try_complete` reads only atomics (the partitions' committed byte positions); no lock.
//! - Bytes are counted from the start of the batch holding the fetch offset (what the
//!   answer will carry), each partition capped at its `max_bytes`.
//! - The operation only signals; the requester reads the data after the signal, so the
//!   answer carries everything committed by then (never less than what woke it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use purgatory::{Completion, DelayedOperation, Reply};

use crate::partition::{Partition, PartitionKey};

/// One partition a fetch waits on.
#[derive(Debug, Clone)]
pub struct BytesWait {
    /// The partition's purgatory key.
    pub key: PartitionKey,
    /// The partition.
    pub partition: Arc<Partition>,
    /// Byte position of the batch holding the fetch offset.
    pub start_position: u64,
    /// The most this partition may contribute.
    pub max_bytes: u64,
}

impl BytesWait {
    /// Committed bytes available to this fetch in this partition.
    pub fn available(&self) -> u64 {
        self.partition
            .committed_position()
            .saturating_sub(self.start_position)
            .min(self.max_bytes)
    }
}

/// How a long poll ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchCompletion {
    /// `Ready`: `min_bytes` were there; `Expired`: `max_wait` passed first.
    pub how: Completion,
    /// Committed bytes available when it completed.
    pub available: u64,
    /// When it completed.
    pub completed_at: Instant,
}

/// A fetch waiting for data.
pub struct DelayedFetch {
    max_wait: Duration,
    min_bytes: u64,
    waits: Vec<BytesWait>,
    reply: Reply<FetchCompletion>,
}

impl DelayedFetch {
    /// A fetch waiting up to `max_wait` for `min_bytes` over `waits`.
    /// It answers through `reply` (made by `Purgatory::park_with`).
    pub fn new(
        max_wait: Duration,
        min_bytes: u64,
        waits: Vec<BytesWait>,
        reply: Reply<FetchCompletion>,
    ) -> DelayedFetch {
        DelayedFetch {
            max_wait,
            min_bytes,
            waits,
            reply,
        }
    }

    /// The keys to watch it on (each partition once).
    pub fn keys(&self) -> Vec<PartitionKey> {
        PartitionKey::distinct(self.waits.iter().map(|w| w.key))
    }

    /// Committed bytes available to this fetch now.
    pub fn available(&self) -> u64 {
        self.waits.iter().map(BytesWait::available).sum()
    }
}

impl DelayedOperation for DelayedFetch {
    fn timeout(&self) -> Duration {
        self.max_wait
    }

    fn try_complete(&mut self) -> bool {
        self.available() >= self.min_bytes
    }

    fn on_complete(&mut self, how: Completion) {
        let available = self.available();
        self.reply.send(
            how,
            FetchCompletion {
                how,
                available,
                completed_at: Instant::now(),
            },
        );
    }
}
