//! Giving memory back: the op table's segments that a drained burst left unused go
//! back between the reaper's rounds (the slot table itself is `op_table.rs`'s).
//!
//! # Giving memory back
//! | segment `k` | what reaches it | who moves it on |
//! |---|---|---|
//! | absent (never made, or given back) | a name of it finds the `gone` slot (no name matches) | [`new_slots`](OpTable::new_slots) makes it (outside `growth`, under `making`), its slots starting at `floors[k]`, and links it under `growth` |
//! | made | look-ups under a pin; its slots handed out | [`give_back`](OpTable::give_back) unlinks it, under `growth` |
//! | unlinked, not freed | only pins taken before the unlink | [`free_unlinked`](OpTable::free_unlinked) frees it once each stripe's pins were read as 0 after the unlink (`pins.rs`); or, if new slots reach it first, [`new_slots`](OpTable::new_slots) links it again as it is, under `growth` (made) |
//!
//! - Only the top segment is given back, never the first, and only while every one of
//!   its slots is in a free list (checked under every free-list lock, which it holds
//!   until no list names a slot of it and new slots start below it) and what is in use
//!   is at most half the slots below it: a held slot, a slot just allocated or taken and
//!   not yet vacated, a retired slot, keeps its segment. So a thread that holds a slot
//!   or has just been handed one reaches it without a pin; every look-up by a name that
//!   may be stale (a list entry, a timer entry, a handle) is made under a pin
//!   ([`OpTable::pin`]; the methods that take a name take the pin, and what they return
//!   borrows it).
//! - While the top segment could go but some slot of it is in use, its slots are set
//!   aside as they are freed (`aside_from`, `aside`) instead of going back to a free
//!   list: allocation takes the slots below first (the set-aside ones only once every
//!   free list is empty), so a steady load that came after a burst moves down and the
//!   segment empties. Setting aside stops when the segment is given back, or when what
//!   is in use grows past half of the slots below it. Giving back counts the slots set
//!   aside as free (under the same locks).
//! - `floors[k]` is the highest generation a slot of segment `k` had (its next
//!   occupant's) when it was given back: a name of a slot is below its slot's
//!   generation, so no name of the segment given back matches a slot made again. A
//!   segment whose highest generation is above [`MAX_FLOOR`] (`RETIRED / 2`) is not
//!   given back (nor, so, any below it): made again, all its slots would start there.
//! - A pin held long (a callback that blocks under a check's or a batch expiry's pin)
//!   delays the free of what is given back meanwhile, not its reuse: a segment waiting
//!   for its grace is linked again, slots and generations as they were, when new slots
//!   reach it, so a long pin keeps at most one burst's segments, however many bursts
//!   come and go under it. A thread pinned since before the unlink finds the same live
//!   segment, as before the unlink.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::{locate, OpTable, Segment, Vacated, FIRST_SEGMENT, RETIRED, SEGMENTS};
use crate::counters::{stripe_index, STRIPES};
use crate::operation::DelayedOperation;
use crate::pins::Grace;

/// The cold state of making and giving back segments.
pub(super) struct Growth<O> {
    /// Per segment, the generation its slots start with when it is made (again): the
    /// highest next generation its slots had when it was given back, so that no name
    /// of its earlier slots matches a later one.
    pub(super) floors: [u32; SEGMENTS],
    /// Segments unlinked, each freed once its grace has passed (`pins.rs`).
    pub(super) unlinked: Vec<(Box<Segment<O>>, Grace)>,
    /// The next wait in `skip` after an attempt that found the top segment in use.
    pub(super) backoff: u32,
    /// Under loom: segments "freed", kept so that a late look-up is reported, not run.
    #[cfg(loom)]
    pub(super) dead: Vec<Box<Segment<O>>>,
}

/// The first slot index of segment `k`.
fn segment_start(k: usize) -> u32 {
    (FIRST_SEGMENT as u64 * ((1u64 << k) - 1)) as u32
}

