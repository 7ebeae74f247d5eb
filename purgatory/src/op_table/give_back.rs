//! Giving memory back: the op table's segments that a drained burst left unused go back
//! between the reaper's rounds, one bounded step at a time (the slot table itself is
//! `op_table.rs`'s).
//!
//! # Steps
//! [`OpTable::give_back_step`] takes one step of what is below and says whether it took
//! one; the reaper's housekeeping (`housekeeping.rs`) calls it again while it does and no
//! timer bucket is due, so a timeout waits for one step at most. No step's work grows with
//! the burst or the table. Times per step while a forced burst of 2,000,000 went back
//! (release build, this shared 2-core machine, three runs of
//! `purgatory/tests/housekeeping_lateness.rs` with the steps timed; the longest, up to a
//! few milliseconds, were the machine's: the thread was descheduled mid-step):
//!
//! | step | its work, at most | median | 90th percentile |
//! |---|---|---|---|
//! | look | a few loads (the free lists' counts), no lock; when it starts setting aside, the room for the segment's slots allocated | 1.9 us | 19 us |
//! | sweep | [`SWEEP_STEP`] entries of one free list under its lock, then those of the segment appended to `aside` | 22 us | 108 us |
//! | unlink | a few stores under `growth` and `aside`'s lock; `aside`'s room handed over to be freed | 5.9 us | 70 us |
//! | scan | [`SCAN_STEP`] slots' generations of a segment unlinked (of its slots ever filled, `Segment::reach`), under `growth` | 124 us | 188 us |
//! | free | the segments whose grace passed handed to the thread that drops things (`discard.rs`: their drop and unmapping took up to 47 ms on the reaper); that thread started, once a process | 3.0 us | 94 us |
//! | shrink | one free list of at most [`SHRINK_COPY_UP_TO`] entries copied to a buffer twice its length, the old one handed over to be freed | 0.2 us | 0.4 us |
//! | stop setting aside | each free list's lock taken once, then `aside`'s slots moved to one list | - | - |
//!
//! The timer's slabs give back in steps too (`TimerCore::give_back_elsewhere`, 32,768
//! entry slots a step, 279 us median, 416 us at the 90th percentile), the memory of a
//! slab handed to the same thread when its give-back ends. Steps that allocate or free a
//! large block (starting to set aside, shrinking) wait while that thread is at it: a
//! change to the process's mappings would wait for its unmapping (and on this virtual
//! machine an unmapping on the reaper itself, a slab shrunk in place, took up to 18 ms
//! when a TLB flush had to reach the other, idle, CPU).
//!
//! # The top segment
//! Only the top segment is a candidate, never the first, and only while what is in use
//! is at most half the slots below it (so a steady load never gives back a segment it
//! grows into again).
//!
//! | phase | what holds | a step | next |
//! |---|---|---|---|
//! | idle (`aside.from` is `u32::MAX`) | a slot freed goes back to a free list; `aside` is empty | the look: is the top segment a candidate | sweeping, if it is |
//! | sweeping list `i` from entry `at` | `aside.from` is the top segment's first slot, so a slot of it freed goes aside; the lists before `i`, and list `i` below `at`, name no slot of it | a sweep: the slots of the top segment among the next entries of list `i` go aside | sweeping on; emptying after the last list |
//! | emptying | no free list names a slot of the top segment: each free one is in `aside` | a look that compares `aside`'s length with the slots of the segment handed out; equal, every one is free, and the step unlinks the segment | idle (then the next segment down) |
//!
//! A step that finds, while sweeping or emptying, that the top segment is no longer a
//! candidate (what is in use grew, or a new segment was made) stops setting aside: the
//! slots set aside go back to a free list (idle). While a segment is emptied and in use,
//! the reaper, when it has nothing else to do, looks again after 200 ms, then 400 ms, up
//! to 1.6 s ([`look_again_within`](OpTable::look_again_within)): a segment whose last
//! slot in use is freed by an event, with nothing else to wake the reaper, goes back
//! within that.
//!
//! # A segment unlinked
//! | state | what reaches it | a step | next |
//! |---|---|---|---|
//! | scanning | pins taken before the unlink | a scan of its slots' generations, for `floors[k]` | waiting; kept, if aged |
//! | waiting for its grace | pins taken before the unlink | reads each stripe's pins not yet seen at 0 (`pins.rs`) | freed, once all were |
//! | kept (aged) | nobody | - | - |
//! | freed | nobody: handed to the thread that drops things | - | - |
//!
//! In every state but freed, new slots that reach segment `k` link it again as it is
//! ([`relink`](OpTable::relink), in [`new_slots`](OpTable::new_slots), under `growth`);
//! a segment never made, or freed, is made anew with its slots starting at `floors[k]`.
//!
//! # Invariants
//! - A segment is unlinked only while every one of its slots handed out is in `aside`
//!   (checked under `aside`'s lock and `growth`, which new slots take), so none is in
//!   use: a held slot, a slot just allocated or taken and not yet vacated, a retired
//!   slot, keeps its segment. So a thread that holds a slot or has just been handed one
//!   reaches it without a pin; every look-up by a name that may be stale (a list entry,
//!   a timer entry, a handle) is made under a pin ([`OpTable::pin`]; the methods that
//!   take a name take the pin, and what they return borrows it).
//! - Setting aside: while `aside.from` is a segment's first slot, a slot of it freed goes
//!   to `aside`, not to a free list, and allocation takes from `aside` only once every
//!   free list is empty, so a steady load that came after a burst moves to the slots
//!   below and the segment empties. [`vacate`](OpTable::vacate) reads `aside.from` under
//!   its free list's lock and puts slots aside before releasing it. So once the give-back
//!   has stored `aside.from` and then taken a list's lock, every later vacate into that
//!   list sees the new value: the sweep, which starts after the store, leaves no slot of
//!   the segment in a list it has passed, and stopping (`aside.from` back to `u32::MAX`,
//!   then each list's lock taken once) finds in `aside` every slot a vacate that read the
//!   old value put there. So `aside` holds slots of the segment at `aside.from` only, and
//!   its length counts them (a slot of another segment counted there could let a segment
//!   go with a slot in use).
//! - `floors[k]` is at least the highest generation a slot of segment `k` had (its next
//!   occupant's) when it was given back, read once the segment is unlinked (its slots
//!   are then all free and none can be handed out: each word is stable, a stale name's
//!   compare fails and writes nothing). A name of a slot is below its slot's
//!   generation, so no name of the segment given back matches a slot made again. A
//!   segment is freed only once that scan is done. One whose highest generation is
//!   above [`MAX_FLOOR`] (`RETIRED / 2`) is kept instead: made again, all its slots would
//!   start there.
//! - A pin held long (a callback that blocks under a check's or a batch expiry's pin)
//!   delays the free of what is given back meanwhile, not its reuse: a segment waiting
//!   for its grace is linked again, slots and generations as they were, when new slots
//!   reach it, so a long pin keeps at most one burst's segments, however many bursts
//!   come and go under it. A thread pinned since before the unlink finds the same live
//!   segment, as before the unlink.
//! - A segment handed to the thread that drops things is unreachable: its grace passed.
//!   Its slots are vacant (no operation, no span, no timer handle): dropping them runs no
//!   user code.
//! - The free lists' indices are all below `high_water`, and every slot below it exists.
//! - Lock order: `growth`, then one free list, then `aside`; a sweep releases the list
//!   before it takes `aside`, a vacate takes `aside` under its list's lock.

