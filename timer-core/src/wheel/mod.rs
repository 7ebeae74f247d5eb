//! The hierarchical timing wheel (Kafka's `TimingWheel`), single-threaded, in integer ticks.
//!
//! The wheel knows nothing of clocks, threads or durations: time is a `u64` tick count
//! that only moves when [`Wheel::advance`] is called. The thread-safe [`Timer`](crate::Timer)
//! converts clock readings to ticks and wraps one wheel per shard in a lock.
//!
//! # Geometry
//! Level `L` has `wheel_size` buckets, a tick of `wheel_size^L` and an interval of
//! `wheel_size^(L+1)`. Its current time is a multiple of its tick, rounded down from the
//! level-0 time. An entry with expiration `e`, placed from level 0 upward, goes to the first
//! level where `e < current + interval`, into bucket `(e / tick) % wheel_size`, whose
//! expiration becomes `(e / tick) * tick`: the start of the bucket's range. Levels above 0
//! are created the first time an entry needs them.
//!
//! # Invariants
//! - Every linked entry sits in a bucket whose expiration is later than that level's
//!   current time, and within one interval of it, so a bucket never mixes two rounds.
//! - Every bucket with entries (and possibly some emptied by cancels or resets) is in the
//!   bucket queue exactly once, under its expiration.
//! - After `advance`, `reset`, and the batch cancels of `TimerCore::cancel_batch`, the
//!   earliest queued bucket has an entry linked (`drop_emptied_front`): a driver sleeping
//!   until [`Wheel::next_expiration`] is not woken for a bucket those emptied. A single
//!   `cancel` defers its unlink (`deferred_unlinks.rs`), so a bucket it empties stays
//!   queued until one of those comes by (at the latest the `advance` that reaches it).
//! - A bucket list may still hold up to 8 cancelled entries (no task, no key names them)
//!   whose unlink a cancel deferred (see `deferred_unlinks.rs`). `advance` unlinks them
//!   before it walks any list, so flushing meets live entries only, and `len` does not
//!   count them.
//! - [`Wheel::advance`] to `now` flushes every bucket with expiration `<= now`, earliest
//!   first: each entry either expires (its expiration is `<=` the level-0 time the clock has
//!   reached) or is placed again from level 0, landing in a finer bucket (the cascade).
//!   So an entry is never handed out before its expiration tick, and never after the first
//!   `advance` that reaches it.
//! - Expirations beyond the top level's range are clamped to its last tick. The top level
//!   is the highest whose interval `wheel_size^(level + 1)` is at most `2^62` ticks, so the
//!   range depends on the wheel size: about `2^60.5` ticks with 20 buckets, at least `2^54`
//!   for every size up to 256, and as little as `2^46.5` for sizes above 46,340.
//! - Tick arithmetic never overflows, even at tick counts near `u64::MAX`. Time ends at
//!   `LAST_TICK`: a later start, expiration or `advance` target counts as that tick (the value
//!   `u64::MAX` marks a bucket that is not queued, so no bucket may start there).

mod bucket;
mod bucket_queue;
mod deferred_unlinks;
mod free_slots;
mod slab;
mod system_vec;

pub use self::slab::SlotKey;
pub(crate) use self::slab::Spare;
/// One slab entry holding a `T` (its size is what [`Wheel`]'s entry bytes count).
#[cfg(test)]
pub(crate) type EntryOf<T> = self::slab::Entry<T>;

use self::bucket::{Bucket, NOT_QUEUED};
use self::bucket_queue::BucketQueue;
use self::deferred_unlinks::DeferredUnlinks;
use self::slab::{Slab, NIL};

/// Largest interval a level may have: keeps a level's interval and its bucket arithmetic
/// far from overflow. `current + interval` can still pass `u64::MAX` near the end of
/// time, which is why a level's cached `end` saturates.
const MAX_INTERVAL: u64 = 1 << 62;

/// The last tick the wheel represents; `u64::MAX` is [`NOT_QUEUED`].
const LAST_TICK: u64 = NOT_QUEUED - 1;

