//! The cargo feature `metrics`: the figures a purgatory publishes through the `metrics`
//! facade, on demand (`publish_metrics`) and from the reaper (at most about once a
//! second, and once more after the purgatory goes quiet). Run with
//! `cargo test -p kafka-purgatory --features metrics`.
#![cfg(feature = "metrics")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use purgatory::{
    Completion, DelayedOperation, ManualClock, Purgatory, PurgatoryBuilder, TimerBuilder,
    WatchOutcome,
};

/// Completes once `ready` is set; otherwise waits `timeout`.
struct Flagged {
    ready: Arc<AtomicBool>,
    timeout: Duration,
}

impl Flagged {
    fn new(ready: &Arc<AtomicBool>, timeout: Duration) -> Self {
        Flagged {
            ready: Arc::clone(ready),
            timeout,
        }
    }
}

impl DelayedOperation for Flagged {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    fn on_complete(&mut self, _how: Completion) {}
}

/// The figures of the purgatory `name` in one snapshot: metric name to value (gauges as
/// whole numbers). A snapshot resets what it reads.
fn figures(snapshotter: &Snapshotter, name: &str) -> HashMap<String, u64> {
    figures_of(&snapshotter.snapshot().into_vec(), name)
}

/// One snapshot's entries.
type Entries = Vec<(
    metrics_util::CompositeKey,
    Option<Unit>,
    Option<SharedString>,
    DebugValue,
)>;

/// [`figures`] from a snapshot already taken.
fn figures_of(entries: &Entries, name: &str) -> HashMap<String, u64> {
    let mut found = HashMap::new();
    for (key, _, _, value) in entries {
        let labels: Vec<_> = key.key().labels().collect();
        if key.key().name() == "purgatory_wait_seconds" {
            continue;
        }
        if labels.len() != 1 || labels[0].key() != "purgatory" || labels[0].value() != name {
            continue;
        }
        let value = match (key.kind(), value) {
            (MetricKind::Counter, DebugValue::Counter(v)) => *v,
            (MetricKind::Gauge, DebugValue::Gauge(v)) => v.into_inner() as u64,
            other => panic!("unexpected metric {other:?}"),
        };
        found.insert(key.key().name().to_string(), value);
    }
    found
}

#[test]
fn publish_metrics_reports_every_figure_labelled_with_the_purgatory() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let clock = ManualClock::new();
    let purgatory: Purgatory<u32, Flagged> = PurgatoryBuilder::new()
        .name("on-demand")
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .build()
        .unwrap();
    let second = Duration::from_secs(1);
    let handle = |outcome| match outcome {
        Ok(WatchOutcome::Pending(handle)) => handle,
        _ => panic!("the operation must wait"),
    };
    metrics::with_local_recorder(&recorder, || {
        // One completed by an event, one forced, one cancelled, one expired, one left.
        let ready = Arc::new(AtomicBool::new(false));
        let never = Arc::new(AtomicBool::new(false));
        purgatory
            .try_complete_else_watch(Flagged::new(&ready, 10 * second), [1, 2])
            .unwrap();
        let forced = handle(purgatory.watch(Flagged::new(&never, 10 * second), [1]));
        let cancelled = handle(purgatory.watch(Flagged::new(&never, 10 * second), [2]));
        purgatory
            .try_complete_else_watch(Flagged::new(&never, Duration::from_millis(5)), [3])
            .unwrap();
        purgatory
            .try_complete_else_watch(Flagged::new(&never, 10 * second), [4])
            .unwrap();
        ready.store(true, Ordering::Release);
        assert_eq!(purgatory.check_and_complete(&1), 1);
        assert!(purgatory.force_complete(&forced));
        assert!(purgatory.cancel(&cancelled).is_some());
        clock.advance(Duration::from_millis(20));
        purgatory.advance_clock(Duration::ZERO);
        purgatory.publish_metrics();
    });
    let stats = purgatory.stats();
    assert_eq!(
        (
            stats.completed,
            stats.forced,
            stats.cancelled,
            stats.expired
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(stats.pending, 1);
    let expected: HashMap<String, u64> = [
        ("purgatory_pending", stats.pending as u64),
        ("purgatory_watched", stats.watched as u64),
        ("purgatory_watched_live", stats.watched_live as u64),
        ("purgatory_keys", stats.keys as u64),
        ("purgatory_completed_total", stats.completed),
        ("purgatory_forced_total", stats.forced),
        ("purgatory_expired_total", stats.expired),
        (
            "purgatory_shutdown_expired_total",
            stats.expired_at_shutdown,
        ),
        ("purgatory_cancelled_total", stats.cancelled),
        ("purgatory_purged_total", stats.purged),
        ("purgatory_refused_total", stats.refused),
        ("purgatory_panicked_total", stats.panicked),
        ("purgatory_stand_ins_total", stats.stand_ins),
        (
            "purgatory_stand_in_limit_reached_total",
            stats.stand_in_limit_reached,
        ),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    assert_eq!(figures(&snapshotter, "on-demand"), expected);
}

/// A recorder that counts how often each purgatory's figures were published (by its
/// `purgatory_pending` gauge being looked up) and hands everything to a
/// [`DebuggingRecorder`].
struct CountingPublishes {
    inner: DebuggingRecorder,
    publishes: Mutex<HashMap<String, usize>>,
}

impl Recorder for CountingPublishes {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description)
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description)
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description)
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.inner.register_counter(key, metadata)
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if key.name() == "purgatory_pending" {
            for label in key.labels() {
                let mut publishes = self.publishes.lock().unwrap();
                *publishes.entry(label.value().to_string()).or_default() += 1;
            }
        }
        self.inner.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

