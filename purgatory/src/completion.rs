//! Completing operations: the one path every completion takes, whoever completes
//! (an event, a force, a timeout, shutdown), for one operation or a batch.
//!
//! # Invariants
//! - Exactly-once is decided before this: the operation was taken out of its slot
//!   (`op_table.rs`) by exactly one thread, which alone calls here with it.
//! - Callbacks run with no lock held, in the purgatory's runtime context if it has one
//!   (`runtime.rs`; entered once per batch) and in the span the operation was watched in
//!   if it has one (`span.rs`; entered once per operation around its callbacks, closed
//!   after); each goes through the door on its own (`user_code.rs`: `on_complete`,
//!   `on_expiration`, the drop), so one panic neither skips the others nor unwinds into
//!   the purgatory. Panics are counted and reported (in the span).
//! - The reaper's inline expiries come one operation at a time (`expire_one`), so that a
//!   stand-in can take over the rest of a batch while one callback runs long
//!   (`timer_core`'s `stand_in.rs`); a batch expired elsewhere (a pool, `advance_clock`,
//!   shutdown) is completed 16 at a time.
//! - An expiry handed over by an unlock (`watch.rs`, `check_and_complete`) is answered
//!   at once by the thread that let go of the slot. Every operation taken out of its slot
//!   outside a round (an event's, a force's, a watch's, a handed-over expiry) is answered
//!   under the driver's `work`, taken before the take: a shutdown that begins after the
//!   take waits for the answer. (An orphan, the expiry of a slot released by unwinding
//!   through the purgatory's own code, is answered by the next round, shutdown or the
//!   drop instead: `op_table.rs`.)
//! - A taken operation's armed timer is queued for cancelling (`cancels.rs`) and its
//!   watcher entries are marked stale before its callbacks run.
//! - Each completion is counted once, in the total of its outcome, and the operation is
//!   told the same outcome (`count_of`). An expiry is shutdown's (`Completion::Shutdown`,
//!   counted apart from timeouts) exactly when shutdown drained the operation's timer:
//!   what shutdown takes itself, and what a slot's holder or the orphans' sweep answers
//!   for it (the slot word says whose expiry it was, `slot.rs`). An expiry whose timer
//!   fired is a timeout (`Completion::Expired`), whenever it is answered, shutdown or
//!   not: its deadline had passed.

use std::mem::ManuallyDrop;

use smallvec::SmallVec;
use timer_core::TimerHandle;

use crate::counters::{Count, ThisStripe};
use crate::op_table::{Locked, OpRef, Taken, TakenExpiry, VacateLater};
use crate::operation::{Completion, DelayedOperation};
use crate::pins::Pinned;
use crate::span::CarriedSpan;
use crate::state::{Expiry, State};
use crate::user_code::{report, Site};

/// The total a completion `how` counts in: what an operation is told and what is
/// counted are one decision.
#[inline]
fn count_of(how: Completion) -> Count {
    match how {
        Completion::Ready => Count::Completed,
        Completion::Forced => Count::Forced,
        Completion::Expired => Count::Expired,
        Completion::Shutdown => Count::ShutdownExpired,
    }
}

/// A taken operation without the operation: what completing it needs besides (its span,
/// its armed timer, its key count). Apart so that the operation can stay where its
/// taker keeps it while its callbacks run ([`State::complete_placed`]).
pub(crate) struct Receipt {
    span: CarriedSpan,
    timer: Option<TimerHandle>,
    keys: u32,
    #[cfg(feature = "metrics")]
    since: u64,
}

impl Receipt {
    /// `taken` as its operation and the rest.
    #[inline(always)]
    pub(crate) fn split<O>(taken: Taken<O>) -> (O, Receipt) {
        let receipt = Receipt {
            span: taken.span,
            timer: taken.timer,
            keys: taken.keys,
            #[cfg(feature = "metrics")]
            since: taken.since,
        };
        (taken.op, receipt)
    }
}

impl<K, O: DelayedOperation> State<K, O> {
    /// `try_complete` on a locked operation, keeping the lock (a panic is caught,
    /// counted, and means "not ready").
    #[inline]
    pub(crate) fn is_ready(&self, locked: &mut Locked<'_, O>) -> bool {
        locked.try_complete(&self.user)
    }

    /// Completes every taken operation of `taken` (leaving it empty): queues their
    /// timers' cancels, marks their entries stale, counts them once, runs their
    /// callbacks. Returns how many it completed.
    pub(crate) fn complete<const N: usize>(
        &self,
        taken: &mut SmallVec<[Taken<O>; N]>,
        how: Completion,
    ) -> usize {
        self.complete_as(taken, how, count_of(how))
    }

