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
//! - An entry names an operation by [`OpRef`]; it may name one that was completed (through
//!   another key, or by force, expiry or cancel), which the op table tells without a lock.
//!   Such entries are dropped by the next check of their key or by a purge. Dropping an
//!   entry is a plain memory operation.
//! - The lists own their counts ([`EntryCounts`]): `listed` moves with every entry added
//!   or removed here, `stale` goes up by an operation's key count when whoever takes the
//!   operation says so ([`Watchers::mark_stale`]) and down with every removal of an entry
//!   whose operation was already taken. Every entry a removal drops is such an entry,
//!   except in [`Watchers::take`], whose caller marks the live ones it takes stale at once;
//!   so `stale` may dip below zero for a moment, never for long.
//! - A key's `Hash` or `Eq` that panics while an entry is listed is caught per entry: that
//!   entry is not listed, the shard is left consistent, and the caller is told which
//!   entries failed. Elsewhere (a check, a cancel by key) the panic reaches the caller
//!   before anything was changed, or after a change already complete.

use std::hash::{BuildHasher, Hash};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use crate::sync::Mutex;
use foldhash::fast::RandomState;
use smallvec::{smallvec, SmallVec};

use crate::counters::{stripe_index, STRIPES};
use crate::op_table::OpRef;

type Map<K> = std::collections::HashMap<K, Vec<OpRef>, RandomState>;

/// Scratch space of [`drop_completed_entries`]: on the stack for lists of up to 128.
type Flags = SmallVec<[bool; 128]>;

/// Drops the entries for which `waiting` is false, keeping the others in order; returns
/// how many it dropped. `flags` is scratch space.
///
/// Two passes, because a `waiting` read (a generation tag, written by whichever core
/// completed the operation) may miss the cache: the first pass only stores the answers,
/// with no branch on them, so the CPU runs ahead and has many misses in flight at once;
/// the second compacts the list. In one pass, every mispredicted keep-or-drop branch
/// would wait for its miss before the next could start.
fn drop_completed_entries(
    list: &mut Vec<OpRef>,
    waiting: &impl Fn(OpRef) -> bool,
    flags: &mut Flags,
) -> usize {
    flags.clear();
    flags.extend(list.iter().map(|&at| waiting(at)));
    let before = list.len();
    let mut keep = flags.iter();
    list.retain(|_| keep.next().copied().unwrap_or(true));
    before - list.len()
}

struct ShardState<K> {
    lists: Map<K>,
    entries: usize,
}