/// The global recorder of this test binary, installed by the first test that needs it.
fn global() -> &'static (Snapshotter, Arc<CountingPublishes>) {
    static GLOBAL: OnceLock<(Snapshotter, Arc<CountingPublishes>)> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let inner = DebuggingRecorder::new();
        let snapshotter = inner.snapshotter();
        let recorder = Arc::new(CountingPublishes {
            inner,
            publishes: Mutex::new(HashMap::new()),
        });
        metrics::set_global_recorder(Arc::clone(&recorder)).expect("the only global recorder");
        (snapshotter, recorder)
    })
}

fn publishes(purgatory: &str) -> usize {
    let counts = global().1.publishes.lock().unwrap();
    counts.get(purgatory).copied().unwrap_or(0)
}

/// Waits (at most 10 s) until the figures of `purgatory` published by its reaper show
/// `expired` expired and `completed` completed operations.
fn wait_for_figures(purgatory: &str, expired: u64, completed: u64) {
    // Other tests' snapshots reset what they read, so keep the largest value seen.
    let started = Instant::now();
    let mut seen: HashMap<String, u64> = HashMap::new();
    loop {
        for (name, value) in figures(&global().0, purgatory) {
            let entry = seen.entry(name).or_default();
            *entry = (*entry).max(value);
        }
        let figure = |name: &str| seen.get(name).copied().unwrap_or(0);
        if figure("purgatory_expired_total") == expired
            && figure("purgatory_completed_total") == completed
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{purgatory}: the figures never arrived: {seen:?} (want {expired} expired, \
             {completed} completed)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_quiet_purgatory_publishes_its_last_figures_within_about_a_second() {
    global();
    let purgatory: Purgatory<u32, Flagged> = Purgatory::new("quiet");
    let never = Arc::new(AtomicBool::new(false));
    // The reaper published at its start; the expiry comes before the next publish is
    // due, and after it nothing is pending: the reaper must still wake to publish it.
    purgatory
        .try_complete_else_watch(Flagged::new(&never, Duration::from_millis(20)), [1])
        .unwrap();
    let started = Instant::now();
    wait_for_figures("quiet", 1, 0);
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "published after {waited:?}"
    );
    // Then the reaper sleeps without publishing.
    let count = publishes("quiet");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        publishes("quiet"),
        count,
        "an idle purgatory kept publishing"
    );
}