use std::sync::atomic::{AtomicBool, AtomicU32 as StdAtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use super::{locate, FreeList, OpTable, Segment, FIRST_SEGMENT, FREE_LISTS, RETIRED, SEGMENTS};
use crate::discard;
use crate::operation::DelayedOperation;
use crate::pins::Grace;
use crate::sync::{AtomicU32, Mutex, MutexGuard};

/// Free-list entries one sweep step looks at (one list's lock held meanwhile).
const SWEEP_STEP: usize = if cfg!(loom) { 4 } else { 1 << 14 };

/// Slots whose generations one scan step reads (`growth` held meanwhile).
const SCAN_STEP: usize = if cfg!(loom) { 8 } else { 1 << 14 };

/// Longest free list a shrink step copies into a smaller buffer (64 KiB); a longer one
/// keeps its room (at most four times its length, `shrink`).
const SHRINK_COPY_UP_TO: usize = 1 << 14;

/// The reaper's wait, when it has nothing else to do, while the give-back has something
/// pending (a segment waiting for its grace; a top segment to empty, the first time).
const LOOK_AGAIN: Duration = Duration::from_millis(200);

/// How many times the wait doubles, up to 1.6 s, while the top segment stays in use.
const DOUBLINGS: u32 = 3;

/// The highest generation a segment given back may have: one whose slots went further
/// is kept, since made again all its slots would start there (`floors`), and a few
/// cycles of one hot slot would retire the whole segment. At most this, a segment made
/// again still has 2^31 operations per slot ahead.
const MAX_FLOOR: u32 = RETIRED / 2;

/// Who takes a step: the reaper, between rounds, takes none that may change the process's
/// mappings (allocate or free a large block) while the thread that unmaps is at it (such a
/// change waits for it, `discard.rs`); another caller (`Purgatory::purge`, tests) may
/// wait.
#[derive(Clone, Copy)]
enum Caller {
    Reaper,
    Other,
}

impl Caller {
    fn waits_for_unmapping(self) -> bool {
        matches!(self, Caller::Reaper) && discard::busy()
    }
}

/// Moves `free` to a buffer twice its length if it has more than four times its length
/// room and is at most [`SHRINK_COPY_UP_TO`] long; returns the old buffer, to be freed
/// (elsewhere: its unmapping would hold the reaper).
fn shrink(free: &mut Vec<u32>) -> Option<Vec<u32>> {
    let len = free.len();
    if free.capacity() <= 4 * len + 64 || len > SHRINK_COPY_UP_TO {
        return None;
    }
    let mut smaller = Vec::with_capacity(2 * len);
    smaller.extend_from_slice(free);
    Some(std::mem::replace(free, smaller))
}

/// Frees what the give-back no longer needs on the thread that drops things
/// (`discard.rs`), so that no unmapping holds the reaper (under loom, in place: there is
/// no such thread).
fn free_off_the_reaper<T: Send + 'static>(garbage: T) {
    #[cfg(not(loom))]
    discard::discard(garbage);
    #[cfg(loom)]
    drop(garbage);
}

/// The first slot index of segment `k`.
fn segment_start(k: usize) -> u32 {
    (FIRST_SEGMENT as u64 * ((1u64 << k) - 1)) as u32
}

/// The cold state of making and giving back segments.
pub(super) struct Growth<O> {
    /// Per segment, the generation its slots start with when it is made (again): at
    /// least the highest next generation its slots had when it was given back, so that
    /// no name of its earlier slots matches a later one.
    pub(super) floors: [u32; SEGMENTS],
    /// Segments unlinked and not freed yet.
    unlinked: Vec<Unlinked<O>>,
    /// Segments unlinked and found aged: never freed, linked again when new slots reach
    /// them. (Boxed: a segment never moves, see [`Segments`].)
    kept: Segments<O>,
    /// Where the top segment is (module doc, "The top segment").
    phase: Phase,
    /// The next free list to shrink after an unlink; `FREE_LISTS` when none is left.
    shrink_next: usize,
    /// Where a sweep step gathers the slots it moves aside (kept: one allocation).
    moved: Vec<u32>,
    /// Under loom: segments "freed", kept so that a late look-up is reported, not run.
    #[cfg(loom)]
    dead: Segments<O>,
}

