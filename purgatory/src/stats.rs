//! A snapshot of one purgatory's figures, for metrics.

use crate::counters::Totals;
use crate::operation::DelayedOperation;
use crate::state::State;

/// Counters of one purgatory, for metrics. Each figure is read on its own while others
/// may be counting: a recent value, not a consistent snapshot of all of them.
///
/// With the cargo feature `serde`: `Serialize` and `Deserialize`, as an object of these
/// fields under their names (for a status endpoint or a log line); a field missing from
/// the input (a snapshot taken before it was added) reads as 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
#[non_exhaustive]
pub struct PurgatoryStats {
    /// Operations waiting for their timeout (armed timers).
    pub pending: usize,
    /// Watcher entries, including those of operations already answered or cancelled
    /// that no check of their key or purge has dropped yet (Kafka's `PurgatorySize`).
    /// Those linger on a quiet purgatory: a purge waits for at least the purge interval
    /// of them (1,000 by default), so a burst of cancels on an idle service can leave
    /// hundreds with nothing pending. For the entries of waiting operations alone, read
    /// [`watched_live`](Self::watched_live).
    pub watched: usize,
    /// Watcher entries of operations still waiting: `watched` less the entries of
    /// operations already taken (completed, expired or cancelled) and not yet dropped.
    /// 0 when nothing waits, whether or not a purge has run. It subtracts a count the
    /// lists keep anyway (the one that decides when to purge), read apart from
    /// `watched`: exact on a quiet purgatory, a recent estimate while calls run.
    pub watched_live: usize,
    /// Keys with a watcher list.
    pub keys: usize,
    /// Operations completed because `try_complete` returned true (on watch or on an event).
    pub completed: u64,
    /// Operations completed by `force_complete`.
    pub forced: u64,
    /// Operations completed by their timeout.
    pub expired: u64,
    /// Operations expired by shutdown (or the drop of the last handle) before their
    /// timeout: answered with [`Completion::Shutdown`](crate::Completion::Shutdown), and
    /// counted here, not in `expired`.
    pub expired_at_shutdown: u64,
    /// Operations handed back by `cancel` or `cancel_for_key`.
    pub cancelled: u64,
    /// Completed entries dropped from lists by purges (not by checks of their key).
    pub purged: u64,
    /// Operations refused by a watch (`watch`, `try_complete_else_watch`, a member of
    /// `watch_batch`, `park_with`, `wait_until`), given back in a
    /// [`WatchError`](crate::WatchError): the purgatory shut down, no keys, a key's
    /// `Hash` or `Eq` or the operation's `timeout()` panicked. Never accepted, so never
    /// answered by the purgatory: counted so that a service's tally of requests it
    /// answered itself (a 503 to a request that came during shutdown) meets the figures.
    pub refused: u64,
    /// User code that panicked, caught and reported: every panic the door of
    /// `user_code.rs` caught (callbacks, `try_complete`, `timeout()`, an operation's or a
    /// key's `Drop`, a key's `Hash` or `Eq` while being watched, the metrics recorder, the
    /// tracing subscriber) and every read of the clock that panicked.
    pub panicked: u64,
    /// Reliefs of late expiry: each handed a stand-in thread (started, or woken from its
    /// wait for more) the unclaimed operations of a late batch, or the reaper's rounds,
    /// while user code held a driving thread (see `docs/purgatory.md`, "Isolation").
    /// Rising steadily, callbacks are often slow or blocked.
    pub stand_ins: u64,
    /// Times relief was wanted while every stand-in slot was taken
    /// (`TimerBuilder::max_stand_ins`, 32 by default): the operations behind the held
    /// callbacks then waited for one of them. Each time is also reported (a warning,
    /// target `timer_core`). Not 0: raise the limit, or find what blocks the callbacks.
    pub stand_in_limit_reached: u64,
}

impl<K, O: DelayedOperation> State<K, O> {
    /// The figures of [`Purgatory::stats`](crate::Purgatory::stats), for the API and for
    /// metrics published from the reaper. Applies the queued timer cancels first, so
    /// `pending` counts only operations still waiting.
    pub(crate) fn stats(&self) -> PurgatoryStats {
        self.cancels.flush(&self.timer);
        let totals = self.counters.totals();
        let watched = self.watchers.entries();
        // The stale count may dip below zero for a moment, or exceed `watched` read a
        // moment before (see `watchers.rs`): clamped, a recent estimate.
        let stale = usize::try_from(self.watchers.stale()).unwrap_or(0);
        let timer = self.timer.stats();
        PurgatoryStats {
            pending: self.pending_of(&totals, timer.pending),
            watched,
            watched_live: watched.saturating_sub(stale),
            keys: self.watchers.keys(),
            completed: totals.completed,
            forced: totals.forced,
            expired: totals.expired,
            expired_at_shutdown: totals.shutdown_expired,
            cancelled: totals.cancelled,
            purged: totals.purged,
            refused: totals.refused,
            panicked: self.user.panicked() + self.timer.clock_panics(),
            stand_ins: timer.stand_ins,
            stand_in_limit_reached: timer.stand_in_limit_reached,
        }
    }
}

impl<K, O: DelayedOperation> State<K, O> {
    /// Operations waiting for their timeout: the timer's armed tasks (applied the queued
    /// cancels first); on a `TimerGroup`, whose timer is every member's, what this one
    /// accepted and did not answer yet (a recent value: a count read while calls run).
    pub(crate) fn pending(&self) -> usize {
        self.cancels.flush(&self.timer);
        if self.in_group {
            self.pending_of(&self.counters.totals(), 0)
        } else {
            self.timer.len()
        }
    }

    fn pending_of(&self, totals: &Totals, armed: usize) -> usize {
        if !self.in_group {
            return armed;
        }
        let answered = totals.completed
            + totals.forced
            + totals.expired
            + totals.shutdown_expired
            + totals.cancelled;
        usize::try_from(totals.accepted.saturating_sub(answered)).unwrap_or(usize::MAX)
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::PurgatoryStats;

    #[test]
    fn stats_serialize_under_their_field_names_and_read_back() {
        let stats = PurgatoryStats {
            pending: 1,
            watched: 2,
            watched_live: 11,
            keys: 3,
            completed: 4,
            forced: 5,
            expired: 6,
            expired_at_shutdown: 7,
            cancelled: 8,
            purged: 9,
            refused: 12,
            panicked: 10,
            stand_ins: 13,
            stand_in_limit_reached: 14,
        };
        let json = serde_json::to_value(stats).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "pending": 1, "watched": 2, "watched_live": 11, "keys": 3, "completed": 4, "forced": 5,
                "expired": 6, "expired_at_shutdown": 7, "cancelled": 8, "purged": 9,
                "refused": 12, "panicked": 10, "stand_ins": 13, "stand_in_limit_reached": 14,
            })
        );
        assert_eq!(
            serde_json::from_value::<PurgatoryStats>(json).unwrap(),
            stats
        );
        // A field missing from an older snapshot reads as 0.
        let old: PurgatoryStats = serde_json::from_str(r#"{"pending": 7}"#).unwrap();
        assert_eq!((old.pending, old.panicked), (7, 0));
    }
}
