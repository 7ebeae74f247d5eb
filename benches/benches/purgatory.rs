//! Criterion benches of the purgatory's two completion paths, ours vs the naive
//! baseline and the two tokio peers (`tokio-task`, `tokio-delayqueue`) in the same run,
//! at 1 and 2 threads:
//! - `watch_then_event`: each thread watches a batch of operations on one key each
//!   (1,024 keys per thread), then completes them one by one through
//!   `check_and_complete` after marking them ready.
//! - `watch_then_expiry`: each thread watches a batch of operations with a zero timeout;
//!   the iteration ends when the purgatory's reaper has expired all of them.
//!
//! - `check_not_ready`: the broker's most frequent call, an event on a key whose
//!   operations are not ready (four of them, as on a partition with a few waiting
//!   fetches) and on a key nobody watches; single-threaded, against the floor of any
//!   design, one lookup in a `parking_lot::Mutex<HashMap>` (with foldhash, the hasher
//!   the purgatory's watcher lists use).
//!
//! Times include everything a caller waits for (the expiry bench includes the reaper's
//! wake-up, up to one 1 ms tick; for the tokio peers, the runtime's timer).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, Throughput,
};
use purgatory::{Completion, DelayedOperation, Purgatory};
use purgatory_benches::peers::{NaivePurgatory, TokioDelayQueuePurgatory, TokioTaskPurgatory};
use purgatory_benches::workloads::w3::LoadPurgatory;

const OPS_PER_THREAD: u64 = 20_000;
const KEYS_PER_THREAD: u64 = 1_024;

/// Ready once its thread's `released` counter has passed its id.
struct BenchOp {
    id: u64,
    released: &'static AtomicU64,
    done: &'static AtomicU64,
    timeout: Duration,
}

impl DelayedOperation for BenchOp {
    fn timeout(&self) -> Duration {
        self.timeout
    }
    fn try_complete(&mut self) -> bool {
        self.released.load(Ordering::Acquire) > self.id
    }
    fn on_complete(&mut self, _how: Completion) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Per-thread counters (leaked once per bench function; a few bytes).
struct Lane {
    next_id: AtomicU64,
    released: &'static AtomicU64,
    done: &'static AtomicU64,
}

fn lanes(n: usize) -> Vec<Lane> {
    (0..n)
        .map(|_| Lane {
            next_id: AtomicU64::new(0),
            released: Box::leak(Box::new(AtomicU64::new(0))),
            done: Box::leak(Box::new(AtomicU64::new(0))),
        })
        .collect()
}

fn event_round<P: LoadPurgatory<BenchOp>>(p: &P, lane: &Lane, thread: u64) {
    let first = lane.next_id.fetch_add(OPS_PER_THREAD, Ordering::Relaxed);
    let key_base = thread << 32;
    for id in first..first + OPS_PER_THREAD {
        let op = BenchOp {
            id,
            released: lane.released,
            done: lane.done,
            timeout: Duration::from_secs(60),
        };
        std::hint::black_box(p.watch(op, &[key_base + id % KEYS_PER_THREAD]));
    }
    for id in first..first + OPS_PER_THREAD {
        lane.released.store(id + 1, Ordering::Release);
        p.check_and_complete(key_base + id % KEYS_PER_THREAD);
    }
}

fn expiry_round<P: LoadPurgatory<BenchOp>>(p: &P, lane: &Lane, thread: u64) {
    let target = lane.done.load(Ordering::Relaxed) + OPS_PER_THREAD;
    let first = lane.next_id.fetch_add(OPS_PER_THREAD, Ordering::Relaxed);
    for id in first..first + OPS_PER_THREAD {
        let op = BenchOp {
            id,
            released: lane.released,
            done: lane.done,
            timeout: Duration::ZERO,
        };
        std::hint::black_box(p.watch(op, &[(thread << 32) + id % KEYS_PER_THREAD]));
    }
    let limit = Instant::now() + Duration::from_secs(10);
    while lane.done.load(Ordering::Relaxed) < target && Instant::now() < limit {
        std::thread::yield_now();
    }
}

fn run_threads<P: LoadPurgatory<BenchOp>>(
    p: &P,
    lanes: &[Lane],
    iters: u64,
    round: fn(&P, &Lane, u64),
) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        if lanes.len() == 1 {
            round(p, &lanes[0], 0);
        } else {
            std::thread::scope(|s| {
                for (t, lane) in lanes.iter().enumerate() {
                    s.spawn(move || round(p, lane, t as u64));
                }
            });
        }
    }
    start.elapsed()
}

