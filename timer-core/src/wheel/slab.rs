//! The entry arena: every task the wheel holds lives in one slot of this slab.
//!
//! # Layout
//! Slots live in one flat array, indexed by slot number: one bounds check and no
//! indirection per access. The hot paths (cancel, re-add into a freed slot) are bound by
//! cache misses, and the fewer instructions each takes, the more of them the CPU keeps in
//! flight at once; a chunked layout measured 2-3x slower per random-order cancel here.
//! Growing the array past its capacity reallocates; its memory comes from the system
//! whatever the global allocator is (`system_vec.rs`): a large array is pages mapped for
//! it alone, which grow by remapping, so no growth copies it under the shard's lock.
//!
//! Freed slots are tracked in a separate bitmap ([`FreeSlots`]), not a list threaded
//! through the freed slots (each pop would chase a pointer through cold memory), and the
//! lowest free slot is reused first, so re-adding after random-order cancels fills the
//! slab in address order.
//!
//! # Invariants
//! - A slot is *vacant* (in `free`) or *occupied*. An occupied slot is *live* (its `task`
//!   is `Some`) or *cancelled*: its task was taken by a cancel that left the unlink for
//!   later (see `deferred_unlinks.rs`), so it is still linked into its bucket list. Only
//!   occupied slots are linked (see `bucket.rs`); [`Slab::occupied`] counts both kinds,
//!   as the slots neither free nor retired (no count of its own to keep up). A vacant
//!   slot's `bucket` is `NIL`; its `next` and `prev` may still hold the links it had
//!   (an expiry leaves them): nothing follows them (a prefetch for a stale key may read
//!   them, as a hint) until the slot is filled again, which writes them.
//! - A slot's `generation` changes exactly once per task it held: when the task leaves
//!   (it fired, was cancelled, or was drained; a cancelled slot changes at the cancel,
//!   before it is freed). A [`SlotKey`] names a slot *and* the generation it was handed
//!   out with, so a key to a task that has since left never matches again, even after
//!   the slot is reused.
//!   Generations never wrap: a slot whose generation reaches [`RETIRED`] (after
//!   2^32 - 1 tasks) is retired instead of freed, and never handed out again, so no key
//!   ever issued matches it. That costs one entry per 2^32 - 1 tasks of one slot.
//! - Every slot in `free` is below `entries.len()` and vacant; every vacant slot is in
//!   `free` or retired (counted in `retired`).
//! - A slot created (pushed) starts with generation `floor`, the highest generation of
//!   the slots [`give_back`](Slab::give_back) dropped (each a vacant slot's next
//!   generation, above every key it was handed out with), so a key to a dropped slot
//!   never matches a slot made again at its index. Slots are not dropped while one of
//!   them is above [`MAX_FLOOR`] (`RETIRED / 2`), so `floor` never goes past it.

use super::free_slots::FreeSlots;
use super::system_vec::SystemVec;

/// "No slot": the end of a list, or a slot that is not linked anywhere.
pub(crate) const NIL: u32 = u32::MAX;

/// The generation of a retired slot: no task ever holds it, so no key names it.
pub(crate) const RETIRED: u32 = u32::MAX;

/// A generation-checked reference to one live slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotKey {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

/// One slot of the arena. 32 bytes when `T` is a pointer or a `u32`-sized value with a
/// niche-free `Option` layout of 8 bytes.
///
/// A small slab's buffer is only as aligned as the system allocator makes it (16 bytes),
/// a large one's is mapped pages (`system_vec.rs`); entries of other sizes than 32 bytes
/// (a purgatory's are 40) straddle two cache lines in either, about half of them. Code
/// that reads entries ahead of using them reads two fields far apart.
#[derive(Debug)]
pub(crate) struct Entry<T> {
    /// Next slot in the same bucket list, or `NIL`.
    pub(crate) next: u32,
    /// Previous slot in the same bucket list, or `NIL` when this is the head.
    pub(crate) prev: u32,
    pub(crate) generation: u32,
    /// The bucket this entry is linked into, or `NIL`.
    pub(crate) bucket: u32,
    /// Expiration in wheel ticks (a deadline rounded up to a tick).
    pub(crate) expiration: u64,
    pub(crate) task: Option<T>,
}

