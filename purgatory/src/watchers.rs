//! The watcher lists: for each key, the operations waiting on it, in arrival order.
//!
//! # Design
//! Keys are spread over `shards` tables, each behind its own lock, by a hash of the key,
//! so threads working on different keys rarely meet on a lock. Each table entry keeps its
//! key's hash, so a key is hashed once per call, before any lock is taken, and the table
//! never hashes a key again (not when it grows or shrinks either).
//!
//! # What user code runs under a shard lock
//! A key's `Hash` never does. Its `Eq` does, and only to compare it with keys of the same
//! shard whose hash is equal (a probe): a slow `Eq` delays other calls on that shard.
//! A key's `Drop` never does: keys that are not kept (a key already listed, a list
//! removed or purged) are dropped after the lock is released, one at a time through the
//! door (`user_code.rs`), which the methods that run key code are given.
//!
//! # Invariants
//! - A key is present only while its list is non-empty: whoever empties a list removes
//!   the key, and a table under a quarter full and down to a few thousand keys shrinks to
//!   twice its keys, so memory follows the keys in use, not the keys ever seen or the peak
//!   (a table of more keys keeps its capacity until they are fewer: moving them all would
//!   hold the lock for milliseconds).
//! - `entries` of a shard equals the total length of its lists.
//! - An entry names an operation by [`OpRef`]; it may name one that was completed (through
//!   another key, or by force, expiry or cancel), which the op table tells without a lock.
//!   Such entries are dropped by a check of their key (once they are a quarter of its
//!   list) or by a purge (except the rare entry whose one-byte tag cannot tell: only a
//!   check drops those, see `op_table.rs`). Dropping an entry is a plain memory
//!   operation.
//! - A purge works in steps of bounded work ([`Watchers::purge_step`]): each step holds
//!   its shard's lock for at most about `budget` list entries plus one segment of a list
//!   (`op_list.rs`: a long list is filtered a segment at a time, across steps), and says
//!   where the next step resumes. If the table grew or shrank, or the list resumed in
//!   was filtered by a check, between two steps, the next step may skip or revisit some
//!   lists or segments: a purge is a clean-up, and the next one finds what this one
//!   missed.
//! - The lists own their counts ([`EntryCounts`]): `listed` moves with every entry added
//!   or removed here, `stale` goes up by an operation's key count when whoever takes the
//!   operation says so ([`Watchers::mark_stale`]) and down with every removal of an entry
//!   whose operation was already taken. Every entry a removal drops is such an entry,
//!   except in [`Watchers::take`], whose caller marks the live ones it takes stale at once;
//!   so `stale` may dip below zero for a moment, never for long.
//! - A key's `Hash` or `Eq` that panics while an entry is listed is caught per entry: that
//!   entry is not listed, the shard is left consistent, and the caller is told which
//!   entries failed. Elsewhere (a check, a cancel by key: a key the caller lends) the
//!   panic reaches the caller before anything was changed, or after a change already
//!   complete. A key's `Drop` that panics is caught wherever the lists drop a key, and
//!   whatever the call was doing goes on.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use smallvec::SmallVec;

use crate::counters::{ThisStripe, STRIPES};
use crate::op_list::OpList;
use crate::op_table::OpRef;
use crate::sync::Mutex;
use crate::user_code::{to_caller, Site, UserCode};
use crate::watch::{take_keys, Keys};

/// One key's list, with the key's hash.
struct List<K> {
    hash: u64,
    key: K,
    ops: OpList,
}

struct ShardState<K> {
    lists: HashTable<List<K>>,
    entries: usize,
}

