//! The watcher lists: for each key, the operations waiting on it, in arrival order.
//!
//! # Design
//! Keys are spread over `shards` maps, each behind its own lock, by a hash of the key, so
//! threads working on different keys rarely meet on a lock. A lock is held only to push,
//! copy or filter a list, never while user code runs.
//!
//! # Invariants
//! - A key is present only while its list is non-empty: whoever empties a list removes
//!   the key, and a map under a quarter full gives half its capacity back, so memory
//!   follows the keys in use, not the keys ever seen or the peak.
//! - `entries` of a shard equals the total length of its lists.
//! - An entry may name a completed operation (it was completed through another key, or
//!   by force or expiry); such entries are dropped by the next check of their key or by a
//!   purge, and are counted as stale (see `counters.rs`) until then.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use foldhash::fast::RandomState;
use timer_core::sync::Mutex;

use crate::op_cell::OpCell;

type Map<K, O> = std::collections::HashMap<K, Vec<Arc<OpCell<O>>>, RandomState>;

/// Drops the entries of completed operations from `list`, keeping the others in order;
/// returns how many it dropped. `done` is scratch space.
///
/// Two passes, because each entry's flag is usually a cache miss: the first only reads
/// the flags, so the CPU overlaps many misses at once; the second drops the completed
/// entries, whose lines the first pass brought in. Done in one pass, the atomic
/// decrement of each dropped `Arc` (a full barrier on x86) waits for the miss before it
/// and holds back the next one, so the misses are taken one at a time.
fn drop_completed_entries<O: crate::DelayedOperation>(
    list: &mut Vec<Arc<OpCell<O>>>,
    done: &mut Vec<bool>,
) -> usize {
    done.clear();
    done.extend(list.iter().map(|cell| cell.is_completed()));
    let before = list.len();
    let mut flags = done.iter();
    list.retain(|_| !flags.next().copied().unwrap_or(false));
    before - list.len()
}

struct ShardState<K, O> {
    lists: Map<K, O>,
    entries: usize,
}

impl<K: Hash + Eq, O> ShardState<K, O> {
    /// Removes a key's list, giving back map capacity once the map is mostly empty.
    fn remove_key(&mut self, key: &K) -> Option<Vec<Arc<OpCell<O>>>> {
        let list = self.lists.remove(key);
        self.shrink_if_sparse();
        list
    }

    /// Halves the map's capacity when it is under a quarter full, so a spike of keys does
    /// not hold its memory forever; amortised O(1) per removal.
    fn shrink_if_sparse(&mut self) {
        let capacity = self.lists.capacity();
        if capacity > 64 && self.lists.len() * 4 < capacity {
            self.lists.shrink_to(capacity / 2);
        }
    }
}

#[repr(align(128))]
struct Shard<K, O> {
    state: Mutex<ShardState<K, O>>,
}

pub(crate) struct Watchers<K, O> {
    shards: Box<[Shard<K, O>]>,
    hasher: RandomState,
}

impl<K: Hash + Eq + Clone, O> Watchers<K, O> {
    pub(crate) fn new(shards: usize) -> Self {
        let hasher = RandomState::default();
        Watchers {
            shards: (0..shards)
                .map(|_| Shard {
                    state: Mutex::new(ShardState {
                        lists: Map::with_hasher(hasher),
                        entries: 0,
                    }),
                })
                .collect(),
            hasher,
        }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard(&self, key: &K) -> &Shard<K, O> {
        // The high bits: the map itself uses the low ones.
        let high = (self.hasher.hash_one(key) >> 32) as usize;
        let n = self.shards.len();
        let index = if n.is_power_of_two() {
            high & (n - 1)
        } else {
            high % n
        };
        &self.shards[index]
    }

    /// Appends `cell` to the list of `key`.
    pub(crate) fn watch(&self, key: K, cell: &Arc<OpCell<O>>) {
        let mut shard = self.shard(&key).state.lock();
        shard.lists.entry(key).or_default().push(Arc::clone(cell));
        shard.entries += 1;
    }

    /// Copies the not-yet-completed entries of `key` into `out`, in arrival order.
    /// Returns whether the list also held completed entries.
    pub(crate) fn snapshot(&self, key: &K, out: &mut impl Extend<Arc<OpCell<O>>>) -> bool
    where
        O: crate::DelayedOperation,
    {
        let shard = self.shard(key).state.lock();
        let Some(list) = shard.lists.get(key) else {
            return false;
        };
        let mut saw_completed = false;
        for cell in list {
            if cell.is_completed() {
                saw_completed = true;
            } else {
                out.extend(Some(Arc::clone(cell)));
            }
        }
        saw_completed
    }

    /// Drops the completed entries of `key` (removing the key when its list empties);
    /// returns how many were dropped.
    pub(crate) fn drop_completed(&self, key: &K) -> usize
    where
        O: crate::DelayedOperation,
    {
        let mut guard = self.shard(key).state.lock();
        let shard = &mut *guard;
        let Some(list) = shard.lists.get_mut(key) else {
            return 0;
        };
        let removed = drop_completed_entries(list, &mut Vec::new());
        if list.is_empty() {
            shard.remove_key(key);
        }
        shard.entries -= removed;
        removed
    }

    /// Removes the whole list of `key`.
    pub(crate) fn take(&self, key: &K) -> Vec<Arc<OpCell<O>>> {
        let mut shard = self.shard(key).state.lock();
        let list = shard.remove_key(key).unwrap_or_default();
        shard.entries -= list.len();
        list
    }

    /// Drops the completed entries of every list of shard `index`; returns how many.
    pub(crate) fn purge_shard(&self, index: usize) -> usize
    where
        O: crate::DelayedOperation,
    {
        let mut guard = self.shards[index].state.lock();
        let shard = &mut *guard;
        let mut removed = 0;
        let mut done = Vec::new();
        shard.lists.retain(|_, list| {
            removed += drop_completed_entries(list, &mut done);
            !list.is_empty()
        });
        shard.entries -= removed;
        shard.shrink_if_sparse();
        removed
    }

    /// Empties every list, returning the cells (used at shutdown).
    pub(crate) fn clear(&self) -> Vec<Arc<OpCell<O>>> {
        let mut cells = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.state.lock();
            shard.entries = 0;
            for (_, list) in shard.lists.drain() {
                cells.extend(list);
            }
        }
        cells
    }

    /// Total watcher entries (Kafka's `PurgatorySize`).
    pub(crate) fn entries(&self) -> usize {
        self.shards.iter().map(|s| s.state.lock().entries).sum()
    }

    /// Number of keys with a list.
    pub(crate) fn keys(&self) -> usize {
        self.shards.iter().map(|s| s.state.lock().lists.len()).sum()
    }
}