#[derive(Debug)]
pub(crate) struct Slab<T> {
    pub(crate) entries: SystemVec<Entry<T>>,
    pub(crate) free: FreeSlots,
    /// Slots retired because their generation reached [`RETIRED`].
    pub(crate) retired: usize,
    /// The generation a slot created from now on starts with: above every generation of
    /// the slots given back ([`give_back`](Self::give_back)), so no key to them matches.
    floor: u32,
    /// A give-back is under way: the next [`give_back`](Self::give_back) goes on down to
    /// the last slot in use, without deciding again.
    giving_back: bool,
}

/// The memory a give-back took out of a slab: dropping it frees it. Freeing a large
/// block returns its pages to the system, which can take milliseconds (and, while it
/// runs, every other change to the process's mappings waits): `TimerCore::give_back`
/// drops it outside the shard's lock, and a caller that must not wait hands it elsewhere
/// (`TimerCore::give_back_elsewhere`).
pub(crate) struct Spare<T> {
    _entries: SystemVec<Entry<T>>,
    _free: [Vec<u64>; 2],
}

/// The highest generation among the slots [`Slab::give_back`] drops: above it they stay,
/// since `floor` would rise to it and every slot made from then on start there (one hot
/// slot would age them all). At most this, a slot made again has 2^31 tasks ahead.
const MAX_FLOOR: u32 = RETIRED / 2;

/// Fewest slots a slab decides to give back ([`Slab::give_back`]).
const GIVE_BACK_MIN: usize = 4096;