impl<O> Growth<O> {
    pub(super) fn new() -> Self {
        Growth {
            floors: [1; SEGMENTS],
            unlinked: Vec::new(),
            kept: Vec::new(),
            phase: Phase::Idle,
            shrink_next: FREE_LISTS,
            moved: Vec::new(),
            #[cfg(loom)]
            dead: Vec::new(),
        }
    }

    /// Whether the next step has work without looking at the top segment: a sweep, or
    /// lists to shrink.
    fn busy(&self) -> bool {
        matches!(self.phase, Phase::Sweeping { .. }) || self.shrink_next < FREE_LISTS
    }
}

/// Segments out of the table, each in the box it was linked from: a segment never moves,
/// since a thread pinned before its unlink may still read it through that pointer.
#[allow(clippy::vec_box)]
type Segments<O> = Vec<Box<Segment<O>>>;

/// A segment unlinked (module doc, "A segment unlinked").
struct Unlinked<O> {
    segment: Box<Segment<O>>,
    k: usize,
    /// Its slots whose generations were read, from the first.
    scanned: usize,
    /// The highest generation among them.
    highest: u32,
    grace: Grace,
}

/// Where the top segment is (module doc, "The top segment").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Sweeping { start: u32, list: usize, at: usize },
    Emptying { start: u32 },
}

/// The free slots of the segment being emptied (module doc, "Setting aside").
pub(super) struct Aside {
    /// That segment's first slot; `u32::MAX` while none is. Written under `growth`; read
    /// by a vacate under its free list's lock.
    from: AtomicU32,
    slots: Mutex<Vec<u32>>,
    /// `slots.len()` as of its last change, for estimates without the lock.
    len: AtomicUsize,
}

impl Default for Aside {
    fn default() -> Self {
        Aside {
            from: AtomicU32::new(u32::MAX),
            slots: Mutex::new(Vec::new()),
            len: AtomicUsize::new(0),
        }
    }
}

impl Aside {
    /// The first slot of the segment being emptied, or `u32::MAX`; read it under the
    /// free list's lock a vacate puts slots in.
    #[inline]
    pub(super) fn from(&self) -> u32 {
        self.from.load(Ordering::Relaxed)
    }

    /// Hands out up to `n` slots set aside (appended to `out`); returns how many.
    #[inline]
    pub(super) fn take(&self, n: usize, out: &mut impl Extend<u32>) -> usize {
        if self.len.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut slots = self.slots.lock();
        let take = n.min(slots.len());
        let from = slots.len() - take;
        out.extend(slots.drain(from..));
        self.len.store(slots.len(), Ordering::Relaxed);
        take
    }

    /// Hands out one slot set aside, if any.
    #[inline]
    pub(super) fn take_one(&self) -> Option<u32> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut slots = self.slots.lock();
        let index = slots.pop();
        self.len.store(slots.len(), Ordering::Relaxed);
        index
    }
}

/// What the give-back's steps left pending, readable without `growth` (so that a round
/// with nothing to give back costs a few loads).
#[derive(Default)]
pub(super) struct Pending {
    /// Segments unlinked and not freed yet (`growth.unlinked` is not empty).
    has_unlinked: AtomicBool,
    /// `growth.busy()`.
    busy: AtomicBool,
    /// Looks in a row that found the top segment, being emptied, still in use: the
    /// reaper's wait doubles with each, up to [`DOUBLINGS`] times.
    looks: StdAtomicU32,
}

impl<O: DelayedOperation> OpTable<O> {
    /// Segment `k` if it was given back and is not freed yet, or kept: taken out of
    /// `growth` to be linked again as it is. Under `growth`.
    ///
    /// Every slot of it is free (it was given back only so), in no free list and in no
    /// thread's hands, so its words hold each slot's next generation, above every name
    /// it was ever given, and its tags match them (set before each slot was freed): it
    /// is exactly what `Segment::new` would make, except that each slot starts at its
    /// own generation rather than at the segment's highest. A thread still pinned since
    /// before the unlink reads the same live segment as before, now linked again: its
    /// stale names find other generations, as on any reused slot. So memory pinned by a
    /// long pin is reused, not doubled, by the next burst.
    pub(super) fn relink(&self, growth: &mut Growth<O>, k: usize) -> Option<Box<Segment<O>>> {
        if let Some(at) = growth.unlinked.iter().position(|u| u.k == k) {
            let unlinked = growth.unlinked.swap_remove(at);
            self.giving_back
                .has_unlinked
                .store(!growth.unlinked.is_empty(), Ordering::Release);
            return Some(unlinked.segment);
        }
        let at = growth
            .kept
            .iter()
            .position(|segment| segment.slots.len() == FIRST_SEGMENT << k)?;
        Some(growth.kept.swap_remove(at))
    }

    /// The rest of [`vacate`](Self::vacate) while a segment is being emptied, under
    /// `list`'s lock (`free`), `aside_from` read under it: its slots go aside (under the
    /// list's lock still, see "Setting aside"), the others to the list. Out of line: only
    /// while a segment is being emptied.
    #[cold]
    #[inline(never)]
    pub(super) fn vacate_setting_aside(
        &self,
        list: &FreeList,
        mut free: MutexGuard<'_, Vec<u32>>,
        indices: impl Iterator<Item = u32> + Clone,
        aside_from: u32,
    ) {
        free.extend(indices.clone().filter(|&index| index < aside_from));
        list.publish(free.len(), &self.free_mask);
        if indices.clone().any(|index| index >= aside_from) {
            let mut aside = self.aside.slots.lock();
            aside.extend(indices.filter(|&index| index >= aside_from));
            self.aside.len.store(aside.len(), Ordering::Relaxed);
        }
        drop(free);
    }

    /// Gives back now whatever can go (every step of the module doc, until none is left):
    /// for `Purgatory::purge` and tests. Returns how many slots it unlinked.
    pub(crate) fn give_back(&self) -> usize {
        let mut unlinked = 0;
        while let Some(slots) = self.step(Caller::Other) {
            unlinked += slots;
        }
        unlinked
    }

