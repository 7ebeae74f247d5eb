//! Criterion benches of W1's three phases at a size criterion can iterate on: batches of
//! 100,000 adds, 90,000 random-order cancels, and 100,000 second-wave adds into a timer
//! holding the 10,000 survivors; ours and every W1 peer in the same run.
//!
//! Each iteration builds a fresh timer; only the phase named is timed (`iter_custom`).
//! Unlike the load tool these run on the system allocator, in one process.

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use purgatory_benches::harness::sampling::{shuffled_prefix, uniform};
use purgatory_benches::ours::OurChurnTimer;
use purgatory_benches::peers::{paused_runtime, BTreeTimer, DelayQueueTimer, LazyHeapTimer};
use purgatory_benches::workloads::w1::ChurnTimer;

const TASKS: usize = 100_000;
const CANCELS: usize = TASKS * 9 / 10;

struct Inputs {
    delays: Vec<u64>,
    second: Vec<u64>,
    cancels: Vec<u32>,
}

#[derive(Clone, Copy)]
enum Phase {
    Add,
    Cancel,
    SecondAdd,
}

/// Runs `iters` fresh timers through the phases, timing only `phase`.
fn time_phase<C: ChurnTimer>(
    make: &dyn Fn() -> C,
    inputs: &Inputs,
    phase: Phase,
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let mut timer = make();
        let mut handles = Vec::with_capacity(TASKS);
        let start = Instant::now();
        for (i, &d) in inputs.delays.iter().enumerate() {
            handles.push(timer.add(d, i as u32));
        }
        if let Phase::Add = phase {
            total += start.elapsed();
            continue;
        }
        let start = Instant::now();
        for &i in &inputs.cancels {
            std::hint::black_box(timer.cancel(handles[i as usize]));
        }
        if let Phase::Cancel = phase {
            total += start.elapsed();
            continue;
        }
        let start = Instant::now();
        for (i, &d) in inputs.second.iter().enumerate() {
            std::hint::black_box(timer.add(d, i as u32));
        }
        total += start.elapsed();
    }
    total
}

fn churn(c: &mut Criterion) {
    let inputs = Inputs {
        delays: uniform(TASKS, 1, 30_000, 1),
        cancels: shuffled_prefix(TASKS, CANCELS, 2),
        second: uniform(TASKS, 1, 30_000, 3),
    };
    let runtime = paused_runtime().expect("a tokio runtime");
    let _context = runtime.enter();
    for (phase, name, ops) in [
        (Phase::Add, "w1_add_100k", TASKS),
        (Phase::Cancel, "w1_cancel_90k", CANCELS),
        (Phase::SecondAdd, "w1_second_add_100k", TASKS),
    ] {
        let mut group = c.benchmark_group(name);
        group.throughput(Throughput::Elements(ops as u64));
        group.sample_size(10);
        group.warm_up_time(Duration::from_millis(500));
        group.measurement_time(Duration::from_secs(2));
        group.bench_function(BenchmarkId::from_parameter("ours"), |b| {
            let make = || OurChurnTimer::new().expect("valid configuration");
            b.iter_custom(|iters| time_phase(&make, &inputs, phase, iters))
        });
        group.bench_function(BenchmarkId::from_parameter("binaryheap"), |b| {
            b.iter_custom(|iters| time_phase(&LazyHeapTimer::<u32>::new, &inputs, phase, iters))
        });
        group.bench_function(BenchmarkId::from_parameter("btreemap"), |b| {
            b.iter_custom(|iters| time_phase(&BTreeTimer::<u32>::new, &inputs, phase, iters))
        });
        group.bench_function(BenchmarkId::from_parameter("delayqueue"), |b| {
            let make = || DelayQueueTimer::<u32>::with_capacity(0);
            b.iter_custom(|iters| time_phase(&make, &inputs, phase, iters))
        });
        group.finish();
    }
}

criterion_group!(benches, churn);
criterion_main!(benches);
