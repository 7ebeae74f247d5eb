//! The purgatory's figures through the [`metrics`](::metrics) facade (cargo feature
//! `metrics`).
//!
//! Kafka reports two gauges per purgatory (`kafka.server:type=DelayedOperationPurgatory`):
//! `PurgatorySize`, its watcher entries, is `purgatory_watched` here, and
//! `NumDelayedOperations`, its operations waiting for their timeout, is
//! `purgatory_pending`. `PurgatorySize` counts the entries of answered and cancelled
//! operations until a check or a purge drops them, which on a quiet purgatory may be
//! never; `purgatory_watched_live` counts only those of operations still waiting (0 when
//! none is). This module publishes them, the totals of what happened to
//! operations, and how long operations waited, to whatever recorder the program installed
//! (a Prometheus exporter, for example). The metrics are listed on
//! [`Purgatory::publish_metrics`](crate::Purgatory::publish_metrics).
//!
//! # When
//! Gauges and counters are not counted twice for metrics: the operations' paths only
//! bump the counters that [`Purgatory::stats`](crate::Purgatory::stats) reads anyway.
//! The figures are read and published at the end of a reaper round (or an
//! `advance_clock` call) at most once per [`INTERVAL`], counters as absolute values. A
//! round that skips a publish because the last one was too recent shortens the reaper's
//! next sleep to when the next one is due, so the figures published are never more than
//! about an interval old once the purgatory goes quiet, and an idle purgatory then sleeps
//! without waking. [`Purgatory::publish_metrics`](crate::Purgatory::publish_metrics)
//! publishes at once, for purgatories driven without a reaper or a program that wants
//! fresh figures. Shutdown publishes the final figures (nothing pending or watched) once
//! more; after it, the reaper publishes nothing, and a call that changed the figures (an
//! answer made after shutdown by a `try_complete` that was running then, a completion
//! that raced it) publishes them again at its end.
//!
//! Gauges and counters are registered on each publish, so a recorder installed after the
//! purgatory was built receives them from the next publish on; but a purgatory that has
//! been idle since its reaper's first round (which publishes) publishes nothing until it
//! is used. Install the recorder first, or call `publish_metrics`. A recorder that panics
//! is caught and reported through `tracing`; the reaper goes on.
//!
//! # Wait times
//! The histogram `purgatory_wait_seconds` gets one sample per operation that waited: from
//! when its timeout was armed to when it was completed, expired or cancelled, read on the
//! purgatory's timer clock (so a `ManualClock` gives exact figures), labelled `outcome`.
//! An operation completed by `try_complete` while being watched never waited and is not
//! sampled (it is counted in `purgatory_completed_total`): Kafka's purgatory never holds
//! it either, and zeros for every request answered at once would hide the waits of those
//! that were delayed. This costs, with the feature only, a `u64` per operation slot, one
//! clock read when an operation is armed and one per completion call (a batch shares it).
//! The samples go through handles kept per purgatory, registered when it is built (with
//! the recorder current on the building thread) and again at every publish: samples taken
//! before a recorder is installed, or before the first publish after that, are lost.
//!
//! # Labels
//! Every metric has the label `purgatory`: the purgatory's name, unless another live
//! purgatory of that name was built before it: then `name#2`, `name#3`, ... (the lowest
//! number free), so two purgatories never write each other's series (`series.rs`). The
//! label is freed when the purgatory is dropped (its last handle; on a `TimerGroup`, when
//! the group is dropped: the group holds its members), not at shutdown. The
//! facade cannot remove a series: after a purgatory is dropped its series keep their
//! final values (gauges 0) until a later purgatory of the same name takes the label, whose counters then start again from 0 (a counter reset, as after a
//! restart).

use std::hash::Hash;
use std::time::{Duration, Instant};

use ::metrics::Label;
use timer_core::NextRound;

use crate::counters::Count;
use crate::op_table::NOT_ARMED;
use crate::operation::DelayedOperation;
use crate::purgatory::Purgatory;
use crate::series::{self, Publisher, PURGATORY};
use crate::state::State;
use crate::stats::PurgatoryStats;
use crate::user_code::Site;