    /// One step of giving back (module doc): `Some` with the slots it unlinked (often 0)
    /// if it did anything, `None` if nothing can be done now. For the reaper's
    /// housekeeping between rounds and `Purgatory::purge`: never on a request's path, and
    /// with no pin of this thread held (one only delays the free). When there is nothing
    /// to give back, a few loads and no lock.
    pub(crate) fn give_back_step(&self) -> Option<usize> {
        self.step(Caller::Reaper)
    }

    /// [`give_back_step`](Self::give_back_step), for `caller`.
    fn step(&self, caller: Caller) -> Option<usize> {
        if self.nothing_to_do() {
            return None;
        }
        let mut growth = self.growth.lock();
        // Freeing comes last: each look reads every stripe's pins still to be seen clear.
        let done = if self.scan_step(&mut growth) || self.shrink_step(&mut growth, caller) {
            Some(0)
        } else if let Some(unlinked) = self.top_step(&mut growth, caller) {
            Some(unlinked)
        } else if let Some(freed) = self.take_freeable(&mut growth) {
            self.free_elsewhere(&mut growth, freed);
            Some(0)
        } else {
            None
        };
        self.giving_back
            .busy
            .store(growth.busy(), Ordering::Relaxed);
        done
    }

    /// Whether [`give_back_step`](Self::give_back_step) would find nothing to do, by
    /// what it can read without `growth`: no segment unlinked, no sweep or shrink under
    /// way, and either no top segment being emptied and none that is a candidate, or
    /// the one being emptied still the candidate and in use. Counts the looks of the
    /// last kind (the reaper's wait doubles with them).
    fn nothing_to_do(&self) -> bool {
        let pending = &self.giving_back;
        if pending.has_unlinked.load(Ordering::Acquire) || pending.busy.load(Ordering::Relaxed) {
            return false;
        }
        let from = self.aside.from();
        let candidate = self.candidate();
        if from == u32::MAX {
            return candidate.is_none();
        }
        let high = self.high_water.load(Ordering::Relaxed);
        let in_use = candidate == Some(from)
            && self.aside.len.load(Ordering::Relaxed) != high.saturating_sub(from) as usize;
        if in_use {
            let looks = pending.looks.load(Ordering::Relaxed);
            if looks < DOUBLINGS {
                pending.looks.store(looks + 1, Ordering::Relaxed);
            }
        }
        in_use
    }

    /// How long the reaper may wait, when it has nothing else to do, before the
    /// give-back wants another step: `None` when nothing is pending. While the top
    /// segment being emptied stays in use, the wait doubles from [`LOOK_AGAIN`] at each
    /// look that finds it so, up to 1.6 s; a memory burst drained by its timeouts (so with
    /// no other call to wake the reaper) goes back within that.
    pub(crate) fn look_again_within(&self) -> Option<Duration> {
        let pending = &self.giving_back;
        if pending.has_unlinked.load(Ordering::Relaxed) || pending.busy.load(Ordering::Relaxed) {
            return Some(LOOK_AGAIN);
        }
        if self.aside.from() != u32::MAX {
            let looks = pending.looks.load(Ordering::Relaxed).min(DOUBLINGS);
            return Some(LOOK_AGAIN * (1 << looks));
        }
        self.candidate().map(|_| LOOK_AGAIN)
    }

    /// The first slot of the top segment if it is a candidate to give back, by the
    /// estimate of the free lists' lengths: it is not the first, and what is in use is at
    /// most half the slots below it (so a steady load never gives back a segment it grows
    /// into again).
    fn candidate(&self) -> Option<u32> {
        let high = self.high_water.load(Ordering::Relaxed);
        if high as usize <= FIRST_SEGMENT {
            return None;
        }
        let free: usize = self
            .free
            .iter()
            .map(|l| l.available.load(Ordering::Relaxed))
            .sum::<usize>()
            + self.aside.len.load(Ordering::Relaxed);
        let in_use = (high as usize).saturating_sub(free);
        let (k, _) = locate(high - 1);
        let start = segment_start(k);
        (k > 0 && in_use * 2 <= start as usize).then_some(start)
    }

    /// The step on the top segment (module doc, "The top segment"). Under `growth`.
    fn top_step(&self, growth: &mut Growth<O>, caller: Caller) -> Option<usize> {
        let candidate = self.candidate();
        match growth.phase {
            Phase::Idle => {
                let start = candidate?;
                if caller.waits_for_unmapping() {
                    // Room for the slots set aside is allocated now (below), which waits
                    // for an unmapping under way.
                    return None;
                }
                let high = self.high_water.load(Ordering::Relaxed);
                let mut aside = self.aside.slots.lock();
                if cfg!(any(loom, debug_assertions)) {
                    // What is set aside is counted as the segment's: nothing else may be.
                    assert!(aside.is_empty(), "slots left aside: {:?}", &*aside);
                }
                let room = (high - start) as usize;
                let len = aside.len();
                aside.reserve(room.saturating_sub(len));
                drop(aside);
                self.aside.from.store(start, Ordering::Relaxed);
                growth.phase = Phase::Sweeping {
                    start,
                    list: 0,
                    at: 0,
                };
                Some(0)
            }
            Phase::Sweeping { start, .. } | Phase::Emptying { start }
                if candidate != Some(start) =>
            {
                self.stop_setting_aside(growth);
                Some(0)
            }
            Phase::Sweeping { start, list, at } => {
                self.sweep(growth, start, list, at);
                Some(0)
            }
            Phase::Emptying { start } => self.unlink_if_free(growth, start),
        }
    }