#[derive(Debug, Clone)]
struct Level {
    tick: u64,
    interval: u64,
    /// A multiple of `tick`.
    current: u64,
    /// `(current / tick) % wheel_size`: the slot of `current`, kept so that placing an
    /// entry needs no modulo (and on level 0 no division at all).
    current_slot: u64,
    /// `current + interval`, saturating: an expiration below it fits this level. Kept
    /// so that finding an entry's level is one comparison per level.
    end: u64,
}

impl Level {
    fn new(tick: u64, wheel_size: u32, time: u64) -> Level {
        let mut level = Level {
            tick,
            interval: tick * u64::from(wheel_size),
            current: 0,
            current_slot: 0,
            end: 0,
        };
        level.move_to(time, wheel_size);
        level
    }

    /// Moves `current` to `time` rounded down to the tick (the caller ensures it is not
    /// earlier than `current`).
    fn move_to(&mut self, time: u64, wheel_size: u32) {
        let ticks = time / self.tick;
        self.current = ticks * self.tick;
        self.current_slot = ticks % u64::from(wheel_size);
        self.end = self.current.saturating_add(self.interval);
    }
}

/// A hierarchical timing wheel holding tasks of type `T`, with time in whole ticks.
///
/// `insert`, `cancel` and `reset` are O(1); `advance` does work proportional to the buckets that
/// are due and the entries in them.
#[derive(Debug)]
pub struct Wheel<T> {
    wheel_size: u32,
    max_levels: usize,
    levels: Vec<Level>,
    /// All levels' buckets, flattened: bucket id `level * wheel_size + slot`.
    buckets: Vec<Bucket>,
    slab: Slab<T>,
    queue: BucketQueue,
    /// Cancelled entries still linked into their buckets.
    cancelled: DeferredUnlinks,
}

impl<T> Wheel<T> {
    /// A wheel of `wheel_size` buckets per level whose time starts at tick `start`.
    ///
    /// # Panics
    /// If `wheel_size < 2`; the [`TimerBuilder`](crate::TimerBuilder) rejects such sizes
    /// with an error before they get here.
    pub fn new(wheel_size: u32, start: u64) -> Self {
        assert!(
            wheel_size >= 2,
            "a wheel needs at least 2 buckets per level"
        );
        let size = u64::from(wheel_size);
        let mut max_levels = 1;
        let mut interval = size;
        while let Some(next) = interval.checked_mul(size).filter(|n| *n <= MAX_INTERVAL) {
            interval = next;
            max_levels += 1;
        }
        Wheel {
            wheel_size,
            max_levels,
            levels: vec![Level::new(1, wheel_size, start.min(LAST_TICK))],
            buckets: vec![Bucket::EMPTY; wheel_size as usize],
            slab: Slab::new(),
            queue: BucketQueue::default(),
            cancelled: DeferredUnlinks::new(),
        }
    }

    /// The wheel's current time (level 0), in ticks.
    pub fn current_tick(&self) -> u64 {
        self.level0().current
    }

    /// Level 0, without a bounds check: an add reads it twice (3 instructions each).
    #[inline(always)]
    fn level0(&self) -> &Level {
        debug_assert!(!self.levels.is_empty());
        // SAFETY: `levels` is never empty: `new` makes level 0, and levels are only ever
        // added (`add_level` pushes one), never removed.
        unsafe { self.levels.get_unchecked(0) }
    }

    /// Number of tasks held.
    pub fn len(&self) -> usize {
        self.slab.occupied() - self.cancelled.len()
    }

    /// The bytes the entry slab holds (see `Slab::bytes`).
    pub(crate) fn entry_bytes(&self) -> usize {
        self.slab.bytes()
    }

    /// Whether the wheel holds no task.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of levels created so far.
    pub fn levels(&self) -> usize {
        self.levels.len()
    }

    /// Number of buckets in the bucket queue (bounded by levels x wheel size).
    pub fn queued_buckets(&self) -> usize {
        self.queue.len()
    }

    /// The expiration of the earliest queued bucket: the tick at which `advance` next has
    /// work to do. `None` when no bucket is queued.
    pub fn next_expiration(&self) -> Option<u64> {
        self.queue.peek()
    }