/// Shortest time between two publishes from reaper rounds.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

type Figure = fn(&PurgatoryStats) -> u64;

/// Gauges: name, help text, figure.
const GAUGES: [(&str, &str, Figure); 4] = [
    (
        "purgatory_pending",
        "Operations waiting for their timeout (Kafka's NumDelayedOperations).",
        |s| s.pending as u64,
    ),
    (
        "purgatory_watched",
        "Watcher entries, completed ones not yet dropped included (Kafka's PurgatorySize).",
        |s| s.watched as u64,
    ),
    (
        "purgatory_watched_live",
        "Watcher entries of operations still waiting (purgatory_watched without the completed ones).",
        |s| s.watched_live as u64,
    ),
    ("purgatory_keys", "Keys with a watcher list.", |s| {
        s.keys as u64
    }),
];

/// Counters: name, help text, figure.
const COUNTERS: [(&str, &str, Figure); 10] = [
    (
        "purgatory_completed_total",
        "Operations completed because try_complete returned true.",
        |s| s.completed,
    ),
    (
        "purgatory_forced_total",
        "Operations completed by force_complete.",
        |s| s.forced,
    ),
    (
        "purgatory_expired_total",
        "Operations completed by their timeout.",
        |s| s.expired,
    ),
    (
        "purgatory_shutdown_expired_total",
        "Operations expired by shutdown before their timeout.",
        |s| s.expired_at_shutdown,
    ),
    (
        "purgatory_cancelled_total",
        "Operations handed back by cancel or cancel_for_key.",
        |s| s.cancelled,
    ),
    (
        "purgatory_purged_total",
        "Completed watcher entries dropped by purges.",
        |s| s.purged,
    ),
    (
        "purgatory_refused_total",
        "Operations refused by a watch and given back to the caller.",
        |s| s.refused,
    ),
    (
        "purgatory_panicked_total",
        "User code that panicked, caught and reported.",
        |s| s.panicked,
    ),
    (
        "purgatory_stand_ins_total",
        "Reliefs of late expiry by stand-in threads.",
        |s| s.stand_ins,
    ),
    (
        "purgatory_stand_in_limit_reached_total",
        "Times relief was wanted with every stand-in slot taken.",
        |s| s.stand_in_limit_reached,
    ),
];

/// Publishes `stats` as the figures of the series `label`.
fn publish(label: &str, stats: &PurgatoryStats) {
    let labels = [Label::new(PURGATORY, label.to_owned())];
    for (metric, help, figure) in GAUGES {
        ::metrics::describe_gauge!(metric, help);
        ::metrics::gauge!(metric, labels.iter()).set(figure(stats) as f64);
    }
    for (metric, help, figure) in COUNTERS {
        ::metrics::describe_counter!(metric, help);
        ::metrics::counter!(metric, labels.iter()).absolute(figure(stats));
    }
}

impl<K, O: DelayedOperation> State<K, O> {
    /// End of a round whose next sleep is `wait`: publishes if the last publish is an
    /// [`INTERVAL`] old, and returns how long the reaper may sleep (see the module doc).
    pub(crate) fn publish_if_due(&self, wait: NextRound) -> NextRound {
        let now = Instant::now();
        // Another thread is publishing now (a round, `publish_metrics`, shutdown): the
        // publish, if due, is its own.
        let Some(mut publisher) = self.metrics.publisher.try_lock() else {
            return wait;
        };
        if publisher.finished.is_some() {
            return wait; // shut down: only a later change publishes again
        }
        match publisher.next {
            Some(due) if now < due => return wait.min(due - now),
            _ => publisher.next = Some(now + INTERVAL),
        }
        self.publish_now(&mut publisher);
        wait
    }

    /// Publishes the figures and registers the histograms again, with the current
    /// recorder.
    fn publish_now(&self, publisher: &mut Publisher) {
        self.publish_stats(publisher, self.stats());
    }