    /// [`complete`](Self::complete), as `how` counted as `count` (`count_of(how)`).
    fn complete_as<const N: usize>(
        &self,
        taken: &mut SmallVec<[Taken<O>; N]>,
        how: Completion,
        count: Count,
    ) -> usize {
        let n = taken.len();
        if n == 0 {
            return 0;
        }
        let mut timers: SmallVec<[TimerHandle; N]> = SmallVec::new();
        let mut keys = 0u32;
        for t in taken.iter_mut() {
            if let Some(timer) = t.timer.take() {
                timers.push(timer);
            }
            keys = keys.saturating_add(t.keys);
        }
        self.cancels.push_many(&timers, &self.timer);
        self.record(n, keys, how, count);
        #[cfg(feature = "metrics")]
        self.record_waits(taken.iter().map(|t| t.since), count);
        let _runtime = self.runtime.enter();
        for t in taken.drain(..) {
            self.run_callbacks(t.op, t.span, how);
        }
        n
    }

    /// Completes one taken operation: [`complete`](Self::complete) for a batch of one,
    /// without the batch's buffers.
    pub(crate) fn complete_one(&self, taken: Taken<O>, how: Completion) {
        self.complete_one_as(ThisStripe::read(), taken, how, count_of(how));
    }

    /// Expires the operation `op` names if it is still in the table (a round's expiry,
    /// handed out one task at a time), counted as a timeout, leaving the slot's free to
    /// `vacating`. `stripe` is the calling thread's, read once for the run.
    #[inline]
    pub(crate) fn expire_one_vacating_later<'t>(
        &'t self,
        pin: &Pinned<'_>,
        op: OpRef,
        vacating: &mut VacateLater<'t, O>,
        stripe: ThisStripe,
    ) {
        if let Some((taken, vacated)) =
            self.table
                .take_for_expiry_deferred(pin, op, Completion::Expired)
        {
            vacating.push(vacated);
            self.complete_one_as(stripe, taken, Completion::Expired, Count::Expired);
        }
    }

    /// [`complete_one`](Self::complete_one), counted as `count` in `stripe` (the
    /// calling thread's).
    #[inline]
    fn complete_one_as(&self, stripe: ThisStripe, taken: Taken<O>, how: Completion, count: Count) {
        let (op, receipt) = Receipt::split(taken);
        let span = self.account_one(stripe, receipt, how, count);
        let _runtime = self.runtime.enter();
        self.run_callbacks(op, span, how);
    }

    /// Completes one taken operation that lies in `placed` (its [`Receipt`] the rest of
    /// it), counted as `count`: its callbacks run on it there, and it is dropped there,
    /// leaving `None`. A single watch completes what it took this way, in its caller's
    /// frame (`watch.rs`).
    #[inline(always)]
    pub(crate) fn complete_placed(
        &self,
        placed: &mut Option<O>,
        receipt: Receipt,
        how: Completion,
        count: Count,
    ) {
        let span = self.account_one(ThisStripe::read(), receipt, how, count);
        let _runtime = self.runtime.enter();
        self.run_callbacks_placed(placed, span, how);
    }

    /// What completing one operation does before its callbacks: queues its timer's
    /// cancel, marks its entries stale, counts it (and with the feature `metrics`,
    /// samples its wait), in `stripe` (the calling thread's). Gives its span back, to
    /// enter around the callbacks.
    #[inline(always)]
    fn account_one(
        &self,
        stripe: ThisStripe,
        receipt: Receipt,
        how: Completion,
        count: Count,
    ) -> CarriedSpan {
        if let Some(timer) = receipt.timer {
            self.cancels.push_many(&[timer], &self.timer);
        }
        self.record_in(stripe, 1, receipt.keys, how, count);
        #[cfg(feature = "metrics")]
        self.record_waits([receipt.since], count);
        receipt.span
    }

    /// Marks the entries of `n` completed operations (`keys` in all) stale and counts
    /// the operations as `count`. Inlined, so that a caller's constant `how` and `count`
    /// pick the counter and drop the report at compile time; the report, large, stays
    /// out of line. (Called out of line, it cost 38 instructions an expiry, with a
    /// jump table for the counter: `expiring_watches` under callgrind.)
    #[inline]
    fn record(&self, n: usize, keys: u32, how: Completion, count: Count) {
        self.record_in(ThisStripe::read(), n, keys, how, count);
    }

    /// [`record`](Self::record) in `stripe`, the calling thread's: both counts in it,
    /// from one read of it.
    #[inline]
    fn record_in(&self, stripe: ThisStripe, n: usize, keys: u32, how: Completion, count: Count) {
        self.watchers.mark_stale_in(stripe, keys);
        self.counters.add_in(stripe, count, n as u64);
        if !how.is_expiry() {
            self.report_completed(n, how);
        }
    }

    /// [`record`](Self::record)'s report of completions other than expiries.
    #[inline(never)]
    fn report_completed(&self, n: usize, how: Completion) {
        report!(self.user, DEBUG, purgatory = %self.name, ?how, completed = n, "complete");
    }

    /// Shutdown's expiry of what was still pending (`pending`, drained from the timer, so
    /// there is no timer to cancel) and of the orphans: every operation of `pending`
    /// still in the table (one whose slot is held, its `try_complete` maybe running on
    /// another thread, is not waited for: the holder's unlock hands it to the holder to
    /// expire, unless the holder completed it, see `slot.rs`), counted as expired by
    /// shutdown (`PurgatoryStats::expired_at_shutdown`) and answered
    /// `Completion::Shutdown`, not as timeouts. Returns how many it expired.
    pub(crate) fn expire_at_shutdown(&self, pending: Vec<Expiry>) -> usize {
        self.expire_as(pending, Completion::Shutdown, Count::ShutdownExpired)
            + self.expire_orphans()
    }

    fn expire_as(
        &self,
        expired: impl IntoIterator<Item = Expiry>,
        how: Completion,
        count: Count,
    ) -> usize {
        let mut taken: SmallVec<[Taken<O>; 16]> = SmallVec::new();
        let mut done = 0;
        let pin = self.table.pin();
        for expiry in expired {
            if let Some(mut t) = self.table.take_for_expiry(&pin, expiry.op, how) {
                t.timer = None;
                taken.push(t);
                if taken.len() == taken.inline_size() {
                    done += self.complete_as(&mut taken, how, count);
                }
            }
        }
        done += self.complete_as(&mut taken, how, count);
        if done > 0 {
            report!(self.user, DEBUG, purgatory = %self.name, count = done, "expire");
        }
        done
    }
}