    /// Takes the buckets that cancels or resets emptied off the front of the bucket
    /// queue, so that [`next_expiration`](Self::next_expiration) names a bucket that
    /// holds an entry (or one whose cancelled entries still wait to be unlinked, see
    /// `deferred_unlinks.rs`). A driver that sleeps until then no longer wakes for a
    /// bucket with nothing in it. Stops at the first bucket with an entry linked.
    pub(crate) fn drop_emptied_front(&mut self) {
        while let Some((expiration, id)) = self.queue.first() {
            let bucket = &mut self.buckets[id as usize];
            if bucket.head != NIL {
                return;
            }
            debug_assert_eq!(bucket.expiration, expiration, "bucket queued twice");
            bucket.expiration = NOT_QUEUED;
            self.queue.pop();
        }
    }

    /// Stores `task` to expire at tick `expiration` and returns its key.
    ///
    /// An expiration at or before the current tick is due now: the task goes into the
    /// bucket of the current tick and is handed out by the next `advance` (insert never
    /// hands a task back, so a caller never runs a task on its own thread by surprise).
    //
    // Always inlined, with the slab's insert: LLVM otherwise keeps one of them a call
    // from `TimerCore::add`, whose prologue, epilogue and argument moves cost about 15
    // instructions an add.
    #[inline(always)]
    pub fn insert(&mut self, expiration: u64, task: T) -> SlotKey {
        self.insert_queuing(expiration.min(LAST_TICK), task).0
    }

    /// [`insert`](Self::insert), returning also the expiration under which it put the
    /// task's bucket in the bucket queue, or [`NOT_QUEUED`] when that bucket was queued
    /// already. An insert only ever pushes onto the queue, so the earliest queued
    /// expiration after it is the earlier of the one before and this one (the timer
    /// publishes it without reading the queue).
    ///
    /// `expiration` must be at most [`LAST_TICK`]: unlike `insert`, this does not clamp
    /// it (one comparison and a move less an add). The timer's expirations are: a
    /// deadline in ticks rounded up, with a tick of at least 2 ns, is at most
    /// `ceil(u64::MAX / 2)`, far below it (see `TimerCore::ticks_ceil`).
    // Always inlined: see `insert`.
    #[inline(always)]
    pub(crate) fn insert_queuing(&mut self, expiration: u64, task: T) -> (SlotKey, u64) {
        debug_assert!(expiration <= LAST_TICK, "an expiration past the last tick");
        let expiration = expiration.max(self.level0().current);
        let Some((id, start)) = self.locate(expiration) else {
            return self.insert_beyond_levels(expiration, task);
        };
        // `place`, for an entry made here: linked as it is stored. Stored before its
        // bucket is queued: the slab's insert may panic (a full slab), and a bucket it
        // left queued but empty would then have no published expiration for it, and a
        // later add to it would queue nothing, so publish nothing either.
        debug_assert!((id as usize) < self.buckets.len());
        // SAFETY: `locate` returns only ids below `buckets.len()` (see there).
        let bucket = unsafe { self.buckets.get_unchecked_mut(id as usize) };
        let key = bucket.push_new(id, expiration, task, &mut self.slab);
        let queued = bucket.enqueue(id, start, &mut self.queue);
        (key, queued)
    }

    /// [`insert_queuing`](Self::insert_queuing) of an expiration beyond the top existing
    /// level (see [`place_beyond_levels`](Self::place_beyond_levels)).
    #[cold]
    fn insert_beyond_levels(&mut self, expiration: u64, task: T) -> (SlotKey, u64) {
        let key = self.slab.insert(expiration, task);
        (key, self.place_beyond_levels(key.index, expiration))
    }

    /// Brings the slab entries the next `n` inserts will use into the cache (a hint for
    /// batches: see `Timer::add_batch`).
    pub(crate) fn prefetch_inserts(&self, n: usize) {
        self.slab.prefetch_vacant(n);
    }

    /// Brings the entries of up to 64 `keys` about to be cancelled, and their list
    /// neighbours, into the cache (a hint for batches: see `Timer::cancel_batch`). A
    /// cancel reads its entry, then writes both neighbours; one after the other, each is
    /// a miss waiting for the one before. Read here in two sweeps (entries, then the
    /// neighbours they name), the misses of a sweep overlap.
    pub(crate) fn prefetch_cancels(&self, keys: impl Iterator<Item = SlotKey>) {
        let entries = &self.slab.entries;
        let mut neighbours = [NIL; 128];
        let mut n = 0;
        let mut sum = 0u32;
        for key in keys.take(64) {
            if let Some(entry) = entries.get(key.index as usize) {
                neighbours[n] = entry.prev;
                neighbours[n + 1] = entry.next;
                n += 2;
                // A field far from `prev`/`next`: an entry may straddle two cache lines
                // (see `Entry`), and cancel reads the whole entry.
                sum ^= entry.expiration as u32;
            }
        }
        for &index in &neighbours[..n] {
            if let Some(entry) = entries.get(index as usize) {
                sum ^= entry.generation;
            }
        }
        std::hint::black_box(sum);
    }