    /// [`publish_now`](Self::publish_now) with the figures `stats`.
    fn publish_stats(&self, publisher: &mut Publisher, stats: PurgatoryStats) {
        let label = &publisher.label;
        self.user.call(Site::Recorder, || {
            publish(&label.value, &stats);
            self.metrics.reregister(&label.value);
        });
    }

    /// Shutdown's last step: publishes the final figures. Reaper rounds publish no more;
    /// a change made after this (an answer that was in flight, `publish_if_closed`)
    /// publishes again.
    pub(crate) fn publish_final(&self) {
        let mut publisher = self.metrics.publisher.lock();
        let stats = self.stats();
        publisher.finished = Some(stats);
        let label = &publisher.label;
        self.user
            .call(Site::Recorder, || publish(&label.value, &stats));
    }

    /// After a call that may have changed the figures: if shutdown already published its
    /// final figures and they have changed since the last publish, publishes them again,
    /// so that an answer made after shutdown (a `try_complete` that was running then, or
    /// a completion racing it) reaches them. A call that changed nothing publishes
    /// nothing.
    ///
    /// Why nothing slips through: every count is a `SeqCst` read-modify-write made before
    /// this reads `closed` (`SeqCst`), and shutdown closes (`SeqCst`) before it reads the
    /// counts (`SeqCst`) for its final publish. So either this call sees the purgatory
    /// closed (and publishes after the final publish, under the publisher's lock, or
    /// before it, which then reads this call's counts), or the final publish reads them.
    #[inline]
    pub(crate) fn publish_if_closed(&self) {
        if self.timer.is_shutdown() {
            self.publish_late();
        }
    }

    #[cold]
    #[inline(never)]
    fn publish_late(&self) {
        // Refusals alone do not publish: a service still sending requests to a purgatory
        // it shut down would publish every figure for each. They reach the series with
        // the next change, the next `publish_metrics` (a scrape handler's), or the drop.
        self.publish_if_changed(false);
    }

    /// At the drop of the purgatory's memory: publishes once more if any figure changed
    /// since the last publish after shutdown (refusals included, which
    /// [`publish_late`](Self::publish_late) leaves), so the series keep the final counts.
    pub(crate) fn publish_at_drop(&self) {
        self.publish_if_changed(true);
    }

    /// After shutdown's final publish: publishes the figures if they changed since the
    /// last publish, a change of `refused` alone counting only if `refusals`.
    fn publish_if_changed(&self, refusals: bool) {
        let mut publisher = self.metrics.publisher.lock();
        let Some(last) = publisher.finished else {
            return; // the final publish, still to come, reads this call's counts
        };
        let stats = self.stats();
        let compared = if refusals {
            stats
        } else {
            PurgatoryStats {
                refused: last.refused,
                ..stats
            }
        };
        if compared != last {
            publisher.finished = Some(stats);
            self.publish_stats(&mut publisher, stats);
        }
    }
}

