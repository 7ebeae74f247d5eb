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
//! - The reaper purges between timer rounds, in steps: each step holds one watcher
//!   shard's lock for about [`STEP`] list entries plus at most one segment of a long
//!   list (`watchers.rs`, `op_list.rs`), so a check or a watch on that shard waits for
//!   at most one step. Between steps it stops to let the timer run as soon as a bucket
//!   is due, or while the thread that drops what the give-back frees is unmapping (the
//!   frees of a step may wait for that, `discard.rs`), and resumes where it stopped (the
//!   cursor, which may be inside a list) on its next round; after a full pass over every shard it stops even if the
//!   (estimated) counts still say a purge is due, so a drifted estimate cannot make the
//!   reaper spin.
//! - A purge reads the dense generation tags (`OpTable::is_waiting_by_tag`), and the slot
//!   itself only for the two tags a slot may keep for good (a retired slot's, and an
//!   unfilled one's, in a segment given back and made anew), about one entry in 128.
//!   Otherwise it keeps an entry whose tag collides with its slot's current one (the
//!   slot reused a multiple of 256 times since): a later purge drops it once the slot's
//!   generation moves on, or a check of its key does. While that slot stays free (the
//!   load fell and it is not handed out again) the entry, and its key's list, stay; on a
//!   key nobody checks again, until the slot is used again. Reading the slot of every
//!   entry whose tag matches would settle that too, at a cache miss for each waiting
//!   operation's entry a purge passes, which the tags are there to avoid.

use std::hash::Hash;

use crate::watchers::PurgeCursor;

use crate::counters::Count;
use crate::operation::DelayedOperation;
use crate::state::State;

/// List entries a purge step looks at under one shard lock. Each costs a few cache
/// misses when the lists are cold (its list, its tag, the freeing of an emptied list):
/// measured here at up to 3.7 us each, so a step holds the lock for about a millisecond
/// at most (`purge-lateness` in `docs/benchmarks.md`; 1,024 a step left timeouts up to
/// 4-6 ms late). A step may add one segment of a long list (`op_list.rs`, up to 1,024
/// entries): entries of one list are adjacent and cost far less each (the longest step
/// over a 2,000,000-entry list measured 0.36 ms).
pub(crate) const STEP: usize = 256;

impl<K: Hash + Eq, O: DelayedOperation> State<K, O> {
    /// One purge step (see `watchers.rs`) on shard `index` from `cursor`; counts what it
    /// dropped.
    fn purge_step(&self, index: usize, cursor: PurgeCursor) -> (usize, Option<PurgeCursor>) {
        let pin = self.table.pin();
        // Under loom every tag collides (`TAG_MASK` in `op_table.rs`), so reading the slot
        // of each entry the tag cannot settle is reading every entry's slot word, which
        // made loom 0.7.3 fail an assertion of its own bookkeeping (two stores of a word
        // with one modification order, "TODO: this sometimes fails", tokio-rs/loom#252)
        // in two give-back models. There the
        // purge reads tags alone, as it did before; the same slot read is modelled on
        // the check's path, which also drops what it settles.
        let still_listed = |op| {
            if cfg!(loom) {
                self.table.may_be_waiting(&pin, op)
            } else {
                self.table.is_waiting_by_tag(&pin, op)
            }
        };
        let (removed, next) =
            self.watchers
                .purge_step(index, cursor, STEP, still_listed, &self.user);
        if removed > 0 {
            self.counters.add(Count::Purged, removed as u64);
        }
        (removed, next)
    }

    /// Purges every shard whole, now (`Purgatory::purge`); returns how many entries it
    /// dropped.
    pub(crate) fn purge_all(&self) -> usize {
        let mut removed = 0;
        for index in 0..self.watchers.shard_count() {
            let mut cursor = Some(PurgeCursor::default());
            while let Some(from) = cursor {
                let (dropped, next) = self.purge_step(index, from);
                removed += dropped;
                cursor = next;
            }
        }
        removed
    }

    /// Whether a purge is due (see the module doc).
    pub(crate) fn purge_due(&self) -> bool {
        let stale = self.watchers.stale();
        stale >= self.purge.interval && stale * 2 >= self.watchers.listed()
    }

    /// Purges step after step while a purge is due, stopping as soon as the timer has a
    /// bucket due (the cursor keeps its place). Returns whether it stopped early to let
    /// the timer run (so the caller should come straight back).
    pub(crate) fn purge_some(&self) -> bool {
        if !self.purge_due() {
            return false;
        }
        let shards = self.watchers.shard_count();
        let mut removed = 0;
        let mut finished_shards = 0;
        let mut yielded = false;
        let (index, mut cursor) = *self.purge.position.lock();
        let mut index = index % shards;
        while finished_shards < shards {
            let (dropped, next) = self.purge_step(index, cursor);
            removed += dropped;
            match next {
                Some(next) => cursor = next,
                None => {
                    finished_shards += 1;
                    index = (index + 1) % shards;
                    cursor = PurgeCursor::default();
                }
            }
            if self.watchers.stale() < self.purge.interval / 2 {
                break;
            }
            // Stops for a bucket due, or for an unmapping under way (its frees may wait
            // for it, `discard.rs`): the housekeeping comes back.
            if self.bucket_due() || crate::discard::busy() {
                yielded = finished_shards < shards;
                break;
            }
        }
        *self.purge.position.lock() = (index, cursor);
        crate::user_code::report!(self.user, DEBUG, purgatory = %self.name, removed, shards = finished_shards, "purge");
        yielded
    }
}