#[test]
fn a_busy_reaper_publishes_at_most_about_once_a_second() {
    global();
    let purgatory: Purgatory<u32, Flagged> = Purgatory::new("busy");
    let started = Instant::now();
    let never = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicBool::new(false));
    // Busy for about 1.5 s: timeouts of 2 ms keep the reaper's rounds coming.
    let mut watched = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        purgatory
            .try_complete_else_watch(
                Flagged::new(&never, Duration::from_millis(2)),
                [watched % 8],
            )
            .unwrap();
        watched += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    purgatory
        .try_complete_else_watch(Flagged::new(&ready, Duration::from_secs(60)), [100])
        .unwrap();
    ready.store(true, Ordering::Release);
    assert_eq!(purgatory.check_and_complete(&100), 1);
    wait_for_figures("busy", u64::from(watched), 1);
    let elapsed = started.elapsed().as_secs_f64();
    let count = publishes("busy");
    // One at the reaper's start, then at most one a second (with a little slack).
    assert!(
        count as f64 <= elapsed + 2.0,
        "{count} publishes in {elapsed:.1} s"
    );
    assert!(count >= 2, "{count} publishes in {elapsed:.1} s");
}

/// The wait-time samples of the series `label` in one snapshot, by outcome, sorted (in
/// seconds). A snapshot drains what it reads.
fn waits(snapshotter: &Snapshotter, label: &str) -> HashMap<String, Vec<f64>> {
    waits_of(&snapshotter.snapshot().into_vec(), label)
}

/// [`waits`] from a snapshot already taken.
fn waits_of(entries: &Entries, label: &str) -> HashMap<String, Vec<f64>> {
    let mut found: HashMap<String, Vec<f64>> = HashMap::new();
    for (key, unit, _, value) in entries {
        if key.key().name() != "purgatory_wait_seconds" {
            continue;
        }
        let labels: HashMap<_, _> = key
            .key()
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        if labels.get("purgatory").map(String::as_str) != Some(label) {
            continue;
        }
        assert_eq!(*unit, Some(Unit::Seconds));
        let DebugValue::Histogram(samples) = value else {
            panic!("a histogram: {value:?}");
        };
        let mut samples: Vec<f64> = samples.iter().map(|s| s.into_inner()).collect();
        samples.sort_by(f64::total_cmp);
        if !samples.is_empty() {
            found.insert(labels["outcome"].clone(), samples);
        }
    }
    found
}

/// A purgatory on a manual clock without a reaper, built with `recorder` current.
fn manual(recorder: &DebuggingRecorder, name: &str) -> (Purgatory<u32, Flagged>, ManualClock) {
    manual_with(recorder, name)
}

/// [`manual`] for operations of type `O`.
fn manual_with<O: DelayedOperation>(
    recorder: &DebuggingRecorder,
    name: &str,
) -> (Purgatory<u32, O>, ManualClock) {
    let clock = ManualClock::new();
    let purgatory = metrics::with_local_recorder(recorder, || {
        PurgatoryBuilder::new()
            .name(name)
            .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
            .build()
            .unwrap()
    });
    (purgatory, clock)
}

fn pending<O: DelayedOperation>(
    outcome: Result<WatchOutcome<O>, purgatory::WatchError<O>>,
) -> purgatory::OperationHandle<O> {
    match outcome {
        Ok(WatchOutcome::Pending(handle)) => handle,
        _ => panic!("the operation must wait"),
    }
}

#[test]
fn wait_times_are_sampled_by_outcome_on_the_timer_clock() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (purgatory, clock) = manual(&recorder, "waits");
    // Every call with the recorder current: a publish (the first `advance_clock` round
    // publishes) registers the histograms again with the recorder current then.
    metrics::with_local_recorder(&recorder, || sample_every_outcome(&purgatory, &clock));
    let expected: HashMap<String, Vec<f64>> = [
        ("ready", vec![3.0]),
        ("forced", vec![5.0]),
        ("cancelled", vec![7.0, 7.0]),
        ("expired", vec![10.0]),
        ("shutdown", vec![10.0]),
    ]
    .into_iter()
    .map(|(outcome, samples)| (outcome.to_string(), samples))
    .collect();
    assert_eq!(waits(&snapshotter, "waits"), expected);
    let stats = purgatory.stats();
    assert_eq!(
        (stats.completed, stats.expired, stats.expired_at_shutdown),
        (2, 1, 1)
    );
}

