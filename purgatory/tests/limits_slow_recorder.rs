//! Where the on-time promise is strained (`docs/purgatory.md`, "Isolation"): a metrics
//! recorder that takes 0.5 ms a sample, with ten expiries a millisecond, each recording
//! its wait: five threads' worth of waiting, which relief spreads over stand-ins one
//! look at a time while every thread moves.
//!
//! A measurement, not a bound (it needs the recorder as the process's global one, so a
//! binary of its own): ignored by default; run it to print the figures the docs quote:
//!
//! ```text
//! cargo test --release -p kafka-purgatory --features metrics --test limits_slow_recorder -- --ignored --nocapture
//! ```
//!
//! It checks what holds whatever the recorder does: every operation answered once.

#![cfg(feature = "metrics")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{
    Counter, Gauge, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use purgatory::{Completion, DelayedOperation, Purgatory};

/// A histogram that takes 0.5 ms a sample.
struct Slow;

impl HistogramFn for Slow {
    fn record(&self, _value: f64) {
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// A recorder whose histograms are slow.
struct SlowRecorder;

impl Recorder for SlowRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Slow))
    }
}

/// Its deadline and when its expiry began.
type Answers = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// Never ready; records when its `on_expiration` began.
struct Op {
    timeout: Duration,
    deadline: Instant,
    answers: Answers,
}

impl DelayedOperation for Op {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        false
    }
    fn on_complete(&mut self, _how: Completion) {}
    fn on_expiration(&mut self) {
        self.answers
            .lock()
            .unwrap()
            .push((self.deadline, Instant::now()));
    }
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn expiries_beside_a_slow_recorder() {
    metrics::set_global_recorder(SlowRecorder).expect("the only recorder");
    let purgatory: Purgatory<u64, Op> = Purgatory::new("slow-recorder");
    let answers: Answers = Arc::default();
    // 2,000 operations due over 200 ms, ten a millisecond.
    for i in 0..2_000u64 {
        let timeout = Duration::from_millis(10 + i / 10);
        let op = Op {
            timeout,
            deadline: Instant::now() + timeout,
            answers: Arc::clone(&answers),
        };
        assert!(!purgatory.try_complete_else_watch(op, [i]).unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while answers.lock().unwrap().len() < 2_000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let answers = answers.lock().unwrap().clone();
    assert_eq!(answers.len(), 2_000, "every operation answered once");
    let mut late: Vec<Duration> = answers
        .iter()
        .map(|(deadline, at)| at.saturating_duration_since(*deadline))
        .collect();
    late.sort();
    println!(
        "a recorder of 0.5 ms a sample, ten expiries a millisecond: late p50 {:?}, p99 {:?}, worst {:?}; {:?}",
        late[late.len() / 2],
        late[late.len() * 99 / 100],
        late[late.len() - 1],
        purgatory.stats()
    );
    purgatory.shutdown();
}
