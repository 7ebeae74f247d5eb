//! Expiry and the reaper's rounds: the purgatory is a [`Member`] of the group its timer's
//! [`Driver`](timer_core::Driver) drives (`group.rs`: one purgatory built alone, or the
//! purgatories of a `TimerGroup`); the driver owns the reaper thread, the executor and
//! the shutdown protocol.
//!
//! # Invariants
//! - A timer task ([`Expiry`], `state.rs`) only names an operation. Firing it takes the operation out
//!   of its slot if it is still there (exactly once, see `op_table.rs`) and completes it
//!   as expired; if an event, a force or a cancel took it first, firing does nothing.
//! - Every round starts by applying the queued timer cancels of completed operations
//!   (`cancels.rs`), and ends with the housekeeping (`housekeeping.rs`): giving back what
//!   a drained burst left unused (the op table's segments, `op_table/give_back.rs`, and
//!   the timer's entry slots, `TimerCore::give_back`) and purging (`purge.rs`), in bounded
//!   steps between which the timer fires whatever comes due, with no pin held. It also
//!   says how long the next round may sleep: `REAPER_WAIT` at most while the timer holds
//!   anything (Kafka's reaper wait), a purge is due or a give-back is pending (longer,
//!   up to 1.6 s, while the segment being emptied stays in use), without limit when none
//!   is. The timer applies the bound that holds when the round starts to wait, and the
//!   first add wakes a reaper sleeping without limit, so operations watched just after a
//!   round found the purgatory idle still get their purges and cancels within
//!   `REAPER_WAIT`, and memory comes back even when nothing else would wake the reaper. A
//!   pin held long delays the free of what was unlinked, not its reuse.
//! - With the cargo feature `metrics`, a round ends by publishing the figures if the last
//!   publish is a second old (`metrics.rs`), which may shorten the next sleep.
//! - Pending operations still there at shutdown (or when the last handle is dropped) are
//!   expired, so every waiting request is answered; they are counted apart from timeouts
//!   (`expired_at_shutdown`). With the feature `metrics`, the figures are then published
//!   one last time.

use std::hash::Hash;
use std::time::Duration;

use timer_core::NextRound;

use crate::counters::ThisStripe;
use crate::group::Member;
use crate::op_table::{OpRef, VacateLater};
use crate::operation::DelayedOperation;
use crate::state::{Expiry, State};

/// Longest the reaper sleeps while operations are pending or a purge is due, so stale
/// entries are looked at even when the next timeout is far away.
pub(crate) const REAPER_WAIT: Duration = Duration::from_millis(200);

impl<K, O> Member for State<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// One pin for the whole run, not one per task, the slots freed together
    /// (`VacateLater`: at most 32 at a time, the rest when the run ends or a panic
    /// unwinds through it), and the thread's counter stripe read once.
    fn expire_run(&self, first: OpRef, next: &mut dyn FnMut() -> Option<Expiry>) -> Option<Expiry> {
        let pin = self.table.pin();
        let mut vacating = VacateLater::new(&self.table);
        let stripe = ThisStripe::read();
        let mut op = first;
        loop {
            self.expire_one_vacating_later(&pin, op, &mut vacating, stripe);
            match next() {
                Some(expiry) if expiry.member == self.member => op = expiry.op,
                other => return other,
            }
        }
    }

    fn before_round(&self) {
        self.cancels.flush(&self.timer);
        self.expire_orphans();
    }

    fn after_round(&self) -> NextRound {
        // Giving memory back and purging, in bounded steps between which the timer
        // fires what comes due (`housekeeping.rs`).
        let wait = self.housekeep();
        #[cfg(feature = "metrics")]
        let wait = self.publish_if_due(wait);
        wait
    }

    fn expire_pending(&self, pending: Vec<Expiry>) -> usize {
        State::expire_pending(self, pending)
    }
}

impl<K, O: DelayedOperation> State<K, O> {
    /// Shutdown's last step: expires what was still pending and empties the lists.
    /// Returns how many it expired.
    pub(crate) fn expire_pending(&self, pending: Vec<Expiry>) -> usize
    where
        K: Hash + Eq + Clone,
    {
        let expired = self.expire_at_shutdown(pending);
        self.watchers.clear(&self.user);
        crate::user_code::report!(self.user, DEBUG, purgatory = %self.name, expired, "shutdown");
        #[cfg(feature = "metrics")]
        self.publish_final();
        expired
    }
}

impl<K, O: DelayedOperation> Drop for State<K, O> {
    /// The purgatory's memory is freed: an expiry that only an unwinding holder saw after
    /// shutdown had expired what was pending (no round runs any more to complete it, see
    /// `op_table.rs`) is completed now, and the keys a watch racing shutdown listed after
    /// it emptied the lists are dropped through the door (not with the lists).
    fn drop(&mut self) {
        self.expire_orphans();
        self.watchers.clear(&self.user);
        #[cfg(feature = "metrics")]
        self.publish_at_drop();
        #[cfg(feature = "metrics")]
        self.metrics.release(&self.user);
    }
}