    /// Removes the task `key` names and returns it, or `None` when the key is stale (the
    /// task already expired or was cancelled). O(1).
    ///
    /// The task is out at once: nothing of it runs later and the key is dead. Its entry
    /// stays linked in its bucket a little longer: the cancel 8 cancels later, or the next
    /// `advance`, whichever comes first, unlinks it and frees its slot (see
    /// `deferred_unlinks.rs` for why). So at most 8 slots (256 bytes for pointer-sized
    /// tasks) per wheel wait to be reused.
    #[inline]
    pub fn cancel(&mut self, key: SlotKey) -> Option<T> {
        // Bound by cache misses: reads the entry (one miss), prefetches its neighbours'
        // lines without waiting for them, and unlinks an entry cancelled 8 cancels ago,
        // whose neighbours have arrived by now. Kept short so the CPU overlaps the misses
        // of consecutive cancels.
        let (task, prev, next) = self.take_task(key)?;
        self.slab.prefetch(prev);
        self.slab.prefetch(next);
        if let Some(oldest) = self.cancelled.push(key.index) {
            self.unlink_cancelled(oldest);
        }
        Some(task)
    }

    /// [`cancel`](Self::cancel) that unlinks at once, for a caller that has already
    /// brought the entry and its neighbours into the cache ([`prefetch_cancels`](
    /// Self::prefetch_cancels)): deferring would only add work.
    pub(crate) fn cancel_prefetched(&mut self, key: SlotKey) -> Option<T> {
        let (task, _, _) = self.take_task(key)?;
        self.unlink_cancelled(key.index);
        Some(task)
    }

    /// The first half of a cancel: if `key` is live, takes its task out and bumps the
    /// entry's generation (so no key names it any more), leaving it linked. Returns the
    /// task and the entry's list neighbours.
    #[inline]
    fn take_task(&mut self, key: SlotKey) -> Option<(T, u32, u32)> {
        let entry = self.slab.entries.get_mut(key.index as usize)?;
        if entry.generation != key.generation {
            return None;
        }
        // A key of another wheel may match a vacant slot's generation: no task, `None`.
        let task = entry.task.take()?;
        debug_assert_ne!(entry.bucket, NIL, "a live entry is linked");
        Slab::<T>::bump_generation(entry);
        Some((task, entry.prev, entry.next))
    }

    /// Unlinks the cancelled entry `index` from its bucket and frees its slot.
    #[inline]
    fn unlink_cancelled(&mut self, index: u32) {
        let entry = self.slab.get_mut(index);
        let (prev, next, bucket) = (entry.prev, entry.next, entry.bucket);
        entry.prev = NIL;
        entry.next = NIL;
        entry.bucket = NIL;
        self.buckets[bucket as usize].unlink_between(prev, next, &mut self.slab);
        self.slab.release_cancelled(index);
    }

    /// Unlinks every cancelled entry still linked, so that bucket lists hold live
    /// entries only.
    fn unlink_all_cancelled(&mut self) {
        for index in self.cancelled.take_all() {
            self.unlink_cancelled(index);
        }
    }