/// The operations of the test above: one completed at once (not sampled), then, from 0 s,
/// ready at 3 s, forced at 5 s, two cancelled at 7 s, one expired at 10 s, and one
/// watched at 2 s and expired by shutdown at 12 s.
fn sample_every_outcome(purgatory: &Purgatory<u32, Flagged>, clock: &ManualClock) {
    let second = Duration::from_secs(1);
    let ready = Arc::new(AtomicBool::new(false));
    let never = Arc::new(AtomicBool::new(false));
    let at_once = Arc::new(AtomicBool::new(true));
    // Completed while being watched: never waited, not sampled.
    assert!(purgatory
        .try_complete_else_watch(Flagged::new(&at_once, 10 * second), [9])
        .unwrap());
    // At 0 s: one ready by an event, one forced, one cancelled, one cancelled by key, one
    // expiring at 10 s; at 2 s, one left for shutdown.
    purgatory
        .try_complete_else_watch(Flagged::new(&ready, 100 * second), [1])
        .unwrap();
    let forced = pending(purgatory.watch(Flagged::new(&never, 100 * second), [2]));
    let cancelled = pending(purgatory.watch(Flagged::new(&never, 100 * second), [3]));
    purgatory
        .try_complete_else_watch(Flagged::new(&never, 100 * second), [4])
        .unwrap();
    purgatory
        .try_complete_else_watch(Flagged::new(&never, 10 * second), [5])
        .unwrap();
    clock.advance(2 * second);
    purgatory
        .try_complete_else_watch(Flagged::new(&never, 100 * second), [6])
        .unwrap();
    clock.advance(second); // 3 s
    ready.store(true, Ordering::Release);
    assert_eq!(purgatory.check_and_complete(&1), 1);
    clock.advance(2 * second); // 5 s
    assert!(purgatory.force_complete(&forced));
    clock.advance(2 * second); // 7 s
    assert!(purgatory.cancel(&cancelled).is_some());
    assert_eq!(purgatory.cancel_for_key(&4).len(), 1);
    clock.advance(3 * second); // 10 s
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
    clock.advance(2 * second); // 12 s
    purgatory.shutdown();
}

#[test]
fn shutdown_expiries_are_counted_apart_and_published_last() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (purgatory, clock) = manual(&recorder, "closing");
    let never = Arc::new(AtomicBool::new(false));
    for (key, timeout) in [(1, 1), (2, 60), (3, 60)] {
        purgatory
            .try_complete_else_watch(
                Flagged::new(&never, Duration::from_secs(timeout)),
                [key, 10],
            )
            .unwrap();
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
    metrics::with_local_recorder(&recorder, || purgatory.shutdown());
    let stats = purgatory.stats();
    assert_eq!((stats.expired, stats.expired_at_shutdown), (1, 2));
    // Shutdown published the final figures by itself.
    let last = figures(&snapshotter, "closing");
    let figure = |name: &str| last.get(name).copied();
    assert_eq!(figure("purgatory_expired_total"), Some(1));
    assert_eq!(figure("purgatory_shutdown_expired_total"), Some(2));
    assert_eq!(
        (
            figure("purgatory_pending"),
            figure("purgatory_watched"),
            figure("purgatory_watched_live"),
            figure("purgatory_keys")
        ),
        (Some(0), Some(0), Some(0), Some(0))
    );
    // Published again on demand, the same figures, under the same label: the label is
    // the purgatory's until it is dropped.
    metrics::with_local_recorder(&recorder, || purgatory.publish_metrics());
    assert_eq!(figures(&snapshotter, "closing"), last);
}