/// Most slots one [`Slab::give_back`] drops (1 MiB of 32-byte entries): the read of
/// their generations and their unmapping hold the shard's lock, and the caller (a
/// purgatory's reaper, between rounds) busy, about 0.3 ms.
const GIVE_BACK_STEP: usize = 1 << 15;

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            entries: SystemVec::new(),
            free: FreeSlots::default(),
            retired: 0,
            floor: 0,
            giving_back: false,
        }
    }

    /// Number of occupied slots: every slot is free, retired or occupied (kept as a
    /// difference, not a count: an insert and an expiry each update one count less).
    pub(crate) fn occupied(&self) -> usize {
        self.entries.len() - self.free.len() - self.retired
    }

    /// Reads the entries the next `n` inserts will fill, so that their cache misses are
    /// taken together now instead of one per insert (each insert needs its entry's
    /// generation before it can go on).
    pub(crate) fn prefetch_vacant(&self, n: usize) {
        let mut generations = 0u32;
        self.free.peek_lowest(n, |index| {
            generations ^= self.entries[index as usize].generation;
        });
        std::hint::black_box(generations);
    }

    /// Stores `task` in a vacant slot (a freed one first) and returns its key.
    /// The new entry is not linked into any bucket yet.
    #[inline(always)]
    pub(crate) fn insert(&mut self, expiration: u64, task: T) -> SlotKey {
        self.insert_linked(expiration, task, NIL, NIL)
    }

    /// [`insert`](Self::insert) of an entry about to head bucket `bucket`'s list, ahead
    /// of `next`: the entry's links are written once, here; the caller completes the
    /// link (`Bucket::push_new`). With `NIL` for both, the entry is not linked.
    ///
    /// Always inlined (into `Wheel::insert`, and so into `TimerCore::add`): see there.
    #[inline(always)]
    pub(crate) fn insert_linked(
        &mut self,
        expiration: u64,
        task: T,
        next: u32,
        bucket: u32,
    ) -> SlotKey {
        if let Some(index) = self.free.pop() {
            debug_assert!((index as usize) < self.entries.len());
            // SAFETY: every slot in `free` is below `entries.len()` (see the module doc:
            // slots enter `free` from `entries`, and a give-back drops the free slots it
            // truncates from both).
            let entry = unsafe { self.entries.get_unchecked_mut(index as usize) };
            debug_assert!(
                entry.task.is_none() && entry.bucket == NIL,
                "the free set named an occupied slot"
            );
            entry.next = next;
            entry.prev = NIL;
            entry.bucket = bucket;
            entry.expiration = expiration;
            entry.task = Some(task);
            return SlotKey {
                index,
                generation: entry.generation,
            };
        }
        let index = u32::try_from(self.entries.len())
            .ok()
            .filter(|i| *i != NIL)
            .expect("timer slab is full (2^32 - 1 tasks in one shard)");
        self.free.cover(index);
        self.entries.push(Entry {
            next,
            prev: NIL,
            generation: self.floor,
            bucket,
            expiration,
            task: Some(task),
        });
        SlotKey {
            index,
            generation: self.floor,
        }
    }

    /// The slot a live key names, if the key is not stale.
    pub(crate) fn lookup(&self, key: SlotKey) -> Option<&Entry<T>> {
        let entry = self.entries.get(key.index as usize)?;
        (entry.generation == key.generation && entry.task.is_some()).then_some(entry)
    }

    /// Starts bringing the cache line of slot `index` (if it exists) into the cache,
    /// without waiting for it: a hint for an access that comes later.
    #[inline]
    pub(crate) fn prefetch(&self, index: u32) {
        if let Some(entry) = self.entries.get(index as usize) {
            prefetch(entry);
        }
    }

    /// Frees a cancelled slot (task already taken, generation already bumped) once the
    /// caller has unlinked it from its bucket.
    #[inline]
    pub(crate) fn release_cancelled(&mut self, index: u32) {
        debug_assert!(
            self.entries[index as usize].task.is_none(),
            "releasing a live slot"
        );
        self.vacate(index);
    }

    /// Moves a vacated slot's generation on, making every key to it stale.
    #[inline]
    pub(crate) fn bump_generation(entry: &mut Entry<T>) {
        debug_assert_ne!(entry.generation, RETIRED, "a retired slot held a task");
        entry.generation += 1;
    }

    /// Returns a slot whose task has left (generation already moved on) to the free set,
    /// or retires it if its generation is used up.
    #[inline]
    fn vacate(&mut self, index: u32) {
        if self.entries[index as usize].generation == RETIRED {
            self.retired += 1;
        } else {
            self.free.push(index);
        }
    }

    /// Empties a live slot, bumps its generation and returns its task. The slot must be
    /// in no bucket list, or in one the caller took whole (`Bucket::take`) and walks: it
    /// is marked unlinked here, its `next` and `prev` left as they are (a vacant slot's
    /// mean nothing), so an expiry looks the slot up once (clearing its links first
    /// took a second look-up).
    #[inline]
    pub(crate) fn remove(&mut self, index: u32) -> T {
        let entry = self.get_mut(index);
        entry.bucket = NIL;
        let task = entry.task.take().expect("removing a vacant slot");
        Self::bump_generation(entry);
        self.vacate(index);
        task
    }

    /// Takes every task out and frees every occupied slot, unlinked (the caller empties
    /// the bucket lists). Slots are kept, with their generations moved on, so a key to a
    /// drained task never matches a task added later.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut tasks = Vec::with_capacity(self.occupied());
        for (index, entry) in self.entries.iter_mut().enumerate() {
            if entry.bucket == NIL && entry.task.is_none() {
                continue; // vacant, already free
            }
            if let Some(task) = entry.task.take() {
                tasks.push(task);
                Self::bump_generation(entry);
            }
            entry.next = NIL;
            entry.prev = NIL;
            entry.bucket = NIL;
            if entry.generation == RETIRED {
                self.retired += 1;
            } else {
                self.free.push(index as u32);
            }
        }
        tasks
    }

    /// [`give_back_step`](Self::give_back_step), its spare memory freed here.
    pub(crate) fn give_back(&mut self) -> usize {
        self.give_back_step().0
    }

    /// Drops the free slots above the last slot in use, once at most a quarter of the
    /// slots are occupied and at least half of them would go (and [`GIVE_BACK_MIN`] at
    /// least), so a burst's slots do not stay allocated for good while a steady load
    /// keeps at least four times its slots. At most [`GIVE_BACK_STEP`] slots a call: once
    /// decided, the next calls go on down to the last slot in use. The next occupants of
    /// slots made again start above every generation dropped. Returns how many slots it
    /// dropped, and, from the call that ends a give-back, the memory they took
    /// ([`Spare`]), for the caller to free where it likes.
    pub(crate) fn give_back_step(&mut self) -> (usize, Option<Spare<T>>) {
        let len = self.entries.len();
        if !self.giving_back && (len < 2 * GIVE_BACK_MIN || self.occupied() * 4 > len) {
            return (0, None);
        }
        let keep = self.free.free_above(len);
        if !self.giving_back && (len - keep < GIVE_BACK_MIN || keep * 2 > len) {
            return (0, None);
        }
        let mut to = keep.max(len.saturating_sub(GIVE_BACK_STEP));
        // A slot above `MAX_FLOOR` stays, and so does every slot below it: dropped, it
        // would raise `floor` to its generation, where every slot made from now on starts
        // (one hot slot would age them all).
        let hot = self.entries[to..]
            .iter()
            .rposition(|e| e.generation > MAX_FLOOR);
        if let Some(at) = hot {
            to += at + 1;
        }
        if to == len {
            self.giving_back = false;
            return (0, self.take_spare());
        }
        // Free slots only (retired ones are not free): below `RETIRED`.
        let top = self.entries[to..]
            .iter()
            .map(|e| e.generation)
            .max()
            .unwrap_or(0);
        self.floor = self.floor.max(top);
        self.entries.truncate(to);
        self.free.truncate(to);
        self.giving_back = hot.is_none() && to > keep;
        let spare = if self.giving_back {
            None
        } else {
            self.take_spare()
        };
        (len - to, spare)
    }

    /// The room the entries and the free set no longer need, once a give-back is over:
    /// they move to buffers of their length, and the old ones come out. Entries longer
    /// than a give-back step are not copied: their buffer shrinks in place instead.
    fn take_spare(&mut self) -> Option<Spare<T>> {
        let len = self.entries.len();
        if self.entries.capacity() <= 2 * len {
            return None;
        }
        let entries = if len <= GIVE_BACK_STEP {
            self.entries.move_to_fit()
        } else {
            self.entries.shrink_to(len);
            SystemVec::new()
        };
        Some(Spare {
            _entries: entries,
            _free: self.free.take_spare(),
        })
    }

    /// The bytes its entries' block holds: room made, in use or not (the free set's
    /// bitmap, an eighth of a byte a slot, not counted).
    pub(crate) fn bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry<T>>()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, index: u32) -> &mut Entry<T> {
        &mut self.entries[index as usize]
    }
}