    /// Moves the pending task `key` names to expire at tick `expiration` (clamped as by
    /// [`insert`](Self::insert): at or before the current tick means due now). Returns
    /// `false`, and changes nothing, when the key is stale: the task already expired or
    /// was cancelled. O(1): the entry keeps its slot and key; it changes bucket only if
    /// the new expiration belongs to another one (a deadline moved within its bucket's
    /// range costs one write).
    ///
    /// A bucket the entry leaves may be left empty: it leaves the bucket queue at once if
    /// it was the earliest queued, else when it comes to the front (see the module doc).
    pub fn reset(&mut self, key: SlotKey, expiration: u64) -> bool {
        let expiration = expiration.min(LAST_TICK).max(self.level0().current);
        let Some(entry) = self.slab.lookup(key) else {
            return false;
        };
        let (bucket, prev, next) = (entry.bucket, entry.prev, entry.next);
        debug_assert_ne!(bucket, NIL, "a live entry is linked");
        let stays = self.locate(expiration).is_some_and(|(id, start)| {
            id == bucket && self.buckets[id as usize].expiration == start
        });
        let entry = self.slab.get_mut(key.index);
        entry.expiration = expiration;
        if !stays {
            entry.prev = NIL;
            entry.next = NIL;
            entry.bucket = NIL;
            self.buckets[bucket as usize].unlink_between(prev, next, &mut self.slab);
            self.place(key.index, expiration);
            self.drop_emptied_front();
        }
        true
    }

    /// Whether `key` still names a pending task.
    pub fn contains(&self, key: SlotKey) -> bool {
        self.slab.lookup(key).is_some()
    }

    /// Where the task `key` names sits: `(level, bucket)` with level 0 the finest, and the
    /// expiration tick of that bucket.
    pub fn location(&self, key: SlotKey) -> Option<(usize, u32, u64)> {
        let bucket = self.slab.lookup(key)?.bucket;
        let expiration = self.buckets[bucket as usize].expiration;
        Some((
            (bucket / self.wheel_size) as usize,
            bucket % self.wheel_size,
            expiration,
        ))
    }

    /// Moves time to `now`, pushing every task whose expiration is `<= now` onto `expired`
    /// (earliest bucket first). Returns how many were pushed. A `now` earlier than the
    /// current tick does nothing.
    pub fn advance(&mut self, now: u64, expired: &mut Vec<T>) -> usize {
        let before = expired.len();
        self.unlink_all_cancelled();
        while let Some((expiration, id)) = self.queue.pop_due(now) {
            let bucket = &mut self.buckets[id as usize];
            debug_assert_eq!(bucket.expiration, expiration, "bucket queued twice");
            let mut at = bucket.take();
            self.advance_levels(expiration);
            let current = self.level0().current;
            while at != NIL {
                let entry = self.slab.get_mut(at);
                let next = entry.next;
                let entry_expiration = entry.expiration;
                if entry_expiration <= current {
                    // Its links are left as they are: a vacant slot's mean nothing.
                    expired.push(self.slab.remove(at));
                } else {
                    entry.next = NIL;
                    entry.prev = NIL;
                    entry.bucket = NIL;
                    self.place(at, entry_expiration);
                }
                at = next;
            }
        }
        self.advance_levels(now);
        self.drop_emptied_front();
        expired.len() - before
    }

    /// Moves the wheel's time forward to `now` if no bucket is due by then, so that
    /// inserts are placed relative to the real time (fewer cascades later). Does nothing
    /// when a bucket is due: flushing is `advance`'s job. Returns whether it moved (or
    /// had nothing to move for): `false` when a bucket due stopped it.
    pub fn catch_up(&mut self, now: u64) -> bool {
        let free = self.queue.peek().is_none_or(|next| next > now);
        if free {
            self.advance_levels(now);
        }
        free
    }

    /// Gives back the memory of the slots a burst left unused (see `slab.rs`), at most
    /// 32,768 slots a call; returns how many slots it dropped.
    pub fn give_back(&mut self) -> usize {
        self.slab.give_back()
    }

    /// [`give_back`](Self::give_back), the memory it frees returned instead (`slab.rs`).
    pub(crate) fn give_back_step(&mut self) -> (usize, Option<Spare<T>>) {
        self.slab.give_back_step()
    }

    /// Takes every task out, in no particular order, leaving the wheel empty.
    pub fn drain(&mut self) -> Vec<T> {
        // Cancelled entries hold no task; the slab frees their slots with the rest.
        let _ = self.cancelled.take_all();
        for bucket in &mut self.buckets {
            *bucket = Bucket::EMPTY;
        }
        self.queue.clear();
        self.slab.drain()
    }

    fn advance_levels(&mut self, time: u64) {
        let time = time.min(LAST_TICK);
        for level in &mut self.levels {
            // Not `current + tick`, which overflows near `u64::MAX`.
            if time.saturating_sub(level.current) >= level.tick {
                level.move_to(time, self.wheel_size);
            }
        }
    }

