//! Criterion benches of the purgatory's two completion paths, ours vs the naive
//! baseline in the same run, at 1 and 2 threads:
//! - `watch_then_event`: each thread watches a batch of operations on one key each
//!   (1,024 keys per thread), then completes them one by one through
//!   `check_and_complete` after marking them ready.
//! - `watch_then_expiry`: each thread watches a batch of operations with a zero timeout;
//!   the iteration ends when the purgatory's reaper has expired all of them.
//!
//! Times include everything a caller waits for (the expiry bench includes the reaper's
//! wake-up, up to one 1 ms tick).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use purgatory::{Completion, DelayedOperation, Purgatory};
use purgatory_benches::peers::NaivePurgatory;
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

fn completion_paths(c: &mut Criterion) {
    for (name, event) in [("watch_then_event", true), ("watch_then_expiry", false)] {
        for threads in [1usize, 2] {
            let mut group = c.benchmark_group(format!("{name}/{threads}_threads"));
            group.throughput(Throughput::Elements(OPS_PER_THREAD * threads as u64));
            group.sample_size(10);
            group.warm_up_time(Duration::from_millis(500));
            group.measurement_time(Duration::from_secs(2));
            let ours: Purgatory<u64, BenchOp> = purgatory::PurgatoryBuilder::new()
                .name("bench")
                .build()
                .expect("valid configuration");
            let ours_lanes = lanes(threads);
            group.bench_function(BenchmarkId::from_parameter("ours"), |b| {
                let round = if event {
                    event_round::<Purgatory<u64, BenchOp>>
                } else {
                    expiry_round
                };
                b.iter_custom(|iters| run_threads(&ours, &ours_lanes, iters, round))
            });
            let naive: NaivePurgatory<u64, BenchOp> =
                NaivePurgatory::start(1000).expect("reaper thread");
            let naive_lanes = lanes(threads);
            group.bench_function(BenchmarkId::from_parameter("naive"), |b| {
                let round = if event {
                    event_round::<NaivePurgatory<u64, BenchOp>>
                } else {
                    expiry_round
                };
                b.iter_custom(|iters| run_threads(&naive, &naive_lanes, iters, round))
            });
            group.finish();
            LoadPurgatory::shutdown(&ours);
            LoadPurgatory::shutdown(&naive);
        }
    }
}

criterion_group!(benches, completion_paths);
criterion_main!(benches);