    /// One sweep step: the slots of the segment from `start` among the next
    /// [`SWEEP_STEP`] entries of free list `list` from `at` go aside. Under `growth`.
    fn sweep(&self, growth: &mut Growth<O>, start: u32, list: usize, at: usize) {
        let mut moved = std::mem::take(&mut growth.moved);
        let free_list = &self.free[list];
        let mut free = free_list.indices.lock();
        let mut i = at;
        let mut seen = 0;
        while i < free.len() && seen < SWEEP_STEP {
            seen += 1;
            if free[i] >= start {
                // The last entry comes here, and is looked at next.
                moved.push(free.swap_remove(i));
            } else {
                i += 1;
            }
        }
        let list_done = i >= free.len();
        free_list.publish(free.len(), &self.free_mask);
        drop(free);
        if !moved.is_empty() {
            let mut aside = self.aside.slots.lock();
            aside.extend_from_slice(&moved);
            self.aside.len.store(aside.len(), Ordering::Relaxed);
            moved.clear();
        }
        growth.moved = moved;
        growth.phase = if !list_done {
            Phase::Sweeping { start, list, at: i }
        } else if list + 1 < FREE_LISTS {
            Phase::Sweeping {
                start,
                list: list + 1,
                at: 0,
            }
        } else {
            Phase::Emptying { start }
        };
    }

    /// Unlinks the segment from `start` if every one of its slots handed out is set
    /// aside (so free); `None` if one is in use. Under `growth`.
    fn unlink_if_free(&self, growth: &mut Growth<O>, start: u32) -> Option<usize> {
        // Exact: new slots are handed out under `growth`, slots set aside under this lock.
        let high = self.high_water.load(Ordering::Relaxed);
        let mut aside = self.aside.slots.lock();
        if aside.len() != (high - start) as usize {
            return None;
        }
        // No free list names a slot of the segment (the sweep), `aside` is emptied now,
        // and new slots start below it: nobody can be handed one of its slots. (The next
        // segment down, if it is a candidate, gets room of its own, half as large.)
        let room = std::mem::take(&mut *aside);
        self.aside.len.store(0, Ordering::Relaxed);
        self.aside.from.store(u32::MAX, Ordering::Relaxed);
        self.high_water.store(start, Ordering::Relaxed);
        drop(aside);
        free_off_the_reaper(room);
        let (k, _) = locate(start);
        let segment = self.segments[k].swap(std::ptr::null_mut(), Ordering::AcqRel);
        // SAFETY: segment `k` existed (it holds slot `high - 1`), made by
        // `Box::into_raw`; unlinked now, it is freed only after its grace.
        let segment = unsafe { Box::from_raw(segment) };
        segment.reached(high);
        growth.unlinked.push(Unlinked {
            segment,
            k,
            scanned: 0,
            highest: 0,
            grace: Grace::default(),
        });
        self.giving_back.has_unlinked.store(true, Ordering::Release);
        self.giving_back.looks.store(0, Ordering::Relaxed);
        growth.phase = Phase::Idle;
        growth.shrink_next = 0;
        Some(FIRST_SEGMENT << k)
    }

    /// Puts the slots set aside back in a free list (module doc, "Setting aside").
    /// Under `growth`.
    fn stop_setting_aside(&self, growth: &mut Growth<O>) {
        self.aside.from.store(u32::MAX, Ordering::Relaxed);
        // A vacate that read the old value did so under its list's lock, and put its
        // slots aside before releasing it.
        for list in &self.free {
            drop(list.indices.lock());
        }
        let mut aside = std::mem::take(&mut *self.aside.slots.lock());
        self.aside.len.store(0, Ordering::Relaxed);
        if !aside.is_empty() {
            let list = self.own_free_list();
            let mut free = list.indices.lock();
            if free.len() < aside.len() {
                std::mem::swap(&mut *free, &mut aside);
            }
            free.extend_from_slice(&aside);
            list.publish(free.len(), &self.free_mask);
        }
        self.giving_back.looks.store(0, Ordering::Relaxed);
        growth.phase = Phase::Idle;
    }

    /// One scan step on the first segment unlinked not scanned yet, if any (module doc,
    /// "A segment unlinked"). Under `growth`.
    fn scan_step(&self, growth: &mut Growth<O>) -> bool {
        let Some(at) = growth
            .unlinked
            .iter()
            .position(|u| u.scanned < u.segment.reach())
        else {
            return false;
        };
        let unlinked = &mut growth.unlinked[at];
        // The slots past its reach were never filled: generation 0, below every floor.
        let end = (unlinked.scanned + SCAN_STEP).min(unlinked.segment.reach());
        unlinked.highest = unlinked.segment.slots[unlinked.scanned..end]
            .iter()
            .map(|s| s.slot.generation())
            .fold(unlinked.highest, u32::max);
        unlinked.scanned = end;
        if end == unlinked.segment.reach() {
            let (k, highest) = (unlinked.k, unlinked.highest);
            if highest > MAX_FLOOR {
                // Made again, every slot of it would start there: one hot slot would age
                // the whole segment. It is kept, to be linked again as it is.
                let aged = growth.unlinked.swap_remove(at);
                growth.kept.push(aged.segment);
                self.giving_back
                    .has_unlinked
                    .store(!growth.unlinked.is_empty(), Ordering::Release);
            } else {
                growth.floors[k] = growth.floors[k].max(highest);
            }
        }
        true
    }

    /// The segments unlinked whose scan is done and whose grace has passed (`pins.rs`),
    /// taken out of `growth`; `None` if there are none. Under `growth`.
    fn take_freeable(&self, growth: &mut Growth<O>) -> Option<Segments<O>> {
        let mut freed = Vec::new();
        let mut i = 0;
        while i < growth.unlinked.len() {
            let unlinked = &mut growth.unlinked[i];
            if unlinked.scanned == unlinked.segment.reach() && unlinked.grace.passed(&self.pins) {
                freed.push(growth.unlinked.swap_remove(i).segment);
            } else {
                i += 1;
            }
        }
        self.giving_back
            .has_unlinked
            .store(!growth.unlinked.is_empty(), Ordering::Release);
        (!freed.is_empty()).then_some(freed)
    }

