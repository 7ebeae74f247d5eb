//! One purgatory's series in the metrics recorder (cargo feature `metrics`): the label
//! that names them, when the reaper publishes next, and the wait-time histogram handles
//! that completions record into. What is published, and when, is `metrics.rs`'s.
//!
//! # Invariants
//! - No two live purgatories have the same label: the first purgatory of a name is
//!   labelled with the name, the next ones built while it lives `name#2`, `name#3`, ...
//!   (the lowest number no live purgatory of that name has). A label is freed when the
//!   purgatory's state is dropped (its last handle is gone; on a `TimerGroup`, the group
//!   too, which holds its members), not at shutdown: an answer
//!   made after shutdown (a `try_complete` that was running then, see `slot.rs`) is still
//!   counted and published under it, and its wait sampled. The next purgatory of that
//!   name may then take it.
//! - Nothing is published or recorded under a freed label by the purgatory that freed
//!   it: the label is freed in the series' drop, after [`Series::release`] set the
//!   histogram handles to no-ops.
//! - The histogram handles are held per stripe of threads (the counters' stripes), so a
//!   completion locks only its own thread's stripe. They are registered when the
//!   purgatory is built, with the recorder current on the building thread, and again at
//!   every publish (every stripe replaced), so a recorder installed later receives the
//!   samples taken from the next publish on.
//!
//! # Lock order
//! The publisher's lock is taken before everything else (publishing reads the figures,
//! which flushes the cancel queues); a stripe's lock and the registry of labels are leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex as StdMutex;
use std::time::Instant;

use ::metrics::{Histogram, Label, Unit};

use crate::counters::{stripe_index, Count, STRIPES};
use crate::stats::PurgatoryStats;
use crate::user_code::{Site, UserCode};

/// The histogram of wait times.
pub(crate) const WAIT: &str = "purgatory_wait_seconds";

/// The label naming the purgatory.
pub(crate) const PURGATORY: &str = "purgatory";

/// The label naming an outcome of the wait-time histogram.
pub(crate) const OUTCOME: &str = "outcome";

/// The outcomes of the wait-time histogram, in the order of [`outcome`].
pub(crate) const OUTCOMES: [&str; 5] = ["ready", "forced", "expired", "cancelled", "shutdown"];

/// The index in [`OUTCOMES`] of a completion counted as `count`; `None` for counts that
/// are not completions.
#[inline]
pub(crate) fn outcome(count: Count) -> Option<usize> {
    match count {
        Count::Completed => Some(0),
        Count::Forced => Some(1),
        Count::Expired => Some(2),
        Count::Cancelled => Some(3),
        Count::ShutdownExpired => Some(4),
        Count::Purged | Count::Refused | Count::Accepted => None,
    }
}

/// The numbers (1 for the bare name) of the labels of live purgatories, by name.
static LIVE: StdMutex<BTreeMap<String, BTreeSet<u32>>> = StdMutex::new(BTreeMap::new());

type Waits = [Histogram; OUTCOMES.len()];

/// One stripe's histogram handles, on a cache line pair of its own.
#[repr(align(128))]
struct WaitStripe(parking_lot::Mutex<Waits>);

/// The label of one purgatory's series.
pub(crate) struct SeriesLabel {
    name: String,
    number: u32,
    /// `name`, or `name#number`.
    pub(crate) value: String,
}

/// What the publisher's lock guards.
pub(crate) struct Publisher {
    /// The series' label, freed when the series is dropped.
    pub(crate) label: SeriesLabel,
    /// When the reaper's rounds publish next (`None`: at the next round).
    pub(crate) next: Option<Instant>,
    /// Once shutdown published its final figures, the figures last published: from
    /// then on only a change to them publishes again (`metrics.rs`, `publish_if_closed`).
    pub(crate) finished: Option<PurgatoryStats>,
}

pub(crate) struct Series {
    pub(crate) publisher: parking_lot::Mutex<Publisher>,
    waits: [WaitStripe; STRIPES],
}

impl Series {
    /// The series of a new purgatory named `name`: takes the lowest free label of that
    /// name and registers its histograms with the current recorder.
    pub(crate) fn new(name: &str, user: &UserCode) -> Self {
        let label = take_label(name);
        // A recorder that panics here leaves no-op handles, until the next publish
        // registers them again.
        let waits = user
            .call(Site::Recorder, || register(&label.value))
            .unwrap_or_else(|| std::array::from_fn(|_| Histogram::noop()));
        Series {
            publisher: parking_lot::Mutex::new(Publisher {
                label,
                next: None,
                finished: None,
            }),
            waits: std::array::from_fn(|_| WaitStripe(parking_lot::Mutex::new(waits.clone()))),
        }
    }

    /// Runs `f` on the calling thread's histogram handles.
    #[inline]
    pub(crate) fn with_waits<R>(&self, f: impl FnOnce(&Waits) -> R) -> R {
        f(&self.waits[stripe_index()].0.lock())
    }

    /// Registers the histograms of `label` with the current recorder and hands them to
    /// every stripe.
    pub(crate) fn reregister(&self, label: &str) {
        self.replace(&register(label));
    }

    fn replace(&self, waits: &Waits) {
        for stripe in &self.waits {
            stripe.0.lock().clone_from(waits);
        }
    }

    /// The purgatory is being dropped: stops recording (the handles become no-ops; the
    /// recorder's code runs as the old ones are dropped, through the door) before the
    /// series' drop frees the label.
    pub(crate) fn release(&self, user: &UserCode) {
        user.call(Site::Recorder, || {
            self.replace(&std::array::from_fn(|_| Histogram::noop()))
        });
    }
}

impl Drop for Series {
    fn drop(&mut self) {
        free_label(&self.publisher.get_mut().label);
    }
}

/// The histogram handles of the series `label`, one per outcome, from the current
/// recorder.
fn register(label: &str) -> Waits {
    ::metrics::describe_histogram!(
        WAIT,
        Unit::Seconds,
        "How long operations waited, from their timeout being armed to their end, by outcome."
    );
    OUTCOMES.map(|outcome| {
        let labels = [
            Label::new(PURGATORY, label.to_owned()),
            Label::new(OUTCOME, outcome),
        ];
        ::metrics::histogram!(WAIT, labels.iter())
    })
}

fn take_label(name: &str) -> SeriesLabel {
    let mut live = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let numbers = live.entry(name.to_owned()).or_default();
    let number = (1..)
        .find(|n| !numbers.contains(n))
        .expect("fewer than 2^32 live purgatories of one name");
    numbers.insert(number);
    let value = if number == 1 {
        name.to_owned()
    } else {
        format!("{name}#{number}")
    };
    SeriesLabel {
        name: name.to_owned(),
        number,
        value,
    }
}

fn free_label(label: &SeriesLabel) {
    let mut live = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(numbers) = live.get_mut(&label.name) {
        numbers.remove(&label.number);
        if numbers.is_empty() {
            live.remove(&label.name);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn live_labels_of_one_name_are_distinct_and_freed_ones_reused() {
        let name = "series-unit-test";
        let a = take_label(name);
        let b = take_label(name);
        let c = take_label(name);
        assert_eq!(
            [&a.value, &b.value, &c.value],
            [name, &format!("{name}#2"), &format!("{name}#3")]
        );
        free_label(&b);
        let d = take_label(name);
        assert_eq!(d.value, format!("{name}#2"), "the lowest free number");
        for label in [a, c, d] {
            free_label(&label);
        }
        let again = take_label(name);
        assert_eq!(again.value, name, "all freed");
        free_label(&again);
    }
}
