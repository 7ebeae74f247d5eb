//! The reaper's housekeeping between its rounds: giving memory back and purging, one
//! bounded step at a time, off the timing path.
//!
//! The reaper thread fires timeouts; everything else it does between rounds is the
//! library's own housekeeping, and a timeout that comes due meanwhile waits for it. So
//! each piece of it is done in steps whose work does not grow with the burst or the
//! table, and the timer fires between any two:
//!
//! | housekeeping | a step | median (90th percentile) | where |
//! |---|---|---|---|
//! | the op table's segments | a look, a sweep of part of a free list, an unlink, a scan of part of a segment, a hand-over of segments to free, a shrink | at most 124 us (188 us), the scan | `op_table/give_back.rs` |
//! | the timer's entry slots | in each timer shard, at most 32,768 free slots above the last in use dropped; the memory handed over to be freed when the give-back ends | 279 us (416 us) | `timer-core/src/wheel/slab.rs` |
//! | purging | [`STEP`](crate::purge::STEP) list entries under one watcher shard lock | 20 us (34 us) | `purge.rs` |
//!
//! (Steps timed while a forced burst of 2,000,000 was purged and given back, release
//! build, this shared 2-core machine; `purgatory/tests/housekeeping_lateness.rs` checks
//! what a timeout sees of it: at most 6 ms more lateness than before the burst.)
//!
//! # Invariants
//! - Between two steps the housekeeping looks whether a timer bucket is due, and if one
//!   is it stops and asks for a round that waits for nothing: the round fires it, and the
//!   housekeeping resumes after. A timeout waits for one step at most, besides the
//!   rounds' own work.
//! - The give-backs come first, then the purge (which looks at the timer between its own
//!   steps the same way, `purge.rs`).
//! - Nothing here unmaps memory on the reaper: what the give-backs free (the op table's
//!   segments and buffers, the timer's slabs) goes to the thread that drops things
//!   (`discard.rs`). While that thread is at it, no step that may change the process's
//!   mappings runs here (a timer's give-back step, a purge's frees, the op table's
//!   allocations and shrinks): such a change would wait for the unmapping. The reaper
//!   comes back after [`WHILE_UNMAPPING`] instead.
//! - The timer's give-back locks every timer shard, so a steady load with nothing to
//!   give back does not call it: for [`TIMER_LOOKS`] passes after the op table unlinked a
//!   segment (the timer's slots of a burst are freed up to a round after their
//!   operations'), and while its last call gave something back (it goes on in steps).
//! - The reaper sleeps without limit only when nothing is pending: while the op table's
//!   give-back has something to do or wait for, the timer's is under way, or a purge is
//!   due, the next round comes within `REAPER_WAIT` (or the give-back's own, longer wait
//!   while the segment it empties stays in use, up to 1.6 s,
//!   `OpTable::look_again_within`), so memory comes back without any further call.
//!   A purge that completions make due after the housekeeping decided "without limit"
//!   is reached too: their operations' timer entries keep the timer queued (the next
//!   round comes within `REAPER_WAIT`) until their cancels are applied, and a round that
//!   finds the timer emptied by those cancels returns to this housekeeping instead of
//!   sleeping on the old decision (`timer-core`'s `TimerCore::advance_with`;
//!   `tests/purge.rs`).

use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::time::Duration;

use timer_core::NextRound;

use crate::discard;
use crate::expiry::REAPER_WAIT;
use crate::operation::DelayedOperation;
use crate::state::State;

/// The wait before the next round while housekeeping that may change the process's
/// mappings waits for the thread that unmaps (`discard.rs`).
const WHILE_UNMAPPING: Duration = Duration::from_millis(1);

/// Housekeeping passes during which the timer's give-back is looked at after the op
/// table unlinked a segment.
pub(crate) const TIMER_LOOKS: u8 = 4;

impl<K: Hash + Eq, O: DelayedOperation> State<K, O> {
    /// The housekeeping after a round (see the module doc); returns how long the next
    /// round may wait.
    pub(crate) fn housekeep(&self) -> NextRound {
        if self.give_back_some() {
            // Stopped for a bucket due: the next round fires it at once.
            return NextRound::at_most(Duration::ZERO);
        }
        let purge_due = self.purge_due();
        let pending = purge_due || self.timer_looks.load(Ordering::Relaxed) > 0;
        if discard::busy() && pending {
            // A purge frees memory, and the timer's give-back shrinks its slabs: either
            // may wait for the unmapping under way (`discard.rs`). Soon again instead.
            return NextRound::at_most(WHILE_UNMAPPING);
        }
        if purge_due && self.purge_some() {
            return NextRound::at_most(Duration::ZERO);
        }
        let mut empty = if pending { REAPER_WAIT } else { Duration::MAX };
        if let Some(look) = self.table.look_again_within() {
            empty = empty.min(look);
        }
        NextRound {
            queued: REAPER_WAIT,
            empty,
        }
    }

    /// Give-back steps, the op table's and the timer's, while either has one to take and
    /// no bucket is due. Returns whether it stopped for a bucket due (with steps left).
    fn give_back_some(&self) -> bool {
        // The timer gave nothing in this pass: not asked again in it.
        let mut timer_done = false;
        loop {
            let table = self.table.give_back_step();
            if table.is_some_and(|slots| slots > 0) {
                self.timer_looks.store(TIMER_LOOKS, Ordering::Relaxed);
                timer_done = false;
            }
            // Its steps may shrink a large block in place (a slab longer than a step),
            // which would wait for an unmapping under way (`discard.rs`): not meanwhile.
            let timer = !timer_done && !discard::busy() && self.timer_wants_a_look() && {
                // The memory a shard's last step frees is unmapped off the reaper.
                let slots = self.timer.give_back_elsewhere(discard::discard);
                if slots > 0 {
                    // It goes on in steps: looked at again until it gives nothing.
                    self.timer_looks.store(TIMER_LOOKS, Ordering::Relaxed);
                } else {
                    timer_done = true;
                }
                slots > 0
            };
            if table.is_none() && !timer {
                return false;
            }
            if self.bucket_due() {
                return true;
            }
        }
    }

    /// Whether the timer's give-back is looked at in this pass without a step of the op
    /// table's (counts the passes down).
    fn timer_wants_a_look(&self) -> bool {
        let looks = self.timer_looks.load(Ordering::Relaxed);
        if looks > 0 {
            self.timer_looks.store(looks - 1, Ordering::Relaxed);
        }
        looks > 0
    }

    /// Whether a timer bucket is due: the housekeeping stops for it.
    pub(crate) fn bucket_due(&self) -> bool {
        self.timer
            .next_expiration()
            .is_some_and(|due| due <= self.timer.now())
    }
}