    /// Hands `segments` (nobody can reach them: their grace passed) to the thread that
    /// drops things (`discard.rs`; in place if it cannot start), so that the reaper goes
    /// on while they are dropped and unmapped. Their slots are vacant: nothing of the
    /// caller's runs in their drop.
    #[cfg(not(loom))]
    fn free_elsewhere(&self, _growth: &mut Growth<O>, segments: Segments<O>) {
        free_off_the_reaper(segments);
    }

    /// Under loom, marked freed where they are handed over (a look-up the grace did not
    /// cover is then a data race loom reports, as it would be with the thread that drops
    /// them, which comes after this in every order) and kept until the table's drop, so
    /// that such a look-up reads no freed memory.
    #[cfg(loom)]
    fn free_elsewhere(&self, growth: &mut Growth<O>, segments: Segments<O>) {
        for segment in &segments {
            // SAFETY: loom checks that no look-up reads this concurrently.
            segment.alive.with_mut(|alive| unsafe { *alive = false });
        }
        growth.dead.extend(segments);
    }

    /// One free list's spare capacity after an unlink, if any is left to look at: a list
    /// of at most [`SHRINK_COPY_UP_TO`] entries with more than four times its length of
    /// room moves to a buffer twice its length, and the old one goes to the thread that
    /// drops things. Waits (`false`) while that thread is at it: the new buffer may need
    /// a mapping. Under `growth`.
    fn shrink_step(&self, growth: &mut Growth<O>, caller: Caller) -> bool {
        let i = growth.shrink_next;
        if i >= FREE_LISTS || caller.waits_for_unmapping() {
            return false;
        }
        growth.shrink_next += 1;
        let old = shrink(&mut self.free[i].indices.lock());
        if let Some(old) = old {
            free_off_the_reaper(old);
        }
        true
    }

