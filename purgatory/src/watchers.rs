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
        &self.shards[self.shard_index(self.hasher.hash_one(key))]
    }

    /// The shard of a key with hash `hash`: from bits 32 and up, since each shard's map
    /// uses the low bits (bucket) and the top seven (tag).
    fn shard_index(&self, hash: u64) -> usize {
        let high = (hash >> 32) as usize;
        let n = self.shards.len();
        if n.is_power_of_two() {
            high & (n - 1)
        } else {
            high % n
        }
    }

    /// Appends `cell` to the list of `key`.
    pub(crate) fn watch(&self, key: K, cell: &Arc<OpCell<O>>) {
        let mut shard = self.shard(&key).state.lock();
        shard.lists.entry(key).or_default().push(Arc::clone(cell));
        shard.entries += 1;
    }

    /// Appends each `(key, cell)` of `entries` to the list of its key, keeping the order
    /// of `entries` per key; `entries` is left empty. Takes each shard lock once per run
    /// of entries that fall in it, and looks each key up once per run of equal keys: the
    /// entries are visited in the order of a sort key packing (shard, low hash bits,
    /// position), a plain `u64` sort.
    pub(crate) fn watch_many(&self, entries: &mut Vec<(Option<K>, &Arc<OpCell<O>>)>) {
        const POSITION_BITS: u32 = 24;
        const HASH_BITS: u32 = 24;
        let mut order: Vec<u64> = Vec::with_capacity(entries.len().min(1 << POSITION_BITS));
        let mut start = 0;
        while start < entries.len() {
            let end = (start + (1 << POSITION_BITS)).min(entries.len());
            let window = &mut entries[start..end];
            start += window.len();
            order.clear();
            order.extend(window.iter().enumerate().map(|(i, (key, _))| {
                let hash = self.hasher.hash_one(key.as_ref().expect("not yet listed"));
                let shard = self.shard_index(hash) as u64;
                (shard << (HASH_BITS + POSITION_BITS))
                    | ((hash & ((1 << HASH_BITS) - 1)) << POSITION_BITS)
                    | i as u64
            }));
            order.sort_unstable();
            let position = |packed: u64| (packed & ((1 << POSITION_BITS) - 1)) as usize;
            let group = |packed: u64| packed >> POSITION_BITS;
            let mut rest = &order[..];
            while let Some(&first) = rest.first() {
                let shard_of = |packed: u64| packed >> (HASH_BITS + POSITION_BITS);
                let in_shard = rest
                    .iter()
                    .take_while(|&&p| shard_of(p) == shard_of(first))
                    .count();
                let (run, tail) = rest.split_at(in_shard);
                rest = tail;
                let mut guard = self.shards[shard_of(first) as usize].state.lock();
                let shard = &mut *guard;
                shard.entries += run.len();
                let mut i = 0;
                while i < run.len() {
                    let head = run[i];
                    let key = window[position(head)].0.take().expect("listed once");
                    let same = 1 + run[i + 1..]
                        .iter()
                        .take_while(|&&p| {
                            group(p) == group(head) && window[position(p)].0.as_ref() == Some(&key)
                        })
                        .count();
                    let list = shard.lists.entry(key).or_default();
                    list.extend(
                        run[i..i + same]
                            .iter()
                            .map(|&p| Arc::clone(window[position(p)].1)),
                    );
                    i += same;
                }
            }
        }
        entries.clear();
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