#[test]
fn purgatories_of_one_name_alive_together_publish_distinct_series() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let name = "twin";
    let never = Arc::new(AtomicBool::new(false));
    let watch = |purgatory: &Purgatory<u32, Flagged>, n: u32| {
        for key in 0..n {
            purgatory
                .try_complete_else_watch(Flagged::new(&never, Duration::from_secs(60)), [key])
                .unwrap();
        }
    };
    let (first, _) = manual(&recorder, name);
    let (second, _) = manual(&recorder, name);
    assert_eq!((first.name(), second.name()), (name, name));
    // What each was labelled, for a user finding its own series.
    assert_eq!(
        (first.metrics_label(), second.metrics_label()),
        (name.to_string(), "twin#2".to_string())
    );
    watch(&first, 1);
    watch(&second, 2);
    metrics::with_local_recorder(&recorder, || {
        first.publish_metrics();
        second.publish_metrics();
    });
    let snapshot_pending = |label: &str| {
        figures(&snapshotter, label)
            .get("purgatory_pending")
            .copied()
    };
    // One snapshot drains everything: read both series from it.
    let all: Vec<_> = snapshotter.snapshot().into_vec();
    let pending_of = |label: &str| {
        all.iter()
            .find(|(key, _, _, _)| {
                key.key().name() == "purgatory_pending"
                    && key.key().labels().any(|l| l.value() == label)
            })
            .map(|(_, _, _, value)| match value {
                DebugValue::Gauge(v) => v.into_inner() as u64,
                other => panic!("a gauge: {other:?}"),
            })
    };
    assert_eq!(pending_of(name), Some(1), "the first keeps the bare name");
    assert_eq!(pending_of("twin#2"), Some(2), "the second is told apart");
    // The first shuts down (its final figures under its label, which it keeps while it
    // lives: a third of the name is told apart); dropped, it frees the label, which a
    // fourth takes, and the second keeps its own.
    metrics::with_local_recorder(&recorder, || first.shutdown());
    assert_eq!(snapshot_pending(name), Some(0), "final figures");
    let (third, _) = manual(&recorder, name);
    watch(&third, 3);
    metrics::with_local_recorder(&recorder, || third.publish_metrics());
    assert_eq!(
        snapshot_pending("twin#3"),
        Some(3),
        "the label is kept after shutdown"
    );
    drop(first);
    let (fourth, _) = manual(&recorder, name);
    watch(&fourth, 4);
    metrics::with_local_recorder(&recorder, || fourth.publish_metrics());
    assert_eq!(snapshot_pending(name), Some(4), "the freed label is reused");
    metrics::with_local_recorder(&recorder, || second.publish_metrics());
    assert_eq!(snapshot_pending("twin#2"), Some(2));
}

/// Built with no recorder current: its wait samples reach a recorder from the first
/// publish made with that recorder current, not before.
#[test]
fn wait_samples_reach_a_recorder_installed_later_from_the_next_publish() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let clock = ManualClock::new();
    let purgatory: Purgatory<u32, Flagged> = PurgatoryBuilder::new()
        .name("later")
        .timer(TimerBuilder::new().clock(clock.clone()).reaper(false))
        .build()
        .unwrap();
    let never = Arc::new(AtomicBool::new(false));
    let forced_after = |waited: u64| {
        let handle = pending(purgatory.watch(Flagged::new(&never, Duration::from_secs(60)), [1]));
        clock.advance(Duration::from_secs(waited));
        assert!(purgatory.force_complete(&handle));
    };
    metrics::with_local_recorder(&recorder, || {
        forced_after(1); // before any publish with this recorder: lost
        purgatory.publish_metrics();
        forced_after(2);
    });
    forced_after(4); // the handles keep the recorder of the last publish
    let samples = waits(&snapshotter, "later");
    assert_eq!(samples.get("forced"), Some(&vec![2.0, 4.0]), "{samples:?}");
}

/// A batch big enough for the chunk path (32 and more) arms its operations at one clock
/// read: each waits from there.
#[test]
fn a_batch_watch_samples_each_operations_wait() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (purgatory, clock) = manual(&recorder, "batch");
    let never = Arc::new(AtomicBool::new(false));
    metrics::with_local_recorder(&recorder, || {
        let handles: Vec<_> = purgatory
            .watch_batch((0..40).map(|i| (Flagged::new(&never, Duration::from_secs(60)), [i])))
            .into_iter()
            .map(pending)
            .collect();
        clock.advance(Duration::from_millis(4_500));
        assert_eq!(purgatory.force_complete_batch(&handles), 40);
    });
    let samples = waits(&snapshotter, "batch");
    assert_eq!(samples.get("forced"), Some(&vec![4.5; 40]), "{samples:?}");
}

/// Blocks in `try_complete`, once `gated`, until released with a verdict.
struct Gated {
    gated: Arc<AtomicBool>,
    entered: std::sync::mpsc::Sender<()>,
    verdict: Arc<Mutex<std::sync::mpsc::Receiver<bool>>>,
}

impl DelayedOperation for Gated {
    fn timeout(&self) -> Duration {
        Duration::from_millis(50)
    }
    fn try_complete(&mut self) -> bool {
        if !self.gated.load(Ordering::SeqCst) {
            return false;
        }
        let _ = self.entered.send(());
        self.verdict.lock().unwrap().recv().unwrap_or(false)
    }
    fn on_complete(&mut self, _how: Completion) {}
}