/// [`OpTable::give_back`] calls after one that gave back, during which the table still
/// wants a look (see `after_give_back`).
const AFTER_GIVE_BACK: u8 = 4;

/// The highest generation a segment given back may have: one whose slots went further
/// is kept, since made again all its slots would start there (`floors`), and a few
/// cycles of one hot slot would retire the whole segment. At most this, a segment made
/// again still has 2^31 operations per slot ahead.
pub(super) const MAX_FLOOR: u32 = RETIRED / 2;

/// Longest wait, in [`OpTable::give_back`] calls, between two attempts that found the top
/// segment in use (each attempt reads every free list under its lock).
const MAX_BACKOFF: u32 = 1 << 10;

impl<O: DelayedOperation> OpTable<O> {
    /// Segment `k` if it was given back and is not freed yet: taken out of
    /// `growth.unlinked` to be linked again as it is. Under `growth`.
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
        let at = growth
            .unlinked
            .iter()
            .position(|(segment, _)| segment.slots.len() == FIRST_SEGMENT << k)?;
        let (segment, _) = growth.unlinked.swap_remove(at);
        self.has_unlinked
            .store(!growth.unlinked.is_empty(), Ordering::Release);
        Some(segment)
    }

    /// [`vacate`](Self::vacate) while slots at or above `aside_from` are set aside (out
    /// of line: only while a segment is being emptied).
    #[cold]
    #[inline(never)]
    pub(super) fn vacate_setting_aside(&self, vacated: &[Vacated], aside_from: u32) {
        let list = &self.free[stripe_index()];
        let mut free = list.indices.lock();
        free.extend(
            vacated
                .iter()
                .filter(|v| !v.retired && v.index < aside_from)
                .map(|v| v.index),
        );
        list.available.store(free.len(), Ordering::Relaxed);
        drop(free);
        let mut aside = self.aside.lock();
        aside.extend(
            vacated
                .iter()
                .filter(|v| !v.retired && v.index >= aside_from)
                .map(|v| v.index),
        );
        self.aside_len.store(aside.len(), Ordering::Relaxed);
    }

    /// Gives back the top segments while none of their slots is in use and what is in
    /// use would still fit in half of what remains (see "Giving memory back" in the
    /// module doc); frees the segments given back earlier whose grace has passed.
    /// Returns how many slots it unlinked. For the reaper's rounds and
    /// `Purgatory::purge`: never on a request's path, and with no pin of this thread
    /// held (one only delays the free). Costs a few loads when there is nothing to give
    /// back.
    pub(crate) fn give_back(&self) -> usize {
        if self.has_unlinked.load(Ordering::Acquire) {
            self.free_unlinked();
        }
        let after = self.after_give_back.load(Ordering::Relaxed);
        if after > 0 {
            self.after_give_back.store(after - 1, Ordering::Relaxed);
        }
        if !self.worth_a_look() {
            if self.aside_from.load(Ordering::Relaxed) != u32::MAX {
                // What is in use grew back: no segment is being emptied any more.
                let _growth = self.growth.lock();
                self.stop_setting_aside();
            }
            return 0;
        }
        let mut growth = self.growth.lock();
        let skip = self.skip.load(Ordering::Relaxed);
        if skip > 0 {
            self.skip.store(skip - 1, Ordering::Relaxed);
            return 0;
        }
        let mut unlinked = 0;
        while self.worth_a_look() {
            let high = self.high_water.load(Ordering::Relaxed);
            let (k, _) = locate(high - 1);
            let start = segment_start(k);
            let spare = (high - start) as usize;
            // First one list at a time, then (if that found the whole top free) again
            // under every lock at once, which is what decides.
            let above = |free: &Vec<u32>| free.iter().filter(|&&i| i >= start).count();
            let found: usize = self
                .free
                .iter()
                .map(|l| above(&l.indices.lock()))
                .sum::<usize>()
                + above(&self.aside.lock());
            if found == spare && self.aged(k) {
                // Made again, every slot of it would start there: one hot slot would age
                // the whole segment. It stays, and so does every segment below it.
                // (Generations only grow, so a segment read as aged here is; read
                // before the free lists are locked, since it reads every slot.)
                self.stop_setting_aside();
                growth.backoff = MAX_BACKOFF;
                self.skip.store(MAX_BACKOFF, Ordering::Relaxed);
                break;
            }
            let mut lists: SmallVec<[_; STRIPES]> =
                self.free.iter().map(|l| (l, l.indices.lock())).collect();
            let mut aside = self.aside.lock();
            let in_lists: usize = lists.iter().map(|(_, free)| above(free)).sum();
            if found != spare || in_lists + above(&aside) != spare {
                // Some slot of the top segment is in use: from now on its slots are set
                // aside as they are freed, and those free now too, so that allocation
                // takes the slots below and the segment empties.
                self.aside_from.store(start, Ordering::Relaxed);
                for (list, free) in &mut lists {
                    aside.extend(free.iter().filter(|&&i| i >= start));
                    free.retain(|&i| i < start);
                    list.available.store(free.len(), Ordering::Relaxed);
                }
                self.aside_len.store(aside.len(), Ordering::Relaxed);
                drop(aside);
                drop(lists);
                growth.backoff = (growth.backoff * 2).min(MAX_BACKOFF);
                self.skip.store(growth.backoff, Ordering::Relaxed);
                break;
            }
            aside.retain(|&i| i < start);
            aside.shrink_to_fit();
            self.aside_len.store(aside.len(), Ordering::Relaxed);
            self.aside_from.store(u32::MAX, Ordering::Relaxed);
            drop(aside);
            for (list, free) in &mut lists {
                free.retain(|&i| i < start);
                let len = free.len();
                if free.capacity() > 4 * len + 64 {
                    free.shrink_to(2 * len);
                }
                list.available.store(free.len(), Ordering::Relaxed);
            }
            // No free list names a slot of segment `k` any more, and new slots start
            // below it: nobody can be handed one of its slots.
            self.high_water.store(start, Ordering::Relaxed);
            drop(lists);
            let segment = self.segments[k].swap(std::ptr::null_mut(), Ordering::AcqRel);
            // SAFETY: segment `k` existed (it holds slot `high - 1`), made by
            // `Box::into_raw`; unlinked now, it is freed only after its grace.
            let segment = unsafe { Box::from_raw(segment) };
            // Every slot is free, so its word is stable (a stale name's compare fails and
            // writes nothing), and holds the generation its next occupant would get,
            // above every name it ever had.
            growth.floors[k] = segment
                .slots
                .iter()
                .map(|s| s.slot.generation())
                .max()
                .unwrap_or(0);
            growth.unlinked.push((segment, Grace::default()));
            self.has_unlinked.store(true, Ordering::Release);
            growth.backoff = 1;
            unlinked += FIRST_SEGMENT << k;
        }
        drop(growth);
        if unlinked > 0 {
            self.after_give_back
                .store(AFTER_GIVE_BACK, Ordering::Relaxed);
            self.free_unlinked();
        }
        unlinked
    }

    /// Whether a slot of segment `k` (which exists) has a generation above
    /// [`MAX_FLOOR`]. Under `growth`.
    #[cfg(not(loom))]
    fn aged(&self, k: usize) -> bool {
        // SAFETY: segment `k` exists and is unlinked only under `growth`, held here.
        unsafe { &*self.segments[k].load(Ordering::Relaxed) }
            .slots
            .iter()
            .any(|s| s.slot.generation() > MAX_FLOOR)
    }

    /// Under loom never: no model ages a slot, and a read of every slot's word (one
    /// branch each) would take the models past loom's bound on branches.
    #[cfg(loom)]
    fn aged(&self, _k: usize) -> bool {
        false
    }

    /// Puts the slots set aside back in a free list. Under `growth`.
    fn stop_setting_aside(&self) {
        self.aside_from.store(u32::MAX, Ordering::Relaxed);
        let mut aside = std::mem::take(&mut *self.aside.lock());
        self.aside_len.store(0, Ordering::Relaxed);
        let list = &self.free[stripe_index()];
        let mut free = list.indices.lock();
        free.append(&mut aside);
        list.available.store(free.len(), Ordering::Relaxed);
    }

    /// Whether [`give_back`](Self::give_back) has something to look at: a segment given
    /// back and not freed yet, or a top segment that may be given back. (The reaper then
    /// does not sleep without limit.)
    ///
    /// While `give_back` backs off (it found the top segment in use, or aged past
    /// [`MAX_FLOOR`]), a top segment that may be given back does not count: the
    /// reaper's rounds would not look at it anyway.
    pub(crate) fn wants_a_look(&self) -> bool {
        self.has_unlinked.load(Ordering::Relaxed)
            || self.after_give_back.load(Ordering::Relaxed) > 0
            || (self.skip.load(Ordering::Relaxed) == 0 && self.worth_a_look())
    }

    /// Whether the top segment could be given back by the estimate of the free lists'
    /// lengths: it is not the first, and what is in use is at most half the slots below
    /// it (so a steady load never gives back a segment it grows into again).
    fn worth_a_look(&self) -> bool {
        let high = self.high_water.load(Ordering::Relaxed);
        if high as usize <= FIRST_SEGMENT {
            return false;
        }
        let free: usize = self
            .free
            .iter()
            .map(|l| l.available.load(Ordering::Relaxed))
            .sum::<usize>()
            + self.aside_len.load(Ordering::Relaxed);
        let in_use = (high as usize).saturating_sub(free);
        let (k, _) = locate(high - 1);
        k > 0 && in_use * 2 <= segment_start(k) as usize
    }

    /// Frees the segments given back whose grace has passed (`pins.rs`).
    fn free_unlinked(&self) {
        let mut growth = self.growth.lock();
        let mut freed = Vec::new();
        let mut i = 0;
        while i < growth.unlinked.len() {
            if growth.unlinked[i].1.passed(&self.pins) {
                freed.push(growth.unlinked.swap_remove(i).0);
            } else {
                i += 1;
            }
        }
        self.has_unlinked
            .store(!growth.unlinked.is_empty(), Ordering::Release);
        drop(growth);
        #[cfg(not(loom))]
        drop(freed);
        #[cfg(loom)]
        for segment in freed {
            // Kept until the table's drop under loom, so that a late look-up is a data
            // race loom reports rather than a use after free.
            // SAFETY: loom checks that no look-up reads this concurrently.
            segment.alive.with_mut(|alive| unsafe { *alive = false });
            self.growth.lock().dead.push(segment);
        }
    }

    /// Slots that exist (in segments made and not given back), for tests.
    #[cfg(test)]
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
    use super::super::tests::{fill, Named};
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
            !table.has_unlinked.load(Ordering::Relaxed),
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
            table.wants_a_look(),
            "not freed while a pin of before is held"
        );
        // Still readable through what was found before: the generation moved on.
        assert!(!found.may_be_waiting() || !table.is_waiting(&pin, stale));
        assert!(table.lock_found(found).is_none());
        drop(pin);
        assert_eq!(table.give_back(), 0);
        assert!(
            !table.has_unlinked.load(Ordering::Relaxed),
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
                let waiting: usize = growth.unlinked.iter().map(|(s, _)| s.slots.len()).sum();
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
            !table.has_unlinked.load(Ordering::Relaxed),
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
    /// back, and the table wants a look only on the rounds `give_back` would try again
    /// (its back-off), not on every round.
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
        let mut looks = 0;
        for _ in 0..10_000 {
            assert_eq!(table.give_back(), 0);
            looks += usize::from(table.wants_a_look());
        }
        assert!(table.is_waiting(&table.pin(), long_lived));
        assert!(looks <= 30, "wants a look on {looks} of 10,000 rounds");
    }
}
