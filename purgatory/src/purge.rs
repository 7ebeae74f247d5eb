//! Purging: dropping the entries of completed operations from lists nobody checks.
//!
//! # Policy
//! A purge runs when enough completed entries are listed for it to pay for itself: at
//! least the purge interval, and at least as many as the live entries. A purge visits
//! every entry of the shards it passes, so the second condition makes it remove at least
//! one entry for every two it visits (amortised O(1) per completed entry), and keeps the
//! lists within twice their live size plus the purge interval.
//!
//! # Invariants
//! - The reaper purges between timer rounds, one watcher shard at a time, and stops to
//!   let the timer run as soon as a bucket is due; after a full pass it stops even if
//!   the (estimated) counts still say a purge is due, so a drifted estimate cannot make
//!   the reaper spin.
//! - A purge reads only the dense generation tags (`OpTable::may_be_waiting`), so it
//!   keeps an entry whose tag collides with its slot's current one: it is dropped by a
//!   later look.

use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::counters::Count;
use crate::operation::DelayedOperation;
use crate::state::State;

/// When to purge, and where the next purge starts.
pub(crate) struct PurgePolicy {
    /// Completed entries still listed before a purge is considered.
    interval: i64,
    /// The shard the next purge step visits first.
    cursor: AtomicUsize,
}

impl PurgePolicy {
    pub(crate) fn new(interval: usize) -> Self {
        PurgePolicy {
            // Counts are i64; an interval beyond that means "practically never".
            interval: interval.min(i64::MAX as usize) as i64,
            cursor: AtomicUsize::new(0),
        }
    }
}

impl<K: Hash + Eq + Clone, O: DelayedOperation> State<K, O> {
    /// Drops the completed entries of watcher shard `index`; returns how many.
    pub(crate) fn purge_shard(&self, index: usize) -> usize {
        let removed = self
            .watchers
            .purge_shard(index, |at| self.table.may_be_waiting(at));
        if removed > 0 {
            self.counters.add(Count::Purged, removed as u64);
        }
        removed
    }

    /// Whether a purge is due (see the module doc).
    pub(crate) fn purge_due(&self) -> bool {
        let stale = self.watchers.stale();
        stale >= self.purge.interval && stale * 2 >= self.watchers.listed()
    }

    /// Purges shard after shard while a purge is due, stopping as soon as the timer has a
    /// bucket due. Returns whether it stopped early to let the timer run (so the caller
    /// should come straight back).
    pub(crate) fn purge_some(&self) -> bool {
        if !self.purge_due() {
            return false;
        }
        let shards = self.watchers.shard_count();
        let mut removed = 0;
        let mut visited = 0;
        let mut yielded = false;
        while visited < shards {
            let index = self.purge.cursor.fetch_add(1, Ordering::Relaxed) % shards;
            removed += self.purge_shard(index);
            visited += 1;
            if self.watchers.stale() < self.purge.interval / 2 {
                break;
            }
            if self
                .timer
                .next_expiration()
                .is_some_and(|due| due <= self.timer.now())
            {
                yielded = visited < shards;
                break;
            }
        }
        tracing::debug!(target: "purgatory", purgatory = %self.name, removed, shards = visited, "purge");
        yielded
    }
}