    /// Links the unlinked entry `index` with expiration `expiration` (not before the
    /// level-0 time) into the first level that can hold it. Returns the expiration under
    /// which it queued the entry's bucket, or [`NOT_QUEUED`] if the bucket was queued
    /// already.
    ///
    /// Hot path: the level is found by one comparison per level, and the bucket by one
    /// division (none on level 0), using the level's slot cursor instead of
    /// `% wheel_size`. Expirations beyond every existing level go the slow way.
    #[inline]
    fn place(&mut self, index: u32, expiration: u64) -> u64 {
        let Some((id, start)) = self.locate(expiration) else {
            return self.place_beyond_levels(index, expiration);
        };
        let bucket = &mut self.buckets[id as usize];
        bucket.push(id, index, &mut self.slab);
        bucket.enqueue(id, start, &mut self.queue)
    }

    /// The bucket an expiration (not before the level-0 time) belongs in now, and that
    /// bucket's start: `None` when it is beyond every existing level.
    ///
    /// Level 0 first, on its own: its tick is 1, so the bucket's start is the expiration
    /// and the slot needs no division; and a search of the levels above starts at 1.
    ///
    /// The id is below `buckets.len()`, which `insert_queuing` counts on (it indexes the
    /// buckets without a bounds check). `buckets.len()` is `levels.len() * wheel_size`
    /// (`new` makes one level's buckets, `add_level` adds one level's, nothing else
    /// changes its length), `level` is an index into `levels`, and `slot` is below
    /// `wheel_size`: a level's `current_slot` is (a remainder mod `wheel_size`, see
    /// `Level::move_to`), and `steps` is too, since `expiration - current` is below the
    /// level's interval (`tick * wheel_size`): `expiration < end`, and `end` is
    /// `current + interval`, or `u64::MAX` when that sum would pass it (and then
    /// `expiration - current < u64::MAX - current < interval`); so their sum is below
    /// `2 * wheel_size`, and below `wheel_size` once wrapped.
    #[inline]
    fn locate(&self, expiration: u64) -> Option<(u32, u64)> {
        let lvl = self.level0();
        debug_assert!(expiration >= lvl.current, "placing an entry in the past");
        let size = u64::from(self.wheel_size);
        if expiration < lvl.end {
            debug_assert_eq!(lvl.tick, 1);
            let mut slot = lvl.current_slot + (expiration - lvl.current);
            if slot >= size {
                slot -= size;
            }
            debug_assert!(slot < size);
            return Some((slot as u32, expiration));
        }
        let level = 1 + self.levels[1..]
            .iter()
            .position(|lvl| expiration < lvl.end)?;
        let lvl = &self.levels[level];
        let steps = (expiration - lvl.current) / lvl.tick;
        let mut slot = lvl.current_slot + steps;
        if slot >= size {
            slot -= size;
        }
        debug_assert!(slot < size);
        let start = lvl.current + steps * lvl.tick;
        Some((level as u32 * self.wheel_size + slot as u32, start))
    }

    /// [`place`](Self::place) for an expiration beyond the top existing level: adds levels
    /// until one holds it, or clamps it to the end of the highest level there may be
    /// (documented above), then places it.
    #[cold]
    fn place_beyond_levels(&mut self, index: u32, mut expiration: u64) -> u64 {
        loop {
            let top = self.levels.last().expect("level 0 always exists");
            if expiration < top.end {
                return self.place(index, expiration);
            }
            if self.levels.len() == self.max_levels {
                expiration = top.end - 1;
                self.slab.get_mut(index).expiration = expiration;
                return self.place(index, expiration);
            }
            self.add_level();
        }
    }

    fn add_level(&mut self) {
        let below = self.levels.last().expect("level 0 always exists");
        let level = Level::new(below.interval, self.wheel_size, below.current);
        self.levels.push(level);
        self.buckets
            .extend(std::iter::repeat_n(Bucket::EMPTY, self.wheel_size as usize));
    }
}

#[cfg(test)]
mod tests {
    use super::deferred_unlinks::CAPACITY;
    use super::*;