impl<K: Hash + Eq> ShardState<K> {
    /// Removes a key's list, giving back map capacity once the map is mostly empty.
    fn remove_key(&mut self, key: &K) -> Option<Vec<OpRef>> {
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
struct Shard<K> {
    state: Mutex<ShardState<K>>,
}

/// One stripe of [`EntryCounts`], on its own cache line.
#[repr(align(128))]
#[derive(Default)]
struct CountStripe {
    listed: AtomicI64,
    stale: AtomicI64,
}

/// Watcher entries, all of them and those whose operation is already taken, striped by
/// thread; a sum read while others count is a recent value, not a snapshot. They tell
/// the reaper when a purge pays for itself.
#[derive(Default)]
struct EntryCounts {
    stripes: [CountStripe; STRIPES],
}

impl EntryCounts {
    #[inline]
    fn add(&self, listed: i64, stale: i64) {
        let stripe = &self.stripes[stripe_index()];
        if listed != 0 {
            stripe.listed.fetch_add(listed, Relaxed);
        }
        if stale != 0 {
            stripe.stale.fetch_add(stale, Relaxed);
        }
    }

    fn sum(&self, read: impl Fn(&CountStripe) -> &AtomicI64) -> i64 {
        self.stripes.iter().map(|s| read(s).load(Relaxed)).sum()
    }
}

pub(crate) struct Watchers<K> {
    shards: Box<[Shard<K>]>,
    hasher: RandomState,
    counts: EntryCounts,
}

/// Entries of a [`Watchers::watch_many`] call that were not listed because their key's
/// `Hash` or `Eq` panicked: their positions in the call's input.
pub(crate) type Unlisted = SmallVec<[usize; 4]>;

impl<K> Watchers<K> {
    /// Records that an operation listed on `keys` entries was taken (completed, expired
    /// or cancelled): its entries are stale from now on.
    #[inline]
    pub(crate) fn mark_stale(&self, keys: u32) {
        self.counts.add(0, i64::from(keys));
    }

    /// Entries listed, stale ones included (a recent estimate).
    pub(crate) fn listed(&self) -> i64 {
        self.counts.sum(|s| &s.listed)
    }

    /// Entries whose operation was taken (a recent estimate).
    pub(crate) fn stale(&self) -> i64 {
        self.counts.sum(|s| &s.stale)
    }

    /// Records the removal of `removed` entries whose operations were taken.
    fn removed_stale(&self, removed: usize) {
        let removed = removed as i64;
        self.counts.add(-removed, -removed);
    }
}

impl<K: Hash + Eq + Clone> Watchers<K> {
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
            counts: EntryCounts::default(),
        }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard(&self, key: &K) -> &Shard<K> {
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

    /// Appends each `(key, operation)` of `entries` to the list of its key, keeping the
    /// order of `entries` per key; every key is taken out of `entries`. Takes each shard
    /// lock once: the entries are first bucketed by shard (a counting sort, stable), then
    /// each shard's entries are listed under one lock. Returns the positions of the
    /// entries not listed because their key's `Hash` or `Eq` panicked (each caught and
    /// reported; the other entries are listed).
    pub(crate) fn watch_many(&self, entries: &mut [(Option<K>, OpRef)]) -> Unlisted {
        let mut unlisted = Unlisted::new();
        let shards = self.shards.len() as u32;
        // Hashed before any lock is taken: a key's `Hash` is user code.
        let shard_of: SmallVec<[u32; 256]> = entries
            .iter()
            .enumerate()
            .map(|(i, (key, _))| {
                let key = key.as_ref().expect("not yet listed");
                caught(|| self.shard_index(self.hasher.hash_one(key)) as u32).unwrap_or_else(|| {
                    unlisted.push(i);
                    shards
                })
            })
            .collect();
        // Counting sort: `ends[s]` first counts shard s's entries, then (prefix sums) is
        // where its run in `order` starts, and after the placement where it ends. Entries
        // whose hash panicked sort last, into a run of their own that is never listed.
        let mut ends: SmallVec<[u32; 512]> = smallvec![0; shards as usize + 1];
        for &s in &shard_of {
            ends[s as usize] += 1;
        }
        let mut start = 0;
        for end in ends.iter_mut() {
            let count = *end;
            *end = start;
            start += count;
        }
        let mut order: SmallVec<[u32; 256]> = smallvec![0; entries.len()];
        for (i, &s) in shard_of.iter().enumerate() {
            order[ends[s as usize] as usize] = i as u32;
            ends[s as usize] += 1;
        }
        let mut begin = 0;
        let mut listed = 0;
        for (s, &end) in ends.iter().take(shards as usize).enumerate() {
            let run = &order[begin as usize..end as usize];
            begin = end;
            if run.is_empty() {
                continue;
            }
            let mut guard = self.shards[s].state.lock();
            let shard = &mut *guard;
            for &i in run {
                let (key, at) = &mut entries[i as usize];
                let key = key.take().expect("listed once");
                let at = *at;
                let lists = &mut shard.lists;
                if caught(|| lists.entry(key).or_default().push(at)).is_some() {
                    shard.entries += 1;
                    listed += 1;
                } else {
                    unlisted.push(i as usize);
                }
            }
        }
        self.counts.add(listed, 0);
        unlisted
    }

    /// Copies the entries of `key` into `out`, in arrival order. (The caller tells the
    /// completed ones apart after the lock is released: each is a cache miss.)
    pub(crate) fn snapshot(&self, key: &K, out: &mut impl Extend<OpRef>) {
        let shard = self.shard(key).state.lock();
        if let Some(list) = shard.lists.get(key) {
            out.extend(list.iter().copied());
        }
    }

    /// Drops the entries of `key` whose operation is no longer `waiting` (removing the
    /// key when its list empties); returns how many were dropped.
    pub(crate) fn drop_completed(&self, key: &K, waiting: impl Fn(OpRef) -> bool) -> usize {
        let mut guard = self.shard(key).state.lock();
        let shard = &mut *guard;
        let Some(list) = shard.lists.get_mut(key) else {
            return 0;
        };
        let removed = drop_completed_entries(list, &waiting, &mut Flags::new());
        if list.is_empty() {
            shard.remove_key(key);
        }
        shard.entries -= removed;
        drop(guard);
        self.removed_stale(removed);
        removed
    }

    /// Removes the whole list of `key`. Its entries are counted as stale ones removed:
    /// the caller marks the operations it takes from them stale ([`mark_stale`]).
    ///
    /// [`mark_stale`]: Self::mark_stale
    pub(crate) fn take(&self, key: &K) -> Vec<OpRef> {
        let mut shard = self.shard(key).state.lock();
        let list = shard.remove_key(key).unwrap_or_default();
        shard.entries -= list.len();
        drop(shard);
        self.removed_stale(list.len());
        list
    }

    /// Drops the entries no longer `waiting` from every list of shard `index`; returns
    /// how many. (`waiting` should read the dense generation tags, which stay in this
    /// core's cache: the shard is locked while they are read.)
    pub(crate) fn purge_shard(&self, index: usize, waiting: impl Fn(OpRef) -> bool) -> usize {
        let mut guard = self.shards[index].state.lock();
        let shard = &mut *guard;
        let mut removed = 0;
        let mut flags = Flags::new();
        shard.lists.retain(|_, list| {
            removed += drop_completed_entries(list, &waiting, &mut flags);
            !list.is_empty()
        });
        shard.entries -= removed;
        shard.shrink_if_sparse();
        drop(guard);
        self.removed_stale(removed);
        removed
    }

    /// Empties every list (used at shutdown, when every operation has been taken).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut shard = shard.state.lock();
            let removed = std::mem::take(&mut shard.entries);
            let lists = std::mem::replace(&mut shard.lists, Map::with_hasher(self.hasher));
            drop(shard);
            drop(lists);
            self.removed_stale(removed);
        }
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

/// Runs `f`, catching a panic (reported through `tracing`): a key's `Hash` or `Eq`.
fn caught<R>(f: impl FnOnce() -> R) -> Option<R> {
    catch_unwind(AssertUnwindSafe(f))
        .map_err(|payload| {
            tracing::error!(
                target: "purgatory",
                panic = timer_core::panic_message(&*payload),
                "a key's Hash or Eq panicked; its operation is handed back"
            );
        })
        .ok()
}