/// Starts fetching the cache line of `value` into every cache level and returns at once
/// (`prefetcht0`). A read prefetch: with no other core holding the line it arrives
/// exclusive, so a later write to it needs no second trip. (The write-intent hint,
/// `PREFETCHW`, needs a target feature the default x86_64 target does not enable.)
#[inline(always)]
fn prefetch<V>(value: &V) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads no memory the program can observe and never faults, so any
    // address is fine (here, a live reference). `_mm_prefetch` needs SSE, which every
    // x86_64 CPU has.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((value as *const V).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_is_32_bytes_for_pointer_tasks() {
        assert_eq!(std::mem::size_of::<Entry<Box<u8>>>(), 32);
        assert_eq!(std::mem::size_of::<Entry<std::sync::Arc<u8>>>(), 32);
        assert_eq!(std::mem::size_of::<Entry<u32>>(), 32);
    }

    #[test]
    fn a_slot_whose_generation_is_used_up_is_retired_not_reused() {
        let mut slab = Slab::new();
        let a = slab.insert(1, "a");
        // As if the slot had held 2^32 - 2 tasks already.
        slab.entries[a.index as usize].generation = RETIRED - 1;
        let last = SlotKey {
            index: a.index,
            generation: RETIRED - 1,
        };
        assert_eq!(slab.remove(last.index), "a");
        assert_eq!(slab.entries[a.index as usize].generation, RETIRED);
        let b = slab.insert(2, "b");
        assert_ne!(b.index, a.index, "a retired slot is never handed out again");
        assert!(slab.lookup(last).is_none() && slab.lookup(a).is_none());
        assert_eq!(slab.occupied(), 1);
        // Drained and refilled: still retired.
        slab.drain();
        let c = slab.insert(3, "c");
        assert_eq!(c.index, b.index);
        assert_eq!(slab.occupied(), 1);
    }

    #[test]
    fn stale_key_never_matches_a_reused_slot() {
        let mut slab = Slab::new();
        let a = slab.insert(1, "a");
        assert_eq!(slab.remove(a.index), "a");
        let b = slab.insert(2, "b");
        assert_eq!(a.index, b.index, "freed slot is reused first");
        assert!(slab.lookup(a).is_none());
        assert_eq!(slab.lookup(b).map(|e| e.expiration), Some(2));
    }

    #[test]
    fn slots_freed_past_the_first_summary_word_are_reused_lowest_first_after_a_drain() {
        let mut slab = Slab::new();
        for round in 0..2 {
            // 5,000 slots: the free bitmap's second summary word starts at slot 4,096.
            let keys: Vec<_> = (0..5_000u64).map(|i| slab.insert(i, i)).collect();
            assert_eq!(keys[4_999].index, 4_999, "round {round} starts from slot 0");
            slab.remove(4_999);
            slab.remove(4_096);
            assert_eq!(slab.occupied(), 4_998);
            assert_eq!(slab.insert(0, 0).index, 4_096, "lowest free slot first");
            assert_eq!(slab.insert(0, 0).index, 4_999);
            assert_eq!(slab.insert(0, 0).index, 5_000, "then a new slot");
            assert_eq!(slab.drain().len(), 5_001);
            assert_eq!(slab.occupied(), 0);
        }
    }

    /// A burst's slots go back once it drained to a quarter, down to the last slot in
    /// use; keys to them match nothing, before or after the slots are made again.
    #[test]
    fn a_drained_bursts_slots_are_given_back_and_its_keys_stay_stale() {
        let mut slab = Slab::new();
        let keys: Vec<_> = (0..100_000u64).map(|i| slab.insert(i, i)).collect();
        assert_eq!(slab.give_back(), 0, "all in use");
        // All but the first 1,000 leave; one more, at 40,000, stays for a while.
        for key in &keys[1_000..] {
            if key.index != 40_000 {
                slab.remove(key.index);
            }
        }
        assert_eq!(
            give_back_all(&mut slab),
            100_000 - 40_001,
            "down to the last in use"
        );
        slab.remove(40_000);
        assert_eq!(give_back_all(&mut slab), 40_001 - 1_000);
        assert_eq!(slab.entries.len(), 1_000);
        assert!(slab.entries.capacity() < 2_000, "the memory went too");
        assert_eq!(slab.occupied(), 1_000);
        assert_eq!(slab.give_back(), 0, "nothing more to give");
        for key in &keys[1_000..] {
            assert!(slab.lookup(*key).is_none());
        }
        // Made again: every new key differs from every old key of its slot.
        let again: Vec<_> = (0..99_000u64).map(|i| slab.insert(i, i)).collect();
        for key in &keys[1_000..] {
            assert!(slab.lookup(*key).is_none(), "{key:?}");
        }
        for (old, new) in keys[1_000..].iter().zip(&again) {
            assert_eq!(old.index, new.index);
            assert!(new.generation > old.generation);
        }
        assert_eq!(slab.occupied(), 100_000);
    }

    /// [`Slab::give_back`] until it gives nothing; how many slots went.
    fn give_back_all<T>(slab: &mut Slab<T>) -> usize {
        std::iter::from_fn(|| Some(slab.give_back()))
            .take_while(|&slots| slots > 0)
            .sum()
    }

    /// A large burst goes back [`GIVE_BACK_STEP`] slots a call (what one call holds the
    /// shard's lock for stays bounded), down to the last slot in use, once decided:
    /// the steps after the first go on although fewer than half the slots are left to go.
    /// The memory comes out of the slab at the end, to be freed by the caller.
    #[test]
    fn a_large_burst_goes_back_a_bounded_step_a_call() {
        let mut slab = Slab::new();
        let keys: Vec<_> = (0..200_000u64).map(|i| slab.insert(i, i)).collect();
        for key in &keys[1_000..] {
            slab.remove(key.index);
        }
        let mut spares = Vec::new();
        let mut steps = Vec::new();
        loop {
            let (slots, spare) = slab.give_back_step();
            spares.push(spare.is_some());
            if slots == 0 {
                break;
            }
            steps.push(slots);
        }
        // The memory comes out once, from the step that ends the give-back, for the
        // caller to free where it likes; the slab keeps room for what it holds only.
        let last = spares.len() - 2;
        assert!(
            spares[last] && spares.iter().filter(|&&s| s).count() == 1,
            "{spares:?}"
        );
        let (last, full) = steps.split_last().expect("steps");
        assert!(
            full.iter().all(|&slots| slots == GIVE_BACK_STEP),
            "{steps:?}"
        );
        assert!(*last <= GIVE_BACK_STEP);
        assert_eq!(
            steps.iter().sum::<usize>(),
            200_000 - 1_000,
            "down to the last in use"
        );
        assert!(steps.len() > 3, "{steps:?}");
        assert_eq!(slab.entries.len(), 1_000);
        assert!(slab.entries.capacity() < 2_000, "the memory went too");
        assert_eq!(slab.occupied(), 1_000);
        assert_eq!(slab.give_back(), 0, "nothing more to give");
        for key in &keys[1_000..] {
            assert!(slab.lookup(*key).is_none());
        }
    }

    /// A hot slot among the free top ones keeps itself and those below it: dropped, it
    /// would raise `floor` to its generation, the one every slot made later starts with.
    #[test]
    fn a_hot_slot_keeps_the_slots_above_the_last_in_use() {
        let mut slab = Slab::new();
        let keys: Vec<_> = (0..100_000u64).map(|i| slab.insert(i, i)).collect();
        for key in &keys[1_000..] {
            slab.remove(key.index);
        }
        slab.entries[50_000].generation = RETIRED - 3;
        assert_eq!(
            give_back_all(&mut slab),
            100_000 - 50_001,
            "the hot slot keeps itself and those below it"
        );
        assert_eq!(slab.floor, 1, "the slots dropped held one task each");
        let again = slab.insert(0, 0);
        assert!(again.generation < 8, "{again:?}");
        slab.entries[50_000].generation = 5;
        assert!(slab.give_back() > 0, "cooled down, they go");
    }

    /// A steady load keeps its slots: nothing goes back while more than a quarter of
    /// them are occupied.
    #[test]
    fn a_steady_load_keeps_its_slots() {
        let mut slab = Slab::new();
        let keys: Vec<_> = (0..20_000u64).map(|i| slab.insert(i, i)).collect();
        for key in &keys[5_001..] {
            slab.remove(key.index);
        }
        for i in 0..10_000u64 {
            assert_eq!(slab.give_back(), 0);
            let key = slab.insert(i, i);
            slab.remove(key.index);
        }
        assert_eq!(slab.entries.len(), 20_000);
    }

    #[test]
    fn grows_and_drains() {
        let mut slab = Slab::new();
        let keys: Vec<_> = (0..10_000u64).map(|i| slab.insert(i, i)).collect();
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(slab.lookup(*k).unwrap().task, Some(i as u64));
        }
        assert_eq!(slab.occupied(), keys.len());
        let mut drained = slab.drain();
        drained.sort_unstable();
        assert_eq!(drained.len(), keys.len());
        assert_eq!(slab.occupied(), 0);
        assert!(slab.lookup(keys[0]).is_none());
    }
}