    /// Slots that exist (in segments made and not given back), for tests and the loom
    /// models.
    #[cfg(any(test, loom))]
    pub(crate) fn capacity(&self) -> usize {
        let high = self.high_water.load(Ordering::Relaxed);
        if high == 0 {
            return FIRST_SEGMENT;
        }
        let (k, _) = locate(high - 1);
        (segment_start(k) as usize) + (FIRST_SEGMENT << k)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::super::tests::{check_free_mask, fill, Named};
    use super::super::OpRef;
    use super::*;
    use crate::operation::Completion;
    use crate::span::CarriedSpan;

    /// After a burst is taken, the segments above the first are given back, and every
    /// name of the burst (stale now) finds nothing, before and after the segments are
    /// made again for a second burst (whose slots start above every old generation).
    #[test]
    fn a_drained_bursts_segments_are_given_back_and_its_names_match_nothing() {
        let table = OpTable::new();
        let burst = fill(&table, FIRST_SEGMENT * 7);
        assert_eq!(table.capacity(), FIRST_SEGMENT * 7);
        assert_eq!(table.give_back(), 0, "nothing while all are in use");
        {
            let pin = table.pin();
            for op in &burst {
                assert!(table.take(&pin, *op).is_some());
            }
        }
        assert_eq!(table.give_back(), FIRST_SEGMENT * 6);
        assert_eq!(table.capacity(), FIRST_SEGMENT);
        assert!(
            !table.giving_back.has_unlinked.load(Ordering::Relaxed),
            "freed: no pin was held"
        );
        let check_stale = |table: &OpTable<Named>| {
            let pin = table.pin();
            for op in &burst {
                assert!(!table.is_waiting(&pin, *op));
                assert!(!table.is_waiting_by_tag(&pin, *op));
                assert!(table.lock(&pin, *op).is_none());
                assert!(table
                    .take_for_expiry(&pin, *op, Completion::Expired)
                    .is_none());
            }
        };
        check_stale(&table);
        // A second burst makes the segments again: no old name matches a new occupant.
        let second = fill(&table, FIRST_SEGMENT * 7);
        check_stale(&table);
        let pin = table.pin();
        for op in &second {
            assert!(table.is_waiting(&pin, *op));
        }
        for (old, new) in burst.iter().zip(&second) {
            if old.index == new.index {
                assert!(new.generation > old.generation, "{old:?} then {new:?}");
            }
        }
    }

    /// What is in use keeps twice its number of slots: taking half of a full table
    /// gives nothing back, and a steady load at that level neither shrinks nor grows it.
    #[test]
    fn a_steady_load_keeps_its_segments() {
        let table = OpTable::new();
        let all = fill(&table, FIRST_SEGMENT * 7);
        let pin = table.pin();
        // The upper half is taken, the lower half still waits.
        for op in &all[FIRST_SEGMENT * 7 / 2..] {
            assert!(table.take(&pin, *op).is_some());
        }
        drop(pin);
        for _ in 0..1000 {
            assert_eq!(table.give_back(), 0);
            let again = fill(&table, 16);
            let pin = table.pin();
            for op in again {
                assert!(table.take(&pin, op).is_some());
            }
        }
        assert_eq!(table.capacity(), FIRST_SEGMENT * 7);
    }

    /// A burst taken in the order it came (its highest slots freed last, so on top of
    /// the free list), then a steady load of 100 in flight: the top segment's slots are
    /// set aside as they are freed, the load moves to the slots below, and the segments
    /// above the first go back one after the other.
    #[test]
    fn a_steady_load_after_a_burst_moves_down_and_lets_the_top_segments_go() {
        let table = OpTable::new();
        let burst = fill(&table, FIRST_SEGMENT * 7);
        {
            let pin = table.pin();
            for op in &burst {
                assert!(table.take(&pin, *op).is_some());
            }
        }
        let mut live = std::collections::VecDeque::new();
        for i in 0..20_000 {
            let locked = table.insert_one(Named("steady"), CarriedSpan::default());
            live.push_back(locked.op());
            assert!(locked.unlock().is_ok());
            if live.len() > 100 {
                let op = live.pop_front().expect("in flight");
                assert!(table.take(&table.pin(), op).is_some());
            }
            if i % 100 == 0 {
                table.give_back();
            }
        }
        assert_eq!(
            table.capacity(),
            FIRST_SEGMENT,
            "kept the first segment only"
        );
        let pin = table.pin();
        for op in live {
            assert!(table.is_waiting(&pin, op));
        }
        for op in &burst {
            assert!(!table.is_waiting(&pin, *op));
        }
    }

    /// A segment given back while a thread is pinned is freed only after that pin is
    /// dropped (the slot behind a stale name stays readable meanwhile).
    #[test]
    fn a_segment_given_back_is_freed_only_after_the_pins_before_it() {
        let table = OpTable::new();
        let burst = fill(&table, FIRST_SEGMENT * 3);
        {
            let pin = table.pin();
            for op in &burst {
                assert!(table.take(&pin, *op).is_some());
            }
        }
        let pin = table.pin();
        let stale = burst[FIRST_SEGMENT * 2];
        let found = table.find(&pin, stale);
        assert_eq!(table.give_back(), FIRST_SEGMENT * 2);
        assert!(
            table.giving_back.has_unlinked.load(Ordering::Relaxed),
            "not freed while a pin of before is held"
        );
        assert_eq!(table.look_again_within(), Some(LOOK_AGAIN));
        // Still readable through what was found before: the generation moved on.
        assert!(!found.may_be_waiting() || !table.is_waiting(&pin, stale));
        assert!(table.lock_found(found).is_none());
        drop(pin);
        assert_eq!(table.give_back(), 0);
        assert!(
            !table.giving_back.has_unlinked.load(Ordering::Relaxed),
            "freed once the pin is dropped"
        );
    }

    /// While one pin lives (a callback blocked under a check's or a batch expiry's pin),
    /// the segments a burst gives back cannot be freed; the next burst links them again
    /// instead of making new ones, so what waits for the pin stays within one burst's
    /// peak, cycle after cycle, and no name of an earlier burst matches a later one.
    #[test]
    fn a_long_pin_keeps_burst_cycles_within_one_peak() {
        let table = OpTable::new();
        let peak = FIRST_SEGMENT * 15;
        std::thread::scope(|s| {
            // Made in here: a failed assertion drops `release` before the scope waits
            // for the pinned thread, which then ends.
            let (release, held) = std::sync::mpsc::channel::<()>();
            let (pinned, ready) = std::sync::mpsc::channel::<()>();
            let t = &table;
            s.spawn(move || {
                let _pin = t.pin();
                pinned.send(()).unwrap();
                held.recv().unwrap();
            });
            ready.recv().unwrap();
            let mut earlier: Vec<OpRef> = Vec::new();
            for cycle in 0..20 {
                let ops = fill(&table, peak);
                let pin = table.pin();
                for op in &earlier {
                    assert!(
                        !table.is_waiting(&pin, *op),
                        "cycle {cycle}: {op:?} matched"
                    );
                    assert!(table.lock(&pin, *op).is_none());
                }
                for op in &ops {
                    assert!(table.take(&pin, *op).is_some());
                }
                drop(pin);
                assert_eq!(table.give_back(), peak - FIRST_SEGMENT, "cycle {cycle}");
                let growth = table.growth.lock();
                let waiting: usize = growth.unlinked.iter().map(|u| u.segment.slots.len()).sum();
                assert!(
                    waiting <= peak,
                    "cycle {cycle}: {waiting} slots wait for the pin, the peak is {peak}"
                );
                drop(growth);
                earlier = ops;
            }
            release.send(()).unwrap();
        });
        assert_eq!(table.give_back(), 0);
        assert!(
            !table.giving_back.has_unlinked.load(Ordering::Relaxed),
            "freed once the pin is dropped"
        );
    }

    /// A slot near `RETIRED` keeps its segment: given back, the segment would be made
    /// again with every slot at that generation, and a few cycles would retire it all.
    #[test]
    fn one_hot_slot_does_not_age_its_whole_segment() {
        let table = OpTable::new();
        let burst = fill(&table, FIRST_SEGMENT * 3);
        {
            let pin = table.pin();
            for op in &burst {
                assert!(table.take(&pin, *op).is_some());
            }
        }
        let hot = FIRST_SEGMENT as u32 + 7;
        table.age_slot(hot, RETIRED - 3);
        for cycle in 0..4 {
            table.give_back();
            let ops = fill(&table, FIRST_SEGMENT * 3);
            let pin = table.pin();
            for op in &ops {
                if op.index != hot && (op.index as usize) < FIRST_SEGMENT * 3 {
                    assert!(op.generation <= 8, "cycle {cycle}: {op:?} aged");
                }
                assert!(table.take(&pin, *op).is_some());
            }
        }
    }

    /// One long-lived operation in the top segment after a burst: nothing can be given
    /// back; once its free slots are set aside, each look is a few loads (no step), and
    /// the reaper's wait doubles from 200 ms to 1.6 s, so it neither spins nor sleeps
    /// without limit. Once the operation is taken, the segments go.
    #[test]
    fn one_long_lived_op_lets_the_reaper_sleep() {
        let table = OpTable::new();
        let burst = fill(&table, FIRST_SEGMENT * 3);
        let long_lived = burst[FIRST_SEGMENT * 3 - 1];
        {
            let pin = table.pin();
            for op in &burst[..FIRST_SEGMENT * 3 - 1] {
                assert!(table.take(&pin, *op).is_some());
            }
        }
        // Sets aside the top segment's free slots, then finds the segment in use.
        assert_eq!(table.give_back(), 0);
        let ms = |ms| Some(Duration::from_millis(ms));
        assert_eq!(
            table.look_again_within(),
            ms(400),
            "one look found it in use"
        );
        let mut waits = Vec::new();
        for _ in 0..10_000 {
            assert_eq!(table.give_back_step(), None, "a look, no step");
            waits.push(table.look_again_within());
        }
        assert_eq!(waits[..2], [ms(800), ms(1600)]);
        assert!(waits[2..].iter().all(|&wait| wait == ms(1600)));
        let pin = table.pin();
        assert!(table.is_waiting(&pin, long_lived));
        assert!(table.take(&pin, long_lived).is_some());
        drop(pin);
        assert_eq!(table.give_back(), FIRST_SEGMENT * 2);
        assert_eq!(table.look_again_within(), None);
    }

    /// Takes every operation of `ops` out of the table.
    fn take_all(table: &OpTable<Named>, ops: &[OpRef]) {
        let pin = table.pin();
        for op in ops {
            assert!(table.take(&pin, *op).is_some());
        }
        check_free_mask(table);
    }

    /// Free slots in the free lists at or above `from`.
    fn listed_from(table: &OpTable<Named>, from: u32) -> usize {
        check_free_mask(table);
        table
            .free
            .iter()
            .map(|l| l.indices.lock().iter().filter(|&&i| i >= from).count())
            .sum()
    }

    /// A drained burst goes back one bounded step at a time: no step unlinks more than
    /// one segment, and a segment goes only once every free list was swept, a list longer
    /// than a sweep step taking several steps.
    #[test]
    fn a_drained_burst_goes_back_in_bounded_steps() {
        let table = OpTable::new();
        // Segments 0 to 5; all freed by this thread, so into one free list.
        let slots = FIRST_SEGMENT * 63;
        let burst = fill(&table, slots);
        take_all(&table, &burst);
        let mut steps = 0;
        let mut unlinks = Vec::new();
        while let Some(unlinked) = table.step(Caller::Other) {
            steps += 1;
            if unlinked > 0 {
                unlinks.push((steps, unlinked));
            }
            assert!(steps < 10_000, "the steps end");
        }
        assert_eq!(table.capacity(), FIRST_SEGMENT);
        let sizes: Vec<usize> = unlinks.iter().map(|&(_, unlinked)| unlinked).collect();
        let segments: Vec<usize> = (1..=5).rev().map(|k| FIRST_SEGMENT << k).collect();
        assert_eq!(sizes, segments, "one segment at a time, the top first");
        // A step starts setting aside, then the list of all the burst's slots takes
        // several sweep steps, and every other list one.
        let sweeps = slots.div_ceil(SWEEP_STEP) + FREE_LISTS - 1;
        assert!(
            unlinks[0].0 > sweeps,
            "{unlinks:?} after {sweeps} sweep steps"
        );
        // Each segment's slots are read a scan step at a time before it is freed: the
        // largest, 32,768 slots, in two.
        assert!(steps >= unlinks.len() + (FIRST_SEGMENT << 5).div_ceil(SCAN_STEP));
    }

    /// A slot of a segment being emptied that is freed after the sweep passed its list
    /// goes aside, not to the list: the free lists name no slot of the segment, which
    /// goes once its last slot in use is freed.
    #[test]
    fn a_slot_freed_while_its_segment_is_emptied_goes_aside() {
        let table = OpTable::new();
        let burst = fill(&table, FIRST_SEGMENT * 3);
        let last = burst[FIRST_SEGMENT * 3 - 1];
        take_all(&table, &burst[..FIRST_SEGMENT * 3 - 1]);
        assert_eq!(table.give_back(), 0, "one slot in use");
        let start = FIRST_SEGMENT as u32;
        assert_eq!(table.aside.from(), start, "its free slots are set aside");
        assert_eq!(listed_from(&table, start), 0);
        take_all(&table, &[last]);
        assert_eq!(listed_from(&table, start), 0, "freed into aside");
        assert_eq!(
            table.aside.len.load(Ordering::Relaxed),
            FIRST_SEGMENT * 2,
            "every slot of the segment handed out"
        );
        assert_eq!(table.give_back(), FIRST_SEGMENT * 2);
        assert_eq!(table.aside.from(), u32::MAX);
        assert_eq!(table.capacity(), FIRST_SEGMENT);
    }

    /// When what is in use grows back past half the slots below the segment being
    /// emptied, setting aside stops: the slots set aside go back to a free list, none
    /// lost or counted twice, and allocation takes them again.
    #[test]
    fn the_load_growing_back_stops_setting_aside_and_loses_no_slot() {
        let table = OpTable::new();
        let burst = fill(&table, FIRST_SEGMENT * 3);
        take_all(&table, &burst[..FIRST_SEGMENT * 3 - 1]);
        assert_eq!(table.give_back(), 0);
        assert_eq!(table.aside.from(), FIRST_SEGMENT as u32);
        // Takes the free slots of the first segment, then some set aside.
        let grown = fill(&table, 2_000);
        assert_eq!(table.give_back(), 0);
        assert_eq!(table.aside.from(), u32::MAX, "no longer emptied");
        assert_eq!(table.aside.len.load(Ordering::Relaxed), 0);
        let high = table.high_water.load(Ordering::Relaxed) as usize;
        assert_eq!(high, FIRST_SEGMENT * 3, "no new slot was made");
        let listed: usize = table.free.iter().map(|l| l.indices.lock().len()).sum();
        assert_eq!(
            listed + 1 + grown.len(),
            high,
            "every slot free or in use, once"
        );
        let again = fill(&table, listed);
        assert_eq!(table.high_water.load(Ordering::Relaxed) as usize, high);
        let mut indices: Vec<u32> = again
            .iter()
            .chain(&grown)
            .chain(&burst[FIRST_SEGMENT * 3 - 1..])
            .map(|op| op.index)
            .collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), high, "no slot handed out twice");
    }
}