    #[test]
    fn fires_each_task_at_its_tick_not_before() {
        let mut wheel = Wheel::new(4, 0);
        let deadlines = [1u64, 2, 3, 5, 9, 17, 33, 64, 100, 1000];
        for d in deadlines {
            wheel.insert(d, d);
        }
        let mut out = Vec::new();
        for now in 0..=1000 {
            out.clear();
            wheel.advance(now, &mut out);
            for d in &out {
                assert_eq!(*d, now, "task fired at the wrong tick");
            }
        }
        assert!(wheel.is_empty());
        assert_eq!(wheel.queued_buckets(), 0);
    }

    #[test]
    fn clamps_huge_expirations_without_overflow() {
        let mut wheel = Wheel::new(20, 0);
        let key = wheel.insert(u64::MAX, ());
        let (level, _, _) = wheel.location(key).unwrap();
        assert_eq!(level + 1, wheel.levels());
        assert!(wheel.levels() <= 15);
        let mut out = Vec::new();
        assert_eq!(wheel.advance(u64::MAX / 2, &mut out), 1);
    }

    #[test]
    fn emptied_buckets_leave_the_front_of_the_queue() {
        let mut wheel = Wheel::new(20, 0);
        let early = wheel.insert(3, 'a');
        let also_early = wheel.insert(3, 'b');
        let middle = wheel.insert(7, 'c');
        wheel.insert(12, 'd');
        assert_eq!(wheel.next_expiration(), Some(3));

        // Emptied by batch cancels (unlinked at once): gone from the front.
        assert_eq!(wheel.cancel_prefetched(early), Some('a'));
        wheel.drop_emptied_front();
        assert_eq!(wheel.next_expiration(), Some(3), "still holds 'b'");
        assert_eq!(wheel.cancel_prefetched(also_early), Some('b'));
        wheel.drop_emptied_front();
        assert_eq!(wheel.next_expiration(), Some(7));

        // Emptied by a reset to later: gone at once.
        assert!(wheel.reset(middle, 15));
        assert_eq!(wheel.next_expiration(), Some(12));

        // Emptied by a single cancel, whose unlink waits: kept until an advance unlinks
        // it, and that advance drops it (no bucket is due at 5).
        let late = wheel.insert(12, 'e');
        let late = wheel.location(late).map(|(.., at)| at);
        assert_eq!(late, Some(12));
        let keys: Vec<_> = (0..2).map(|_| wheel.insert(9, 'f')).collect();
        for key in keys {
            assert_eq!(wheel.cancel(key), Some('f'));
        }
        assert_eq!(
            wheel.next_expiration(),
            Some(9),
            "cancelled entries still linked"
        );
        let mut out = Vec::new();
        assert_eq!(wheel.advance(5, &mut out), 0);
        assert_eq!(wheel.next_expiration(), Some(12));

        // A dropped bucket is queued again by the next entry it takes, which fires.
        wheel.insert(7, 'g');
        assert_eq!(wheel.next_expiration(), Some(7));
        assert_eq!(wheel.advance(7, &mut out), 1);
        assert_eq!(out, vec!['g']);
        out.clear();
        assert_eq!(wheel.advance(15, &mut out), 3);
        out.sort_unstable();
        assert_eq!(out, vec!['c', 'd', 'e']);
        assert_eq!(wheel.queued_buckets(), 0);
    }

    #[test]
    fn due_now_waits_for_the_next_advance() {
        let mut wheel = Wheel::new(20, 10);
        wheel.insert(3, 'a');
        assert_eq!(wheel.next_expiration(), Some(10));
        let mut out = Vec::new();
        assert_eq!(wheel.advance(10, &mut out), 1);
        assert_eq!(out, vec!['a']);
    }

    /// Checks every bucket list (links agree both ways, each entry names its bucket) and
    /// returns how many entries are linked in all.
    fn linked_entries<T>(wheel: &Wheel<T>) -> usize {
        let mut linked = 0;
        for (id, bucket) in wheel.buckets.iter().enumerate() {
            let mut prev = NIL;
            let mut at = bucket.head;
            while at != NIL {
                let entry = &wheel.slab.entries[at as usize];
                assert_eq!(entry.bucket, id as u32, "entry {at} names another bucket");
                assert_eq!(entry.prev, prev, "entry {at} has a wrong back link");
                prev = at;
                at = entry.next;
                linked += 1;
            }
        }
        linked
    }

