//! The test's user code, every method of which is a fault point ([`point`]): a key, an
//! operation (the probe of `probe/mod.rs`, wrapped), a clock, a metrics recorder and a
//! tracing subscriber. Each does its work first, then passes the point (so an injected
//! panic comes after the work, as a panic at the end of user code would).

use std::hash::{Hash, Hasher};
use std::time::Duration;

use purgatory::{Clock, Completion, DelayedOperation, ManualClock};

use super::injector::{point, Kind};
use crate::probe::Probe;

/// A key: its `Hash`, `Eq`, `Clone` and `Drop` are fault points.
#[derive(Debug)]
pub struct Key(pub u32);

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        point(Kind::KeyHash);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        let equal = self.0 == other.0;
        point(Kind::KeyEq);
        equal
    }
}

impl Eq for Key {}

impl Clone for Key {
    fn clone(&self) -> Self {
        let key = Key(self.0);
        point(Kind::KeyClone);
        key
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        point(Kind::KeyDrop);
    }
}

/// An operation: the probe, whose ledger records every callback, with every method a
/// fault point (its drop too: the probe inside is dropped, and recorded, either way), and
/// something more its `on_complete` may do (a scenario's).
pub struct Faulty(pub Probe, pub Option<Box<dyn FnOnce() + Send>>);

impl std::fmt::Debug for Faulty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl DelayedOperation for Faulty {
    fn timeout(&self) -> Duration {
        let timeout = self.0.timeout();
        point(Kind::Timeout);
        timeout
    }
    fn try_complete(&mut self) -> bool {
        let ready = self.0.try_complete();
        point(Kind::TryComplete);
        ready
    }
    fn on_complete(&mut self, how: Completion) {
        self.0.on_complete(how);
        if let Some(then) = self.1.take() {
            then();
        }
        point(Kind::OnComplete);
    }
    fn on_expiration(&mut self) {
        self.0.on_expiration();
        point(Kind::OnExpiration);
    }
}

impl Drop for Faulty {
    fn drop(&mut self) {
        point(Kind::OperationDrop);
    }
}

/// A clock: a manual clock whose every read is a fault point.
#[derive(Clone, Debug)]
pub struct FaultyClock(pub ManualClock);

impl Clock for FaultyClock {
    fn now(&self) -> Duration {
        let now = self.0.now();
        point(Kind::Clock);
        now
    }
}

/// A metrics recorder: a debugging recorder whose registrations, descriptions and
/// handles' updates are fault points (feature `metrics`). Installed once for the process;
/// each run swaps in a fresh debugging recorder ([`FaultyRecorder::fresh`]), so that a
/// run's snapshot reads only its own series (thousands of runs' series in one recorder
/// made every publish and snapshot slower than the last).
#[cfg(feature = "metrics")]
pub mod recorder {
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
        Recorder, SharedString, Unit,
    };
    use metrics_util::debugging::DebuggingRecorder;

    use super::{point, Kind};

    #[derive(Default)]
    pub struct FaultyRecorder(Mutex<Arc<DebuggingRecorder>>);

    impl FaultyRecorder {
        /// Swaps in a fresh debugging recorder; its snapshotter.
        pub fn fresh(&self) -> metrics_util::debugging::Snapshotter {
            let recorder = Arc::new(DebuggingRecorder::new());
            let snapshotter = recorder.snapshotter();
            *self.0.lock().unwrap() = recorder;
            snapshotter
        }

        fn inner(&self) -> Arc<DebuggingRecorder> {
            Arc::clone(&self.0.lock().unwrap())
        }
    }

    struct Wrapped<T>(T);

    impl CounterFn for Wrapped<Counter> {
        fn increment(&self, value: u64) {
            self.0.increment(value);
            point(Kind::Recorder);
        }
        fn absolute(&self, value: u64) {
            self.0.absolute(value);
            point(Kind::Recorder);
        }
    }

    impl GaugeFn for Wrapped<Gauge> {
        fn increment(&self, value: f64) {
            self.0.increment(value);
            point(Kind::Recorder);
        }
        fn decrement(&self, value: f64) {
            self.0.decrement(value);
            point(Kind::Recorder);
        }
        fn set(&self, value: f64) {
            self.0.set(value);
            point(Kind::Recorder);
        }
    }

    impl HistogramFn for Wrapped<Histogram> {
        fn record(&self, value: f64) {
            self.0.record(value);
            point(Kind::Recorder);
        }
    }

    impl Recorder for FaultyRecorder {
        fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
            self.inner().describe_counter(key, unit, description);
            point(Kind::Recorder);
        }
        fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
            self.inner().describe_gauge(key, unit, description);
            point(Kind::Recorder);
        }
        fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
            self.inner().describe_histogram(key, unit, description);
            point(Kind::Recorder);
        }
        fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
            let inner = self.inner().register_counter(key, metadata);
            point(Kind::Recorder);
            Counter::from_arc(Arc::new(Wrapped(inner)))
        }
        fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
            let inner = self.inner().register_gauge(key, metadata);
            point(Kind::Recorder);
            Gauge::from_arc(Arc::new(Wrapped(inner)))
        }
        fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
            let inner = self.inner().register_histogram(key, metadata);
            point(Kind::Recorder);
            Histogram::from_arc(Arc::new(Wrapped(inner)))
        }
    }
}