impl<K, O: DelayedOperation> State<K, O> {
    /// Expires the operations whose expiry only an unwinding holder saw (see
    /// `op_table.rs`), each as whose expiry it was (its timeout's or shutdown's); returns
    /// how many.
    pub(crate) fn expire_orphans(&self) -> usize {
        let orphans = self.table.take_orphans();
        let n = orphans.len();
        for orphan in orphans {
            self.complete_expiry(orphan);
        }
        n
    }

    /// Answers an expiry taken out of its slot, as whose it was: its timeout's
    /// (`Expired`, even if shutdown began meanwhile: the deadline had passed) or
    /// shutdown's.
    pub(crate) fn complete_expiry(&self, expiry: TakenExpiry<O>) {
        self.complete_one(expiry.taken, expiry.how);
    }
}

impl<K, O: DelayedOperation> State<K, O> {
    /// Runs `on_complete` (and `on_expiration` for an expiry, by timeout or shutdown),
    /// then drops the operation, each through the door (a panic of one skips none of the
    /// others), all three in the span the operation was watched in (`span.rs`), which is
    /// closed after.
    ///
    /// The operation is moved once, into the closure around the callbacks, and dropped
    /// there where it lies: moved on into the catch of its drop, it was copied twice.
    fn run_callbacks(&self, op: O, span: CarriedSpan, how: Completion) {
        let mut op = ManuallyDrop::new(op);
        span.enter_around(&self.user, move || {
            self.callbacks(&mut op, how);
            // SAFETY: `op` is dropped here, once, and not used after.
            unsafe { self.user.drop_manually(Site::OperationDrop, &mut op) };
        });
    }

    /// [`run_callbacks`](Self::run_callbacks) on the operation where it lies, in
    /// `placed` (left `None`): a single watch's, in its caller's frame, so that a chain
    /// of re-entrant watches keeps one copy of each operation on the stack.
    fn run_callbacks_placed(&self, placed: &mut Option<O>, span: CarriedSpan, how: Completion) {
        span.enter_around(&self.user, || {
            if let Some(op) = placed.as_mut() {
                self.callbacks(op, how);
            }
            self.user.drop_placed(Site::OperationDrop, placed);
        });
    }

    /// `on_complete`, and `on_expiration` for an expiry, each through the door.
    #[inline(always)]
    fn callbacks(&self, op: &mut O, how: Completion) {
        self.user.call(Site::OnComplete, || op.on_complete(how));
        if how.is_expiry() {
            self.user.call(Site::OnExpiration, || op.on_expiration());
        }
    }
}
