//! The purgatory's figures through the [`metrics`](::metrics) facade (cargo feature
//! `metrics`).
//!
//! Kafka reports each purgatory's size and its number of delayed operations as gauges;
//! this module publishes the same figures, and the totals of what happened to
//! operations, to whatever recorder the program installed (a Prometheus exporter, for
//! example), labelled with the purgatory's name. The metrics are listed on
//! [`Purgatory::publish_metrics`](crate::Purgatory::publish_metrics).
//!
//! # When
//! Nothing is counted twice for metrics: the operations' paths only bump the counters
//! that [`Purgatory::stats`](crate::Purgatory::stats) reads anyway. The figures are
//! read and published at the end of a reaper round (or an `advance_clock` call) at most
//! once per [`INTERVAL`], counters as absolute values. A round that skips a publish
//! because the last one was too recent shortens the reaper's next sleep to when the
//! next one is due, so the figures published are never more than about an interval old
//! once the purgatory goes quiet, and an idle purgatory then sleeps without waking.
//! [`Purgatory::publish_metrics`](crate::Purgatory::publish_metrics) publishes at once,
//! for purgatories driven without a reaper or a program that wants fresh figures.
//!
//! Metrics are registered on each publish, so a recorder installed after the purgatory
//! was built receives them from the next publish on; but a purgatory that has been idle
//! since its reaper's first round (which publishes) publishes nothing until it is used.
//! Install the recorder first, or call `publish_metrics`. A recorder that panics on the reaper thread is caught
//! and reported through `tracing`; the reaper goes on.

use std::hash::Hash;
use std::time::{Duration, Instant};

use ::metrics::Label;
use timer_core::NextRound;

use crate::operation::DelayedOperation;
use crate::purgatory::Purgatory;
use crate::state::State;
use crate::stats::PurgatoryStats;

/// Shortest time between two publishes from reaper rounds.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// The label naming the purgatory.
const LABEL: &str = "purgatory";

type Figure = fn(&PurgatoryStats) -> u64;

/// Gauges: name, help text, figure.
const GAUGES: [(&str, &str, Figure); 3] = [
    (
        "purgatory_pending",
        "Operations waiting for their timeout.",
        |s| s.pending as u64,
    ),
    (
        "purgatory_watched",
        "Watcher entries, completed ones not yet dropped included (Kafka's PurgatorySize).",
        |s| s.watched as u64,
    ),
    ("purgatory_keys", "Keys with a watcher list.", |s| {
        s.keys as u64
    }),
];

/// Counters: name, help text, figure.
const COUNTERS: [(&str, &str, Figure); 6] = [
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
        "Operations completed by their timeout or by shutdown.",
        |s| s.expired,
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
        "purgatory_panicked_total",
        "User code that panicked, caught and reported.",
        |s| s.panicked,
    ),
];

/// Publishes `stats` as the figures of the purgatory `name`.
fn publish(name: &str, stats: &PurgatoryStats) {
    let labels = [Label::new(LABEL, name.to_owned())];
    for (metric, help, figure) in GAUGES {
        ::metrics::describe_gauge!(metric, help);
        ::metrics::gauge!(metric, labels.iter()).set(figure(stats) as f64);
    }
    for (metric, help, figure) in COUNTERS {
        ::metrics::describe_counter!(metric, help);
        ::metrics::counter!(metric, labels.iter()).absolute(figure(stats));
    }
}

impl<K: Hash + Eq + Clone, O: DelayedOperation> State<K, O> {
    /// End of a round whose next sleep is `wait`: publishes if the last publish is an
    /// [`INTERVAL`] old, and returns how long the reaper may sleep (see the module doc).
    pub(crate) fn publish_if_due(&self, wait: NextRound) -> NextRound {
        let now = Instant::now();
        {
            // Another thread's round is deciding now: the publish, if due, is its own.
            let Some(mut next) = self.metrics.next.try_lock() else {
                return wait;
            };
            match *next {
                Some(due) if now < due => return wait.min(due - now),
                _ => *next = Some(now + INTERVAL),
            }
        }
        let stats = self.stats();
        crate::panics::caught(
            "the metrics recorder panicked; figures not published",
            || publish(&self.name, &stats),
        );
        wait
    }
}

impl<K, O> Purgatory<K, O>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    O: DelayedOperation,
{
    /// Publishes this purgatory's figures ([`stats`](Self::stats)) through the
    /// [`metrics`](::metrics) facade now. The reaper does this by itself about once a
    /// second; call it for a purgatory driven without a reaper, or for fresh figures.
    /// Only with the cargo feature `metrics`.
    ///
    /// Every metric has the label `purgatory` set to the purgatory's [name](Self::name);
    /// counters are published as absolute values:
    ///
    /// | metric | kind | figure of [`PurgatoryStats`] |
    /// |---|---|---|
    /// | `purgatory_pending` | gauge | `pending`: operations waiting for their timeout |
    /// | `purgatory_watched` | gauge | `watched`: watcher entries (Kafka's `PurgatorySize`) |
    /// | `purgatory_keys` | gauge | `keys`: keys with a watcher list |
    /// | `purgatory_completed_total` | counter | `completed`: by `try_complete` |
    /// | `purgatory_forced_total` | counter | `forced`: by `force_complete` |
    /// | `purgatory_expired_total` | counter | `expired`: by their timeout or shutdown |
    /// | `purgatory_cancelled_total` | counter | `cancelled`: handed back by a cancel |
    /// | `purgatory_purged_total` | counter | `purged`: completed entries dropped by purges |
    /// | `purgatory_panicked_total` | counter | `panicked`: user code that panicked, caught |
    pub fn publish_metrics(&self) {
        publish(self.name(), &self.stats());
    }
}