/// Benches `p` as `name` in `group`, then shuts it down.
fn bench_one<P: LoadPurgatory<BenchOp>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    p: P,
    threads: usize,
    event: bool,
) {
    let lanes = lanes(threads);
    let round = if event {
        event_round::<P>
    } else {
        expiry_round::<P>
    };
    group.bench_function(BenchmarkId::from_parameter(name), |b| {
        b.iter_custom(|iters| run_threads(&p, &lanes, iters, round))
    });
    p.shutdown();
}

/// Our purgatory with its defaults.
fn ours() -> Purgatory<u64, BenchOp> {
    purgatory::PurgatoryBuilder::new()
        .name("bench")
        .build()
        .expect("valid configuration")
}

fn completion_paths(c: &mut Criterion) {
    for (name, event) in [("watch_then_event", true), ("watch_then_expiry", false)] {
        for threads in [1usize, 2] {
            let mut group = c.benchmark_group(format!("{name}/{threads}_threads"));
            group.throughput(Throughput::Elements(OPS_PER_THREAD * threads as u64));
            group.sample_size(10);
            group.warm_up_time(Duration::from_millis(500));
            group.measurement_time(Duration::from_secs(2));
            bench_one(&mut group, "ours", ours(), threads, event);
            let naive = NaivePurgatory::start(1000).expect("reaper thread");
            bench_one(&mut group, "naive", naive, threads, event);
            let task = TokioTaskPurgatory::start(1000).expect("tokio runtime");
            bench_one(&mut group, "tokio-task", task, threads, event);
            let queue = TokioDelayQueuePurgatory::start(1000).expect("driver thread");
            bench_one(&mut group, "tokio-delayqueue", queue, threads, event);
            group.finish();
        }
    }
}

/// Watches four never-ready operations on each of 1,024 keys; the bench then checks
/// those keys in turn (`waiting`) or keys nobody watches (`unknown`).
fn check_not_ready_of<P: LoadPurgatory<BenchOp>>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    p: P,
) {
    let lane = &lanes(1)[0];
    for id in 0..4 * KEYS_PER_THREAD {
        let op = BenchOp {
            id,
            released: lane.released,
            done: lane.done,
            timeout: Duration::from_secs(600),
        };
        assert!(p.watch(op, &[id % KEYS_PER_THREAD]).is_some());
    }
    for (case, offset) in [("waiting", 0), ("unknown", 1 << 40)] {
        let mut key = 0;
        group.bench_function(BenchmarkId::new(name, case), |b| {
            b.iter(|| {
                key = (key + 1) % KEYS_PER_THREAD;
                std::hint::black_box(p.check_and_complete(offset + key))
            })
        });
    }
    p.shutdown();
}

fn check_not_ready(c: &mut Criterion) {
    let mut group = c.benchmark_group("check_not_ready");
    group.throughput(Throughput::Elements(1));
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    check_not_ready_of(&mut group, "ours", ours());
    let naive = NaivePurgatory::start(1000).expect("reaper thread");
    check_not_ready_of(&mut group, "naive", naive);
    // The floor: one lock and one lookup of a key's (never empty) list.
    let map: parking_lot::Mutex<HashMap<u64, Vec<u64>, foldhash::fast::RandomState>> =
        parking_lot::Mutex::new(
            (0..KEYS_PER_THREAD)
                .map(|k| (k, vec![k, k + 1, k + 2, k + 3]))
                .collect(),
        );
    for (case, offset) in [("waiting", 0u64), ("unknown", 1 << 40)] {
        let mut key = 0;
        group.bench_function(BenchmarkId::new("mutex-hashmap", case), |b| {
            b.iter(|| {
                key = (key + 1) % KEYS_PER_THREAD;
                std::hint::black_box(map.lock().get(&(offset + key)).map_or(0, Vec::len))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, completion_paths, check_not_ready);
criterion_main!(benches);