impl<K, O: DelayedOperation> State<K, O> {
    /// Now on the timer's clock, in nanoseconds, for wait times.
    #[inline]
    pub(crate) fn wait_clock(&self) -> u64 {
        u64::try_from(self.timer.now().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records the wait times of operations armed at `since` (nanoseconds on the timer's
    /// clock; [`NOT_ARMED`] ones never waited and are skipped) that ended now, counted as
    /// `count`: one clock read for them all.
    #[inline]
    pub(crate) fn record_waits(&self, since: impl IntoIterator<Item = u64>, count: Count) {
        let Some(outcome) = series::outcome(count) else {
            return;
        };
        let mut since = since.into_iter().filter(|&s| s != NOT_ARMED).peekable();
        if since.peek().is_none() {
            return;
        }
        let now = self.wait_clock();
        self.user.call(Site::Recorder, || {
            self.metrics.with_waits(|waits| {
                for start in since {
                    let waited = Duration::from_nanos(now.saturating_sub(start));
                    waits[outcome].record(waited.as_secs_f64());
                }
            })
        });
    }
}

impl<K, O> Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// Publishes this purgatory's figures ([`stats`](Self::stats)) through the
    /// [`metrics`](::metrics) facade now, and registers its wait-time histograms again
    /// with the current recorder. The reaper does this by itself about once a second;
    /// call it for a purgatory driven without a reaper, or for fresh figures. Shutdown
    /// publishes once more (and the purgatory again after any later change); this still
    /// publishes after shutdown, until the purgatory is dropped. Only with the cargo
    /// feature `metrics`.
    ///
    /// Every metric has the label `purgatory`: the purgatory's [name](Self::name), or
    /// `name#2`, `name#3`, ... for a purgatory built while others of that name were
    /// alive (see below). Counters are published as absolute values:
    ///
    /// | metric | kind | figure of [`PurgatoryStats`] | Kafka |
    /// |---|---|---|---|
    /// | `purgatory_pending` | gauge | `pending`: operations waiting for their timeout | `NumDelayedOperations` |
    /// | `purgatory_watched` | gauge | `watched`: watcher entries, answered ones not yet dropped included | `PurgatorySize` |
    /// | `purgatory_watched_live` | gauge | `watched_live`: watcher entries of operations still waiting | |
    /// | `purgatory_keys` | gauge | `keys`: keys with a watcher list | |
    /// | `purgatory_completed_total` | counter | `completed`: by `try_complete` | |
    /// | `purgatory_forced_total` | counter | `forced`: by `force_complete` | |
    /// | `purgatory_expired_total` | counter | `expired`: by their timeout | |
    /// | `purgatory_shutdown_expired_total` | counter | `expired_at_shutdown`: by shutdown, before their timeout | |
    /// | `purgatory_cancelled_total` | counter | `cancelled`: handed back by a cancel | |
    /// | `purgatory_purged_total` | counter | `purged`: completed entries dropped by purges | |
    /// | `purgatory_refused_total` | counter | `refused`: given back by a watch, never accepted | |
    /// | `purgatory_panicked_total` | counter | `panicked`: user code that panicked, caught | |
    /// | `purgatory_stand_ins_total` | counter | `stand_ins`: reliefs of late expiry by stand-in threads | |
    /// | `purgatory_stand_in_limit_reached_total` | counter | `stand_in_limit_reached`: relief wanted with every stand-in slot taken | |
    /// | `purgatory_wait_seconds` | histogram, label `outcome` | how long each operation waited | |
    ///
    /// `purgatory_wait_seconds` has one sample per operation that was armed (not one
    /// that `try_complete` completed while it was being watched), from its arming to its
    /// end on the timer's clock, with `outcome` one of `ready`, `forced`, `expired`,
    /// `cancelled`, `shutdown`. Its samples are recorded as operations end, into handles
    /// registered when the purgatory was built and again at each publish: a recorder
    /// installed later receives them from the next publish on.
    ///
    /// Two live purgatories never share a label. At shutdown the final figures are
    /// published (and again after an answer made later, by a `try_complete` that was
    /// running then); the label is freed when the purgatory is dropped: its series keep
    /// their last values (the facade cannot remove them) until a later purgatory of that
    /// name takes it over.
    ///
    /// A scrape handler (a Prometheus `/metrics` endpoint) that must show exact figures
    /// calls this before it renders: otherwise what it shows may be up to about a
    /// second old.
    pub fn publish_metrics(&self) {
        let state = self.state();
        state.publish_now(&mut state.metrics.publisher.lock());
    }

    /// The value of the label `purgatory` on this purgatory's series: its
    /// [name](Self::name), or `name#2`, `name#3`, ... if others of that name were alive
    /// when it was built (see [`publish_metrics`](Self::publish_metrics)). For finding
    /// its own series in a scrape, when several purgatories share a name (two services
    /// in one process, or tests). Only with the cargo feature `metrics`.
    pub fn metrics_label(&self) -> String {
        self.state().metrics.publisher.lock().label.value.clone()
    }
}