/// Issue #27, finding 5: an operation whose `try_complete` was running when shutdown
/// came (its timeout fired meanwhile, or shutdown drained its timer, and left it to that
/// thread) is answered after shutdown returned: its count and its wait sample must still
/// reach the published figures, as the timeout's or shutdown's (issue #28) expiry.
#[test]
fn answers_made_after_shutdown_reach_the_published_figures() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    for (ready, timed_out) in [(false, true), (true, true), (false, false)] {
        let name = format!("late-answer-{ready}-{timed_out}");
        let (purgatory, clock) = manual_with::<Gated>(&recorder, &name);
        let gated = Arc::new(AtomicBool::new(false));
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, verdict) = std::sync::mpsc::channel();
        let op = Gated {
            gated: Arc::clone(&gated),
            entered: entered_tx,
            verdict: Arc::new(Mutex::new(verdict)),
        };
        assert!(!purgatory.try_complete_else_watch(op, [1]).unwrap());
        gated.store(true, Ordering::SeqCst);
        std::thread::scope(|s| {
            // Every thread publishes to this test's recorder.
            let checker = s.spawn(|| {
                metrics::with_local_recorder(&recorder, || purgatory.check_and_complete(&1))
            });
            entered.recv().unwrap();
            metrics::with_local_recorder(&recorder, || {
                // Its timeout fires while the checker holds it (or not yet: shutdown drains
                // it); shutdown leaves it there.
                if timed_out {
                    clock.advance(Duration::from_millis(50));
                    assert_eq!(purgatory.advance_clock(Duration::ZERO), 1);
                }
                purgatory.shutdown();
            });
            release.send(ready).unwrap();
            assert_eq!(checker.join().unwrap(), usize::from(ready));
        });
        let stats = purgatory.stats();
        // A timeout that came before the shutdown is a timeout's, answered after it.
        let (timeout, drained) = (!ready && timed_out, !ready && !timed_out);
        assert_eq!(
            (stats.completed, stats.expired, stats.expired_at_shutdown),
            (u64::from(ready), u64::from(timeout), u64::from(drained)),
            "{stats:?}"
        );
        // One snapshot: a snapshot drains what it reads.
        let snapshot = snapshotter.snapshot().into_vec();
        let samples = waits_of(&snapshot, &name);
        let published = figures_of(&snapshot, &name);
        let figure = |metric: &str| published.get(metric).copied();
        assert_eq!(
            (
                figure("purgatory_completed_total"),
                figure("purgatory_expired_total"),
                figure("purgatory_shutdown_expired_total")
            ),
            (
                Some(stats.completed),
                Some(stats.expired),
                Some(stats.expired_at_shutdown)
            ),
            "published after the late answer: {published:?}"
        );
        let outcome = match (ready, timed_out) {
            (true, _) => "ready",
            (false, true) => "expired",
            (false, false) => "shutdown",
        };
        assert_eq!(
            samples.get(outcome).map(Vec::len),
            Some(1),
            "the late answer's wait sample: {samples:?}"
        );
    }
}

/// After shutdown's final publish, a call publishes again only if it changed the
/// figures: calls refused or changing nothing (a service still sending events to a
/// purgatory it shut down) publish nothing, where each used to publish everything again.
#[test]
fn calls_after_shutdown_that_change_nothing_publish_nothing() {
    global();
    let name = "after-shutdown-quiet";
    let purgatory: Purgatory<u32, Flagged> = Purgatory::new(name);
    let never = Arc::new(AtomicBool::new(false));
    purgatory.shutdown();
    let count = publishes(name);
    assert!(count > 0, "shutdown published its final figures");
    for key in 0..100 {
        let refused =
            purgatory.try_complete_else_watch(Flagged::new(&never, Duration::from_secs(60)), [key]);
        assert!(refused.is_err());
        assert_eq!(purgatory.check_and_complete(&key), 0);
        assert!(purgatory.cancel_for_key(&key).is_empty());
        purgatory.purge();
    }
    assert_eq!(
        publishes(name),
        count,
        "calls that changed nothing published again"
    );
    // Counted all the same, and published once more by the drop.
    assert_eq!(purgatory.stats().refused, 100);
    drop(purgatory);
    assert_eq!(
        publishes(name),
        count + 1,
        "the drop publishes the refusals"
    );
}