impl<K: Eq> ShardState<K> {
    /// Where the list of `key` (with hash `hash`) is; runs `Eq` on keys of equal hash.
    /// `key` may be a borrowed form of the keys (`&str` for `String`), as a `HashMap`
    /// lookup allows: `Borrow` promises that both hash and compare alike.
    fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.lists
            .find_bucket_index(hash, |list| list.hash == hash && list.key.borrow() == key)
    }

    /// Removes the list at `bucket`, giving back table capacity once the table is mostly
    /// empty. The caller drops what it returns after unlocking.
    fn remove(&mut self, bucket: usize) -> List<K> {
        let Ok(entry) = self.lists.get_bucket_entry(bucket) else {
            unreachable!("the bucket of a list just found");
        };
        let (list, _) = entry.remove();
        self.entries -= list.ops.len();
        self.shrink_if_sparse();
        list
    }

    /// Shrinks the table to twice its keys when it is under a quarter full, so a spike of
    /// keys does not hold its memory forever; amortised O(1) per removal. Only while it
    /// holds at most [`SHRINK_LIMIT`] keys: shrinking moves every key to a new table under
    /// the shard lock, and a bigger move (measured at 5-10 ms for 31,000 keys out of a
    /// 217,000-slot table) would hold up checks and the purge's next step that long.
    fn shrink_if_sparse(&mut self) {
        let (capacity, len) = (self.lists.capacity(), self.lists.len());
        if capacity > 64 && len * 4 < capacity && len <= SHRINK_LIMIT {
            self.lists.shrink_to(len * 2, |list| list.hash);
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
/// the reaper when a purge pays for itself, and `stats()` how many entries are live
/// (`PurgatoryStats::watched_live`, `stats.rs`).
#[derive(Default)]
struct EntryCounts {
    stripes: [CountStripe; STRIPES],
}

impl EntryCounts {
    #[inline]
    fn add(&self, listed: i64, stale: i64) {
        self.add_in(ThisStripe::read(), listed, stale);
    }

    #[inline]
    fn add_in(&self, stripe: ThisStripe, listed: i64, stale: i64) {
        let stripe = &self.stripes[stripe.index()];
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

/// Most watcher shards (the builder's limit): [`Watchers::shard_index`] needs
/// `MAX_SHARDS << SHARD_BITS` to fit in a `u64`.
pub(crate) const MAX_SHARDS: usize = 1 << 16;

/// The bits of a key's hash that pick its shard: bits 32 to 56 (see
/// [`Watchers::shard_index`]).
const SHARD_BITS: u32 = 25;

/// Most keys a shard's table holds when it shrinks (see `ShardState::shrink_if_sparse`).
const SHRINK_LIMIT: usize = 4096;

/// In [`Watchers::watch_many`]'s chains: no entry (the end of a chain, or an empty one).
const NONE: u32 = u32::MAX;

/// An entry of [`Watchers::watch_many`]: its key (until listed, or dropped), operation,
/// the key's hash, and the next entry of its shard.
struct Entry<K> {
    key: Option<K>,
    op: OpRef,
    hash: u64,
    next: u32,
}

/// Where [`Watchers::watch_many`]'s entries are pushed, with no lock held.
pub(crate) struct Gather<'a, K> {
    watchers: &'a Watchers<K>,
    user: &'a UserCode,
    entries: &'a mut Vec<Entry<K>>,
    /// For each shard, its first entry and (while they are pushed) its last one.
    first: &'a mut [u32],
    last: &'a mut [u32],
    unlisted: &'a mut Unlisted,
}

impl<K: Hash + Eq> Gather<'_, K> {
    /// Entries pushed so far.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Hashes `key` (user code, caught: a key whose `Hash` panics is not listed, and is
    /// dropped now, through the door) and chains its entry, for `op`, to its shard's.
    #[inline(always)]
    pub(crate) fn push(&mut self, key: K, op: OpRef) {
        let i = self.entries.len();
        debug_assert!(i < NONE as usize);
        let Some(hash) = self.user.call(Site::KeyHash, || self.watchers.hash(&key)) else {
            self.unlisted.push(i);
            self.user.drop(Site::KeyDrop, key);
            self.entries.push(Entry {
                key: None,
                op,
                hash: 0,
                next: NONE,
            });
            return;
        };
        let s = self.watchers.shard_index(hash);
        match self.last[s] {
            NONE => self.first[s] = i as u32,
            prev => self.entries[prev as usize].next = i as u32,
        }
        self.last[s] = i as u32;
        self.entries.push(Entry {
            key: Some(key),
            op,
            hash,
            next: NONE,
        });
    }
}

/// Where a purge of one shard resumes: a bucket of its table, and a segment of the list
/// there (see `op_list.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PurgeCursor {
    pub(crate) bucket: usize,
    pub(crate) segment: usize,
}

impl<K> Watchers<K> {
    /// Total watcher entries (Kafka's `PurgatorySize`).
    pub(crate) fn entries(&self) -> usize {
        self.shards.iter().map(|s| s.state.lock().entries).sum()
    }

    /// Number of keys with a list.
    pub(crate) fn keys(&self) -> usize {
        self.shards.iter().map(|s| s.state.lock().lists.len()).sum()
    }

    /// Records that an operation listed on `keys` entries was taken (completed, expired
    /// or cancelled): its entries are stale from now on.
    #[inline]
    pub(crate) fn mark_stale(&self, keys: u32) {
        self.mark_stale_in(ThisStripe::read(), keys);
    }

    /// [`mark_stale`](Self::mark_stale), in the stripe the calling thread read already.
    #[inline]
    pub(crate) fn mark_stale_in(&self, stripe: ThisStripe, keys: u32) {
        self.counts.add_in(stripe, 0, i64::from(keys));
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

    /// Empties every list (at shutdown, when every operation has been taken, and at the
    /// state's drop); the keys are dropped through `user`, one at a time.
    pub(crate) fn clear(&self, user: &UserCode) {
        for shard in self.shards.iter() {
            let mut shard = shard.state.lock();
            let removed = std::mem::take(&mut shard.entries);
            let lists = std::mem::take(&mut shard.lists);
            drop(shard);
            self.removed_stale(removed);
            user.drop_each(Site::KeyDrop, lists.into_iter().map(|list| list.key));
        }
    }
}

impl<K: Hash + Eq> Watchers<K> {
    /// Lists spread over `shards` shards (1 ..= [`MAX_SHARDS`]; the builder checks it).
    pub(crate) fn new(shards: usize) -> Self {
        assert!(
            (1..=MAX_SHARDS).contains(&shards),
            "{shards} watcher shards: 1 ..= {MAX_SHARDS}"
        );
        Watchers {
            shards: (0..shards)
                .map(|_| Shard {
                    state: Mutex::new(ShardState {
                        lists: HashTable::new(),
                        entries: 0,
                    }),
                })
                .collect(),
            hasher: RandomState::default(),
            counts: EntryCounts::default(),
        }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Hashes `key`, a key or a borrowed form of one (user code: call with no lock
    /// held).
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key with hash `hash` (below [`shard_count`](Self::shard_count)):
    /// from bits 32 to 56, since each shard's table uses the low bits (bucket) and the
    /// top seven (tag). Those [`SHARD_BITS`] bits, `x`, are scaled to the shard count as
    /// `x * n >> SHARD_BITS` (a multiply and shifts, for any count: testing for a power
    /// of two and masking, with `%` for other counts, cost 3 more instructions a key,
    /// plus the bounds check this makes needless; callgrind, `expiring_watches`).
    #[inline(always)]
    fn shard_index(&self, hash: u64) -> usize {
        let x = (hash << 7) >> (64 - SHARD_BITS);
        ((x * self.shards.len() as u64) >> SHARD_BITS) as usize
    }

    #[inline(always)]
    fn shard(&self, hash: u64) -> &Shard<K> {
        let i = self.shard_index(hash);
        debug_assert!(i < self.shards.len());
        // SAFETY: `x` above is below 2^SHARD_BITS, so `x * n` is below `n << SHARD_BITS`
        // (no overflow: `new` keeps `n` at most `MAX_SHARDS`, 2^16, and the product below
        // 2^41), and shifting it right by SHARD_BITS gives a value below `n`, the length
        // of `shards`.
        unsafe { self.shards.get_unchecked(i) }
    }

    /// Appends each `(key, operation)` that `gather` pushes (at most `len` of them: the
    /// room made for them) to the list of its key, keeping their order per key. Takes
    /// each shard lock once: each key is hashed as it is pushed, with no lock held, and
    /// its entry chained to the others of its shard, in order; then each shard's chain
    /// is listed under one lock. Returns the positions (in push order) of the entries not
    /// listed because their key's `Hash` or `Eq` panicked (each caught and reported; the
    /// other entries are listed, and the keys not kept are dropped through `user`).
    ///
    /// The keys are hashed and chained as they are pushed, not gathered into a vector
    /// first and then hashed and chained in passes of their own: those cost 9
    /// instructions an entry more (`watch_batch` 937.8 -> 911.5 an operation of three
    /// keys; callgrind, `expiring_watches 20000 64`).
    pub(crate) fn watch_many(
        &self,
        len: usize,
        user: &UserCode,
        gather: impl FnOnce(&mut Gather<'_, K>),
    ) -> Unlisted {
        let mut unlisted = Unlisted::new();
        let mut entries: Vec<Entry<K>> = Vec::with_capacity(len);
        // Made empty in place and then sized: `smallvec!` built them elsewhere and copied
        // their 2 KB in (10 instructions an operation with `with_capacity` doing the same
        // to 4 KB of hashes then; callgrind, `expiring_watches 20000 64`).
        let mut first: SmallVec<[u32; 512]> = SmallVec::new();
        first.resize(self.shards.len(), NONE);
        let mut last: SmallVec<[u32; 512]> = SmallVec::new();
        last.resize(self.shards.len(), NONE);
        gather(&mut Gather {
            watchers: self,
            user,
            entries: &mut entries,
            first: &mut first,
            last: &mut last,
            unlisted: &mut unlisted,
        });
        drop(last);
        // Keys already listed: dropped once no lock is held.
        let mut spare: SmallVec<[K; 8]> = SmallVec::new();
        let mut listed = 0;
        for (s, &head) in first.iter().enumerate() {
            if head == NONE {
                continue;
            }
            let mut guard = self.shards[s].state.lock();
            let shard = &mut *guard;
            let mut next = head;
            while next != NONE {
                let i = next as usize;
                let entry = &mut entries[i];
                next = entry.next;
                let key = entry.key.take().expect("listed once");
                let not_kept = match self.list_under_lock(shard, entry.hash, key, entry.op, user) {
                    Ok(kept) => {
                        listed += 1;
                        kept
                    }
                    Err(key) => {
                        unlisted.push(i);
                        Some(key)
                    }
                };
                // Dropped after unlocking, unless dropping a key does nothing.
                if std::mem::needs_drop::<K>() {
                    if let Some(key) = not_kept {
                        spare.push(key);
                    }
                }
            }
        }
        self.counts.add(listed, 0);
        user.drop_each(Site::KeyDrop, spare);
        unlisted
    }

    /// [`watch_many`](Self::watch_many) of the `(key, operation)`s of `entries` (each key
    /// taken out).
    #[cfg(all(test, not(loom)))]
    fn watch_entries(&self, entries: &mut [(Option<K>, OpRef)], user: &UserCode) -> Unlisted {
        self.watch_many(entries.len(), user, |gather| {
            for (key, op) in entries.iter_mut() {
                gather.push(key.take().expect("listed once"), *op);
            }
        })
    }

    /// Lists `op` on every key of `keys` (one operation's, taken out: `keys` is left
    /// empty), each under its own shard's lock, with no sort; returns how many keys were
    /// not listed because their `Hash` or `Eq` panicked (each caught and reported; the
    /// other keys are listed). Takes them out itself ([`take_keys`]), so the iterator
    /// stays in this frame (see `State::watch_one`). Counts them on `stripe`, the calling
    /// thread's.
    pub(crate) fn watch_keys(
        &self,
        keys: &mut Keys<K>,
        op: OpRef,
        user: &UserCode,
        stripe: ThisStripe,
    ) -> u32 {
        let (mut listed, mut failed) = (0, 0);
        for key in take_keys(keys) {
            if self.list_one(key, op, user) {
                listed += 1;
            } else {
                failed += 1;
            }
        }
        self.counts.add_in(stripe, listed, 0);
        failed
    }

    /// Lists `op` on `key` under the key's shard lock; `false` if the key's `Hash` or
    /// `Eq` panicked (nothing listed). Does not count the entry. A key not kept is dropped
    /// through `user`.
    #[inline(always)]
    fn list_one(&self, key: K, op: OpRef, user: &UserCode) -> bool {
        let Some(hash) = user.call(Site::KeyHash, || self.hash(&key)) else {
            user.drop(Site::KeyDrop, key);
            return false;
        };
        let mut guard = self.shard(hash).state.lock();
        let (listed, spare) = match self.list_under_lock(&mut guard, hash, key, op, user) {
            Ok(spare) => (true, spare),
            Err(key) => (false, Some(key)),
        };
        drop(guard);
        if let Some(key) = spare {
            user.drop(Site::KeyDrop, key);
        }
        listed
    }

    /// Appends `op` to the list of `key` (hash `hash`) in a locked shard. Returns the key
    /// if it was not kept (already listed), for the caller to drop after unlocking, or
    /// `Err` with the key if its `Eq` panicked (nothing listed).
    #[inline(always)]
    fn list_under_lock(
        &self,
        shard: &mut ShardState<K>,
        hash: u64,
        key: K,
        op: OpRef,
        user: &UserCode,
    ) -> Result<Option<K>, K> {
        // The list itself, not its bucket: one probe, not a probe and a bucket check.
        let found = user.call(Site::KeyEq, || {
            shard
                .lists
                .find_mut(hash, |list| list.hash == hash && list.key == key)
        });
        let spare = match found {
            Some(Some(list)) => {
                list.ops.push(op);
                Some(key)
            }
            Some(None) => {
                let list = List {
                    hash,
                    key,
                    ops: OpList::one(op),
                };
                shard.lists.insert_unique(hash, list, |list| list.hash);
                None
            }
            None => return Err(key),
        };
        shard.entries += 1;
        Ok(spare)
    }

    /// Copies the entries of `key` into `out`, in arrival order. (The caller tells the
    /// completed ones apart after the lock is released: each is a cache miss.)
    ///
    /// A list longer than one segment and than `out` has room for is measured first, and
    /// `out` made ready for it (allocated, and written once so its pages are mapped) with
    /// the lock released: the lock is then held again for the copy alone (the list may
    /// have grown meanwhile; `out` then grows under the lock). See `docs/purgatory.md`,
    /// "Watchers, purging, memory".
    ///
    /// `key` is the caller's: its `Hash` or `Eq` panicking reaches the caller, before
    /// anything changed.
    pub(crate) fn snapshot<Q, const N: usize>(&self, key: &Q, out: &mut SmallVec<[OpRef; N]>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = to_caller(Site::KeyHash, || self.hash(key));
        let shard = self.shard(hash).state.lock();
        let Some(bucket) = to_caller(Site::KeyEq, || shard.find(hash, key)) else {
            return;
        };
        let list = shard.lists.get_bucket(bucket).expect("found");
        let room = out.capacity() - out.len();
        if list.ops.is_short() || list.ops.len() <= room {
            list.ops.copy_into(out);
            return;
        }
        let len = list.ops.len();
        drop(shard);
        let start = out.len();
        out.resize(start + len, OpRef::default());
        out.truncate(start);
        let shard = self.shard(hash).state.lock();
        if let Some(bucket) = to_caller(Site::KeyEq, || shard.find(hash, key)) {
            let list = shard.lists.get_bucket(bucket).expect("found");
            list.ops.copy_into(out);
        }
    }

    /// Drops the entries of `key` whose operation is no longer `waiting` (removing the
    /// key when its list empties); returns how many were dropped. A long list is filtered
    /// a segment (at most `op_list::BLOCK`, 1,024, entries) per hold of the shard lock, so other calls on
    /// the shard wait for one segment at most; like a purge, a pass that meets a list
    /// changed meanwhile may skip a segment (only dead entries are ever dropped).
    ///
    /// `key` is the caller's (its `Hash` or `Eq` panicking reaches the caller, with only
    /// dead entries dropped so far); the stored key of a list it empties is dropped
    /// through `user`.
    pub(crate) fn drop_completed<Q>(
        &self,
        key: &Q,
        waiting: impl Fn(OpRef) -> bool,
        user: &UserCode,
    ) -> usize
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = to_caller(Site::KeyHash, || self.hash(key));
        let mut removed = 0;
        let mut segment = Some(0);
        while let Some(at) = segment {
            let mut guard = self.shard(hash).state.lock();
            let shard = &mut *guard;
            let Some(bucket) = to_caller(Site::KeyEq, || shard.find(hash, key)) else {
                break;
            };
            let list = shard.lists.get_bucket_mut(bucket).expect("found");
            let (dropped, next) = list.ops.drop_completed_in(at, &waiting);
            segment = next;
            removed += dropped;
            shard.entries -= dropped;
            let gone = list.ops.is_empty().then(|| shard.remove(bucket));
            // Fair: a call waiting for the shard gets it before the next segment.
            unlock_fair(guard);
            if let Some(list) = gone {
                user.drop(Site::KeyDrop, list.key);
            }
        }
        self.removed_stale(removed);
        removed
    }

    /// Removes the whole list of `key`. Its entries are counted as stale ones removed:
    /// the caller marks the operations it takes from them stale ([`mark_stale`]).
    ///
    /// `key` is the caller's (its `Hash` or `Eq` panicking reaches the caller before
    /// anything changed); the stored key is dropped through `user`, and the list is
    /// returned whatever its drop did.
    ///
    /// [`mark_stale`]: Self::mark_stale
    pub(crate) fn take<Q>(&self, key: &Q, user: &UserCode) -> OpList
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = to_caller(Site::KeyHash, || self.hash(key));
        let mut shard = self.shard(hash).state.lock();
        let Some(bucket) = to_caller(Site::KeyEq, || shard.find(hash, key)) else {
            return OpList::default();
        };
        let List { key, ops, .. } = shard.remove(bucket);
        drop(shard);
        self.removed_stale(ops.len());
        user.drop(Site::KeyDrop, key);
        ops
    }

    /// One step of a purge of shard `index`, from `cursor`: drops the entries no longer
    /// `waiting` from its lists, segment by segment (see `op_list.rs`), until about
    /// `budget` entries were looked at (at least one segment; at most a segment more
    /// than `budget`). Returns how many it dropped, and where the next step resumes
    /// (`None` once the shard is done), which may be inside a long list. (`waiting`
    /// should read the dense generation tags, which stay in this core's cache: the shard
    /// is locked while they are read.)
    pub(crate) fn purge_step(
        &self,
        index: usize,
        cursor: PurgeCursor,
        budget: usize,
        waiting: impl Fn(OpRef) -> bool,
        user: &UserCode,
    ) -> (usize, Option<PurgeCursor>) {
        let mut guard = self.shards[index].state.lock();
        let shard = &mut *guard;
        let mut removed = 0;
        let mut visited = 0;
        let mut emptied: SmallVec<[List<K>; 8]> = SmallVec::new();
        let buckets = shard.lists.num_buckets();
        let mut at = cursor;
        while at.bucket < buckets && visited < budget {
            if let Some(list) = shard.lists.get_bucket_mut(at.bucket) {
                let mut segment = Some(at.segment);
                while let Some(s) = segment.filter(|_| visited < budget) {
                    visited += list.ops.segment_len(s).max(1);
                    let (dropped, next) = list.ops.drop_completed_in(s, &waiting);
                    removed += dropped;
                    shard.entries -= dropped;
                    segment = next;
                }
                if list.ops.is_empty() {
                    let Ok(entry) = shard.lists.get_bucket_entry(at.bucket) else {
                        unreachable!("the bucket of a list just visited");
                    };
                    emptied.push(entry.remove().0);
                } else if let Some(segment) = segment {
                    // Out of budget inside this list: the next step resumes here.
                    at.segment = segment;
                    break;
                }
            }
            at = PurgeCursor {
                bucket: at.bucket + 1,
                segment: 0,
            };
        }
        let next = (at.bucket < buckets).then_some(at);
        if next.is_none() {
            shard.shrink_if_sparse();
        }
        drop(guard);
        self.removed_stale(removed);
        user.drop_each(Site::KeyDrop, emptied.into_iter().map(|list| list.key));
        (removed, next)
    }
}

/// Releases a shard lock to a thread waiting for it, if any, rather than to whichever
/// thread takes it next (which may be this one, at once).
fn unlock_fair<T>(guard: crate::sync::MutexGuard<'_, T>) {
    #[cfg(not(loom))]
    crate::sync::MutexGuard::unlock_fair(guard);
    #[cfg(loom)]
    drop(guard);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::op_list::BLOCK;
    use crate::op_table::OpRef;

    /// `shard` indexes the shards without a bounds check, on the grounds that
    /// `shard_index` is below the shard count for every hash and every count the builder
    /// allows: 1, powers of two and not, up to `MAX_SHARDS`. The counts tested before
    /// were 1 and 4 only. Also: every shard is reached (the scaling loses none), and the
    /// bits outside 32..=56 (the table's bucket and tag bits) do not move a key.
    #[test]
    fn a_keys_shard_is_below_the_count_for_every_count_and_every_shard_is_reached() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(56);
        let mut hashes: Vec<u64> = vec![0, u64::MAX, 1 << 32, 1 << 56, (1 << 57) - 1];
        hashes.extend((0..64).map(|bit| 1u64 << bit));
        hashes.extend((0..2_000).map(|_| rng.gen::<u64>()));
        for n in [1, 2, 3, 5, 7, 16, 100, 1000, 4097, 65_535, MAX_SHARDS] {
            let watchers: Watchers<u32> = Watchers::new(n);
            for &hash in &hashes {
                let i = watchers.shard_index(hash);
                assert!(i < n, "hash {hash:#x}: shard {i} of {n}");
                let outside = hash ^ 0xfe00_0000_ffff_ffff;
                assert_eq!(watchers.shard_index(outside), i, "{hash:#x} of {n}");
            }
            // Shard `s` starts at the first `x` (bits 32..=56) with `x * n >= s << 25`:
            // each is reached, and the value below is the shard before.
            for shard in 0..n as u64 {
                let first = (shard << SHARD_BITS).div_ceil(n as u64);
                assert_eq!(watchers.shard_index(first << 32), shard as usize, "{n}");
                if shard > 0 {
                    let below = watchers.shard_index((first - 1) << 32);
                    assert_eq!(below, shard as usize - 1, "{n}");
                }
            }
            assert_eq!(watchers.shard_index(u64::MAX), n - 1);
        }
        assert!(std::panic::catch_unwind(|| Watchers::<u32>::new(MAX_SHARDS + 1)).is_err());
        assert!(std::panic::catch_unwind(|| Watchers::<u32>::new(0)).is_err());
    }

    #[test]
    fn a_purge_step_looks_at_about_its_budget_and_resumes_where_it_stopped() {
        let watchers: Watchers<u32> = Watchers::new(1);
        // 10,000 keys of one entry each, every one of them stale.
        let mut entries: Vec<(Option<u32>, OpRef)> = (0..10_000)
            .map(|k| (Some(k), OpRef::for_test(k, 0)))
            .collect();
        assert!(watchers
            .watch_entries(&mut entries, &UserCode::default())
            .is_empty());
        watchers.mark_stale(10_000);
        let mut cursor = Some(PurgeCursor::default());
        let mut steps = 0;
        let mut removed = 0;
        while let Some(from) = cursor {
            let before = watchers.entries();
            let (dropped, next) =
                watchers.purge_step(0, from, 1_000, |_| false, &UserCode::default());
            assert!(dropped <= 1_000, "a step dropped {dropped} entries");
            assert_eq!(watchers.entries(), before - dropped);
            removed += dropped;
            cursor = next;
            steps += 1;
        }
        assert_eq!(removed, 10_000);
        assert!(
            steps >= 10,
            "{steps} steps for 10,000 entries at 1,000 a step"
        );
        assert_eq!((watchers.entries(), watchers.keys()), (0, 0));
        assert_eq!((watchers.listed(), watchers.stale()), (0, 0));
    }

    #[test]
    fn a_purge_step_stops_inside_a_long_list_and_resumes_there() {
        let watchers: Watchers<u32> = Watchers::new(1);
        // One key with 20 blocks' worth of entries, all stale but every tenth.
        let n = 20 * BLOCK as u32;
        let mut entries: Vec<(Option<u32>, OpRef)> =
            (0..n).map(|i| (Some(7), OpRef::for_test(i, 0))).collect();
        assert!(watchers
            .watch_entries(&mut entries, &UserCode::default())
            .is_empty());
        let waiting = |op: OpRef| op.index() % 10 == 0;
        let mut cursor = Some(PurgeCursor::default());
        let mut steps = 0;
        while let Some(from) = cursor {
            let (dropped, next) =
                watchers.purge_step(0, from, BLOCK, waiting, &UserCode::default());
            assert!(dropped <= 2 * BLOCK, "a step dropped {dropped} entries");
            cursor = next;
            steps += 1;
        }
        assert!(
            steps >= 10,
            "{steps} steps for one list of {n} at a block a step"
        );
        let mut left = SmallVec::<[OpRef; 16]>::new();
        watchers.snapshot(&7, &mut left);
        assert_eq!(
            left.iter().map(|op| op.index()).collect::<Vec<_>>(),
            (0..n).filter(|i| i % 10 == 0).collect::<Vec<_>>()
        );
        assert_eq!(watchers.entries(), left.len());
    }

    /// A long list is filtered a segment per hold of its shard's lock: another call on
    /// the shard gets in between two segments (before, it waited for the whole list).
    #[test]
    fn dropping_a_long_lists_completed_entries_lets_other_calls_in_between_segments() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
        let watchers: Watchers<u32> = Watchers::new(1);
        let n = 3 * BLOCK as u32;
        let mut entries: Vec<(Option<u32>, OpRef)> =
            (0..n).map(|i| (Some(7), OpRef::for_test(i, 0))).collect();
        assert!(watchers
            .watch_entries(&mut entries, &UserCode::default())
            .is_empty());
        let looked = AtomicUsize::new(0);
        let other_got_in = AtomicBool::new(false);
        let in_between = AtomicBool::new(false);
        let trying = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Another call on the shard, made while the filter holds the lock.
                while looked.load(SeqCst) == 0 {
                    std::thread::yield_now();
                }
                trying.store(true, SeqCst);
                let mut out = SmallVec::<[OpRef; 4]>::new();
                watchers.snapshot(&8, &mut out);
                other_got_in.store(true, SeqCst);
            });
            let waiting = |op: OpRef| {
                let seen = looked.fetch_add(1, SeqCst);
                if seen == 0 {
                    // Under the lock: let the other call come and wait for it.
                    while !trying.load(SeqCst) {
                        std::thread::yield_now();
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                if seen == 2 * BLOCK {
                    // The third segment: the other call had its turn in between.
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                    while !other_got_in.load(SeqCst) && std::time::Instant::now() < deadline {
                        std::thread::yield_now();
                    }
                    in_between.store(other_got_in.load(SeqCst), SeqCst);
                }
                op.index() % 2 == 0
            };
            assert_eq!(
                watchers.drop_completed(&7, waiting, &UserCode::default()),
                n as usize / 2
            );
        });
        assert!(
            in_between.load(SeqCst),
            "the other call waited for the whole list"
        );
        assert_eq!(watchers.entries(), n as usize / 2);
    }

    /// A watch's keys are each listed or dropped once, inline (3) and spilled (6): a key
    /// whose `Hash` panics (caught, not listed) and a key listed twice (the second
    /// dropped, its entry kept) included.
    #[test]
    fn a_watchs_keys_are_each_listed_or_dropped_once() {
        use std::hash::Hasher;
        use std::rc::Rc;

        #[derive(PartialEq, Eq)]
        struct Key(u32, Rc<()>);
        impl Hash for Key {
            fn hash<H: Hasher>(&self, state: &mut H) {
                assert!(self.0 != 2, "the hash of key 2 panics");
                self.0.hash(state);
            }
        }
        for n in [3, 6] {
            let alive = Rc::new(());
            let watchers: Watchers<Key> = Watchers::new(4);
            let user = UserCode::default();
            let mut keys: Keys<Key> = (0..n).map(|i| Key(i % 5, Rc::clone(&alive))).collect();
            let op = OpRef::for_test(1, 0);
            let failed = watchers.watch_keys(&mut keys, op, &user, ThisStripe::read());
            assert_eq!(failed, 1, "{n} keys");
            assert!(keys.is_empty());
            assert_eq!(watchers.entries(), n as usize - 1);
            assert_eq!(watchers.listed(), n as i64 - 1);
            watchers.clear(&user);
            assert_eq!(Rc::strong_count(&alive), 1, "{n} keys");
        }
    }

    #[test]
    fn a_purge_step_keeps_live_entries_in_order() {
        let watchers: Watchers<u32> = Watchers::new(1);
        let mut entries: Vec<(Option<u32>, OpRef)> =
            (0..6).map(|i| (Some(7), OpRef::for_test(i, 0))).collect();
        assert!(watchers
            .watch_entries(&mut entries, &UserCode::default())
            .is_empty());
        let (dropped, next) = watchers.purge_step(
            0,
            PurgeCursor::default(),
            usize::MAX,
            |op| op.index() % 2 == 0,
            &UserCode::default(),
        );
        assert_eq!((dropped, next), (3, None));
        let mut left = SmallVec::<[OpRef; 16]>::new();
        watchers.snapshot(&7, &mut left);
        assert_eq!(
            left.iter().map(|op| op.index()).collect::<Vec<_>>(),
            [0, 2, 4]
        );
    }
}