    #[test]
    fn deferred_unlinks_keep_lists_whole_and_free_every_slot() {
        let mut wheel = Wheel::new(4, 0);
        // 120 tasks over a few buckets of two levels, so lists are long and cancelled
        // entries often sit next to each other.
        let keys: Vec<_> = (0..120u64).map(|i| wheel.insert(1 + i % 7, i)).collect();
        let mut order: Vec<usize> = (0..keys.len()).collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let (cancel, keep) = order.split_at(90);
        for (n, &i) in cancel.iter().enumerate() {
            assert_eq!(wheel.cancel(keys[i]), Some(i as u64));
            assert_eq!(
                wheel.cancel(keys[i]),
                None,
                "a cancelled key is dead at once"
            );
            assert!(!wheel.contains(keys[i]));
            let cancelled = n + 1;
            assert_eq!(wheel.len(), keys.len() - cancelled);
            let waiting = cancelled.min(CAPACITY);
            assert_eq!(linked_entries(&wheel), wheel.len() + waiting);
            assert_eq!(
                wheel.slab.free.len(),
                cancelled - waiting,
                "slots freed so far"
            );
        }
        let mut fired = Vec::new();
        wheel.advance(10, &mut fired);
        fired.sort_unstable();
        let mut expected: Vec<u64> = keep.iter().map(|&i| i as u64).collect();
        expected.sort_unstable();
        assert_eq!(fired, expected, "exactly the tasks not cancelled fire");
        assert!(wheel.is_empty());
        assert_eq!(linked_entries(&wheel), 0);
        assert_eq!(
            wheel.slab.free.len(),
            keys.len(),
            "every slot is free again"
        );
    }

    #[test]
    fn cancel_then_add_reuses_all_but_the_waiting_slots() {
        let mut wheel = Wheel::new(20, 0);
        let keys: Vec<_> = (0..1_000u64).map(|i| wheel.insert(5 + i % 50, i)).collect();
        for key in keys {
            assert!(wheel.cancel(key).is_some());
        }
        for i in 0..1_000u64 {
            wheel.insert(5 + i % 50, 1_000 + i);
        }
        assert_eq!(wheel.len(), 1_000);
        assert_eq!(wheel.slab.entries.len(), 1_000 + CAPACITY);
        // New entries were pushed onto lists whose heads may be waiting cancelled ones.
        assert_eq!(linked_entries(&wheel), 1_000 + CAPACITY);
        let mut fired = Vec::new();
        wheel.advance(60, &mut fired);
        fired.sort_unstable();
        assert_eq!(fired, (1_000..2_000).collect::<Vec<u64>>());
        assert_eq!(wheel.slab.free.len(), 1_000 + CAPACITY);
    }

    #[test]
    fn drain_forgets_waiting_cancelled_entries() {
        let mut wheel = Wheel::new(20, 0);
        let keys: Vec<_> = (0..20u64).map(|i| wheel.insert(3 + i % 4, i)).collect();
        for key in &keys[..5] {
            assert!(wheel.cancel(*key).is_some());
        }
        let mut drained = wheel.drain();
        drained.sort_unstable();
        assert_eq!(drained, (5..20).collect::<Vec<u64>>());
        assert!(wheel.is_empty());
        // The wheel works on: nothing of the waiting entries is left to unlink, and no
        // key from before the drain reaches a task added after it.
        let key = wheel.insert(4, 99);
        assert!(wheel.contains(key));
        for old in &keys {
            assert!(!wheel.contains(*old));
            assert_eq!(wheel.cancel(*old), None);
        }
        let mut fired = Vec::new();
        assert_eq!(wheel.advance(10, &mut fired), 1);
        assert_eq!(fired, vec![99]);
        assert!(wheel.is_empty());
    }

    #[test]
    fn cancelled_task_never_fires_and_bucket_drains() {
        let mut wheel = Wheel::new(20, 0);
        let a = wheel.insert(5, 'a');
        let b = wheel.insert(5, 'b');
        assert_eq!(wheel.cancel(a), Some('a'));
        assert_eq!(wheel.cancel(a), None);
        let mut out = Vec::new();
        wheel.advance(5, &mut out);
        assert_eq!(out, vec!['b']);
        assert_eq!(wheel.cancel(b), None);
    }
}
