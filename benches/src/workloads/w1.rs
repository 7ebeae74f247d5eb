//! W1, timer churn: 1,000,000 adds with delays uniform in [1, 30,000] ms on a clock that
//! does not move, 90 % of them cancelled by handle in random order, then a second wave
//! of 1,000,000 adds into the timer that still holds the survivors. Variant W1-mt: the
//! same work split over threads that add and cancel concurrently.
//!
//! # Invariants
//! - [`Implementation`] is the list of W1's implementations; [`run`] picks one with a
//!   single `match` before any input is sampled, and the timed code is generic over
//!   it (no dynamic call inside it).
//! - Inputs (delays, cancel order) are sampled before the clock starts, and every handle
//!   vector is allocated and written before the memory baseline, so the timed loops and
//!   the memory figures contain only the timer's own work and memory.
//! - The handles to cancel are copied into cancel order between the first wave and the
//!   cancels, untimed, so the cancel loop reads them in sequence: a caller cancels with a
//!   handle it holds (kept with its request), not one fetched from a random place in a
//!   table of millions. Gathering them inside the loop would add a cache miss per cancel,
//!   the harness's, not the timer's.
//! - Memory figures are relative to the resident size just before the first add; the
//!   peak mark is reset there (`/proc/self/clear_refs`), so earlier allocations do not
//!   count.
//! - Multi-threaded phases start and end on barriers; a phase's time is the wall time
//!   from the start barrier until the last thread is done, so "ns per add" is the
//!   throughput of all threads together.

use std::collections::BTreeMap;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::harness::process::{peak_resident_bytes, reset_peak_resident, resident_bytes};
use crate::harness::sampling::{shuffled_prefix, uniform};
use crate::ours::{OurBareWheel, OurChurnTimer, OurLockedWheel};
use crate::peers::{paused_runtime, BTreeTimer, DelayQueueTimer, LazyHeapTimer};
use crate::report::statistics::Spread;
use crate::report::{Figure, MIB};
use crate::workloads::{implementation_name, Job, Measurement, Workload};

/// What W1 needs of a single-threaded timer: add by delay, cancel by handle.
pub trait ChurnTimer {
    /// Names one added task.
    type Handle: Copy + Send;
    /// Adds task `task` due `delay_ms` from now (the clock does not move).
    fn add(&mut self, delay_ms: u64, task: u32) -> Self::Handle;
    /// Cancels by handle; true if the task was pending.
    fn cancel(&mut self, handle: Self::Handle) -> bool;
    /// Tasks pending (for checking the run, not timed).
    fn pending(&self) -> usize;
}

/// What W1-mt needs: the same operations through a shared reference.
pub trait SharedChurnTimer: Sync {
    /// Names one added task.
    type Handle: Copy + Send;
    /// Adds task `task` due `delay_ms` from now.
    fn add(&self, delay_ms: u64, task: u32) -> Self::Handle;
    /// Cancels by handle; true if the task was pending.
    fn cancel(&self, handle: Self::Handle) -> bool;
    /// Tasks pending.
    fn pending(&self) -> usize;
}

/// W1 through batch calls: add many, cancel many (ours: `Timer::add_batch` and
/// `Timer::cancel_batch`).
pub trait BatchChurnTimer {
    /// Names one added task.
    type Handle: Copy + Send;
    /// Adds each `(delay_ms, task)` of `tasks`; appends their handles to `out`, in order.
    fn add_batch(&mut self, tasks: &[(u64, u32)], out: &mut Vec<Self::Handle>);
    /// Cancels every handle of `handles` (reordering them); returns how many were pending.
    fn cancel_batch(&mut self, handles: &mut [Self::Handle]) -> usize;
    /// Tasks pending.
    fn pending(&self) -> usize;
}

/// Operations per batch call in [`run_single_batched`].
pub const BATCH: usize = 64;

/// A single-threaded peer shared the only way its design allows: behind one lock.
impl<C: ChurnTimer + Send> SharedChurnTimer for Mutex<C> {
    type Handle = C::Handle;

    #[inline]
    fn add(&self, delay_ms: u64, task: u32) -> Self::Handle {
        self.lock().add(delay_ms, task)
    }

    #[inline]
    fn cancel(&self, handle: Self::Handle) -> bool {
        self.lock().cancel(handle)
    }

    fn pending(&self) -> usize {
        self.lock().pending()
    }
}

/// W1 parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct W1Params {
    /// Tasks per wave, over all threads (1,000,000).
    pub tasks: usize,
    /// Percentage of the first wave cancelled (90).
    pub cancel_pct: u32,
    /// Threads adding and cancelling concurrently (1; W1-mt uses 2).
    pub threads: usize,
    /// Shortest delay in ms (1).
    pub min_delay_ms: u64,
    /// Longest delay in ms (30,000).
    pub max_delay_ms: u64,
    /// Seed of the first wave; the cancel order uses `seed + 1`, the second wave `seed + 2`,
    /// and thread `t` adds `100 * t` to each.
    pub seed: u64,
}

impl Default for W1Params {
    fn default() -> Self {
        W1Params {
            tasks: 1_000_000,
            cancel_pct: 90,
            threads: 1,
            min_delay_ms: 1,
            max_delay_ms: 30_000,
            seed: 1,
        }
    }
}

/// W1 figures of one implementation in one process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct W1Result {
    /// Which implementation.
    pub implementation: String,
    /// Tasks per wave.
    pub tasks: usize,
    /// Threads.
    pub threads: usize,
    /// Wall ns per first-wave add (all threads together).
    pub add_ns: f64,
    /// Wall ns per cancel.
    pub cancel_ns: f64,
    /// Wall ns per second-wave add.
    pub second_add_ns: f64,
    /// Peak resident memory during the first wave minus the resident memory before it.
    pub peak_delta_bytes: u64,
    /// `peak_delta_bytes / tasks`.
    pub peak_bytes_per_task: f64,
    /// Resident memory after the cancels minus the memory before the first add.
    pub after_cancel_delta_bytes: u64,
    /// Peak resident memory after the second wave minus the memory before the first add.
    pub second_peak_delta_bytes: u64,
    /// How much the peak grew during the second wave.
    pub second_wave_growth_bytes: u64,
    /// Cancels that found their task pending (should be all of them).
    pub cancelled: usize,
    /// Tasks pending at the end (survivors plus the second wave).
    pub pending_end: usize,
}

/// The implementations W1 runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Implementation {
    /// Our `timer_core::Timer` ([`OurChurnTimer`]); W1-mt shares it between threads.
    Ours,
    /// A `BinaryHeap` with lazy cancellation ([`LazyHeapTimer`]); W1-mt: behind a mutex.
    #[value(name = "binaryheap")]
    BinaryHeap,
    /// A `BTreeMap` that really removes ([`BTreeTimer`]); W1-mt: behind a mutex.
    #[value(name = "btreemap")]
    BTreeMap,
    /// tokio-util's `DelayQueue` on a paused runtime ([`DelayQueueTimer`]); W1-mt:
    /// behind a mutex.
    #[value(name = "delayqueue")]
    DelayQueue,
    /// Diagnostic, one thread only: our bare wheel without the timer around it.
    Wheel,
    /// Diagnostic, one thread only: the bare wheel behind one mutex locked per call.
    LockedWheel,
    /// Diagnostic, one thread only: our timer through `add_batch`/`cancel_batch`,
    /// [`BATCH`] operations a call.
    OursBatch,
}

/// W1 as the load tool runs it.
#[derive(Debug)]
pub struct TimerChurn;

impl Workload for TimerChurn {
    const NAME: &'static str = "w1";
    const DEFAULT_IMPLEMENTATIONS: &'static [Implementation] = &[
        Implementation::Ours,
        Implementation::BinaryHeap,
        Implementation::BTreeMap,
        Implementation::DelayQueue,
    ];
    // mimalloc's segment reservations would add tens of MiB to every memory figure.
    const DEFAULT_ALLOCATOR: &'static str = "system";
    const FIGURES: &'static [Figure] = &[
        Figure::new("add_ns", "ns per add", 1.0, 1),
        Figure::new("cancel_ns", "ns per cancel", 1.0, 1),
        Figure::new("second_add_ns", "ns per 2nd-wave add", 1.0, 1),
        Figure::new("peak_bytes_per_task", "peak B/task (1st wave)", 1.0, 1),
        Figure::new("peak_delta_bytes", "peak MiB (1st wave)", MIB, 1),
        Figure::new("after_cancel_delta_bytes", "MiB after cancels", MIB, 1),
        Figure::new("second_peak_delta_bytes", "peak MiB after 2nd wave", MIB, 1),
        Figure::new(
            "second_wave_growth_bytes",
            "2nd-wave peak growth MiB",
            MIB,
            1,
        ),
        Figure::new("speedup_add", "add speedup vs 1 thread", 1.0, 2),
        Figure::new("speedup_cancel", "cancel speedup vs 1 thread", 1.0, 2),
        Figure::new("speedup_second_add", "2nd add speedup vs 1 thread", 1.0, 2),
    ];

    type Implementation = Implementation;
    type Params = W1Params;
    type Result = W1Result;

    fn title(p: &W1Params) -> String {
        let mut title = format!(
            "W1 timer churn: {} tasks, {} % cancelled, {} thread(s)",
            p.tasks, p.cancel_pct, p.threads
        );
        if p.threads > 1 {
            title.push_str(" (ns = wall time / ops of all threads)");
        }
        title
    }

    fn run(implementation: Implementation, p: &W1Params) -> Result<W1Result, String> {
        run(implementation, p)
    }

    fn measurement(job: Job<Self>) -> Measurement {
        Measurement::W1(job)
    }

    /// W1-mt: the same work on 1 thread, for the speedups.
    fn baseline(p: &W1Params) -> Option<(&'static str, W1Params)> {
        let single = W1Params {
            threads: 1,
            ..p.clone()
        };
        (p.threads > 1).then_some(("w1 (1 thread)", single))
    }

    /// W1-mt: `speedup_*` = the 1-thread median's ns per operation / this run's.
    fn relate_to_baseline(run: &mut Value, single: &BTreeMap<String, Spread>) {
        let Value::Object(map) = run else { return };
        for (field, speedup) in [
            ("add_ns", "speedup_add"),
            ("cancel_ns", "speedup_cancel"),
            ("second_add_ns", "speedup_second_add"),
        ] {
            let multi = map.get(field).and_then(Value::as_f64);
            if let (Some(multi), Some(one)) = (multi, single.get(field)) {
                if multi > 0.0 {
                    if let Some(n) = serde_json::Number::from_f64(one.median / multi) {
                        map.insert(speedup.into(), Value::Number(n));
                    }
                }
            }
        }
    }
}

/// Runs W1 (W1-mt when `p.threads > 1`) with `implementation`, in this process.
pub fn run(implementation: Implementation, p: &W1Params) -> Result<W1Result, String> {
    let name = implementation_name(&implementation);
    let name = name.as_str();
    let multi = p.threads > 1;
    let result = match implementation {
        Implementation::Wheel | Implementation::LockedWheel | Implementation::OursBatch
            if multi =>
        {
            return Err(format!(
                "`{name}` is single-threaded; use it without --threads"
            ))
        }
        Implementation::Ours => {
            let timer = OurChurnTimer::new().map_err(|e| e.to_string())?;
            if multi {
                run_multi(name, &timer, p, None)
            } else {
                run_single(name, timer, p)
            }
        }
        Implementation::Wheel => run_single(name, OurBareWheel::default(), p),
        Implementation::LockedWheel => run_single(name, OurLockedWheel::default(), p),
        Implementation::OursBatch => {
            let timer = OurChurnTimer::new().map_err(|e| e.to_string())?;
            run_single_batched(name, timer, p)
        }
        Implementation::BinaryHeap if multi => {
            run_multi(name, &Mutex::new(LazyHeapTimer::new()), p, None)
        }
        Implementation::BinaryHeap => run_single(name, LazyHeapTimer::new(), p),
        Implementation::BTreeMap if multi => {
            run_multi(name, &Mutex::new(BTreeTimer::new()), p, None)
        }
        Implementation::BTreeMap => run_single(name, BTreeTimer::new(), p),
        Implementation::DelayQueue => {
            let runtime = paused_runtime().map_err(|e| e.to_string())?;
            let _context = runtime.enter();
            if multi {
                let timer = Mutex::new(DelayQueueTimer::with_capacity(0));
                run_multi(name, &timer, p, Some(runtime.handle()))
            } else {
                run_single(name, DelayQueueTimer::with_capacity(0), p)
            }
        }
    };
    Ok(result)
}

struct Inputs {
    delays: Vec<u64>,
    cancels: Vec<u32>,
    second: Vec<u64>,
}

impl Inputs {
    fn sample(p: &W1Params, tasks: usize, thread: usize) -> Self {
        let seed = p.seed + 100 * thread as u64;
        let cancel_count = tasks * p.cancel_pct.min(100) as usize / 100;
        Inputs {
            delays: uniform(tasks, p.min_delay_ms, p.max_delay_ms, seed),
            cancels: shuffled_prefix(tasks, cancel_count, seed + 1),
            second: uniform(tasks, p.min_delay_ms, p.max_delay_ms, seed + 2),
        }
    }
}

fn per_op_ns(elapsed: Duration, ops: usize) -> f64 {
    elapsed.as_nanos() as f64 / ops.max(1) as f64
}

fn handle_vec<H>(n: usize) -> Vec<Option<H>> {
    let mut v = Vec::with_capacity(n);
    v.resize_with(n, || None);
    v
}

/// Copies the handles of the tasks `order` names, in that order, into `out` (untimed:
/// see the module's invariants). Returns 0, as an untimed phase.
fn gather<H: Copy>(order: &[u32], handles: &[Option<H>], out: &mut [Option<H>]) -> usize {
    for (slot, &i) in out.iter_mut().zip(order) {
        *slot = handles[i as usize];
    }
    0
}

/// Memory readings taken between phases.
struct Memory {
    base: u64,
    peak_first: u64,
    after_cancel: u64,
    peak_second: u64,
}

#[allow(clippy::too_many_arguments)]
fn result(
    name: &str,
    p: &W1Params,
    times: [Duration; 3],
    cancel_ops: usize,
    mem: Memory,
    cancelled: usize,
    pending_end: usize,
) -> W1Result {
    let peak_delta = mem.peak_first.saturating_sub(mem.base);
    W1Result {
        implementation: name.to_owned(),
        tasks: p.tasks,
        threads: p.threads,
        add_ns: per_op_ns(times[0], p.tasks),
        cancel_ns: per_op_ns(times[1], cancel_ops),
        second_add_ns: per_op_ns(times[2], p.tasks),
        peak_delta_bytes: peak_delta,
        peak_bytes_per_task: peak_delta as f64 / p.tasks.max(1) as f64,
        after_cancel_delta_bytes: mem.after_cancel.saturating_sub(mem.base),
        second_peak_delta_bytes: mem.peak_second.saturating_sub(mem.base),
        second_wave_growth_bytes: mem.peak_second.saturating_sub(mem.peak_first),
        cancelled,
        pending_end,
    }
}

/// The timed phases of a single-threaded W1 run, in order.
enum Phase {
    /// The first wave of adds.
    Adds,
    /// Not timed: lays out the handles to cancel in cancel order.
    GatherCancels,
    /// The cancels; returns how many found their task pending.
    Cancels,
    /// The second wave of adds.
    SecondAdds,
    /// Not timed: returns the tasks pending at the end.
    Pending,
}

/// Times the phases of one single-threaded run (`run(phase)` does each), reading the
/// resident memory between them.
fn drive(
    name: &str,
    p: &W1Params,
    cancel_ops: usize,
    mut run: impl FnMut(Phase) -> usize,
) -> W1Result {
    let base = resident_bytes();
    reset_peak_resident();
    let start = Instant::now();
    run(Phase::Adds);
    let add = start.elapsed();
    run(Phase::GatherCancels);
    let start = Instant::now();
    let cancelled = run(Phase::Cancels);
    let cancel = start.elapsed();
    let after_cancel = resident_bytes();
    let peak_first = peak_resident_bytes();
    let start = Instant::now();
    run(Phase::SecondAdds);
    let second_add = start.elapsed();
    let peak_second = peak_resident_bytes();
    let pending_end = run(Phase::Pending);
    result(
        name,
        p,
        [add, cancel, second_add],
        cancel_ops,
        Memory {
            base,
            peak_first,
            after_cancel,
            peak_second,
        },
        cancelled,
        pending_end,
    )
}

/// Runs W1 on one thread against `timer`.
pub fn run_single<C: ChurnTimer>(name: &str, mut timer: C, p: &W1Params) -> W1Result {
    let inputs = Inputs::sample(p, p.tasks, 0);
    let mut first = handle_vec::<C::Handle>(p.tasks);
    let mut second = handle_vec::<C::Handle>(p.tasks);
    let mut to_cancel = handle_vec::<C::Handle>(inputs.cancels.len());
    let result = drive(name, p, inputs.cancels.len(), |phase| match phase {
        Phase::Adds => {
            for (i, (&delay, slot)) in inputs.delays.iter().zip(first.iter_mut()).enumerate() {
                *slot = Some(timer.add(delay, i as u32));
            }
            0
        }
        Phase::GatherCancels => gather(&inputs.cancels, &first, &mut to_cancel),
        Phase::Cancels => to_cancel
            .iter()
            .flatten()
            .map(|&handle| usize::from(timer.cancel(handle)))
            .sum(),
        Phase::SecondAdds => {
            for (i, (&delay, slot)) in inputs.second.iter().zip(second.iter_mut()).enumerate() {
                *slot = Some(timer.add(delay, (p.tasks + i) as u32));
            }
            0
        }
        Phase::Pending => timer.pending(),
    });
    std::hint::black_box((&first, &second));
    result
}

/// Runs W1 on one thread through batch calls of [`BATCH`] operations (the same tasks,
/// delays and cancel order as [`run_single`]).
pub fn run_single_batched<C: BatchChurnTimer>(name: &str, mut timer: C, p: &W1Params) -> W1Result {
    let inputs = Inputs::sample(p, p.tasks, 0);
    let tasks = |delays: &[u64], first_id: usize| -> Vec<(u64, u32)> {
        (first_id..)
            .zip(delays)
            .map(|(id, &delay)| (delay, id as u32))
            .collect()
    };
    let first_tasks = tasks(&inputs.delays, 0);
    let second_tasks = tasks(&inputs.second, p.tasks);
    // Handle storage is touched before the baseline, as in `run_single`.
    let mut first = handle_vec::<C::Handle>(p.tasks);
    let mut second = handle_vec::<C::Handle>(p.tasks);
    let mut to_cancel = handle_vec::<C::Handle>(inputs.cancels.len());
    let mut handles = Vec::with_capacity(BATCH);
    let mut add_all = |timer: &mut C, tasks: &[(u64, u32)], slots: &mut [Option<C::Handle>]| {
        for (chunk, slots) in tasks.chunks(BATCH).zip(slots.chunks_mut(BATCH)) {
            handles.clear();
            timer.add_batch(chunk, &mut handles);
            for (slot, &handle) in slots.iter_mut().zip(&handles) {
                *slot = Some(handle);
            }
        }
    };
    let mut batch = Vec::with_capacity(BATCH);
    let result = drive(name, p, inputs.cancels.len(), |phase| match phase {
        Phase::Adds => {
            add_all(&mut timer, &first_tasks, &mut first);
            0
        }
        Phase::GatherCancels => gather(&inputs.cancels, &first, &mut to_cancel),
        Phase::Cancels => to_cancel
            .chunks(BATCH)
            .map(|chunk| {
                batch.clear();
                batch.extend(chunk.iter().flatten());
                timer.cancel_batch(&mut batch)
            })
            .sum(),
        Phase::SecondAdds => {
            add_all(&mut timer, &second_tasks, &mut second);
            0
        }
        Phase::Pending => timer.pending(),
    });
    std::hint::black_box((&first, &second));
    result
}

/// Runs W1-mt: `p.threads` threads, each with `p.tasks / p.threads` tasks, adding and
/// cancelling concurrently into `timer`. `runtime` is entered on every thread (for peers
/// that need a tokio context).
pub fn run_multi<S: SharedChurnTimer>(
    name: &str,
    timer: &S,
    p: &W1Params,
    runtime: Option<&tokio::runtime::Handle>,
) -> W1Result {
    let threads = p.threads.max(1);
    let per_thread = p.tasks / threads;
    let barrier = Barrier::new(threads + 1);
    let mut times = [Duration::ZERO; 3];
    let mut mem = Memory {
        base: 0,
        peak_first: 0,
        after_cancel: 0,
        peak_second: 0,
    };
    let (cancel_ops, cancelled) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let _context = runtime.map(|h| h.enter());
                    let inputs = Inputs::sample(p, per_thread, t);
                    let mut first = handle_vec::<S::Handle>(per_thread);
                    let mut second = handle_vec::<S::Handle>(per_thread);
                    let mut to_cancel = handle_vec::<S::Handle>(inputs.cancels.len());
                    let base = (t * per_thread) as u32;
                    barrier.wait(); // inputs ready
                    barrier.wait(); // go: first wave
                    for (i, (&d, slot)) in inputs.delays.iter().zip(first.iter_mut()).enumerate() {
                        *slot = Some(timer.add(d, base + i as u32));
                    }
                    barrier.wait(); // done
                    gather(&inputs.cancels, &first, &mut to_cancel);
                    barrier.wait(); // ready: cancels gathered
                    barrier.wait(); // go: cancels
                    let mut cancelled = 0;
                    for &h in to_cancel.iter().flatten() {
                        cancelled += usize::from(timer.cancel(h));
                    }
                    barrier.wait(); // done
                    barrier.wait(); // ready
                    barrier.wait(); // go: second wave
                    for (i, (&d, slot)) in inputs.second.iter().zip(second.iter_mut()).enumerate() {
                        *slot = Some(timer.add(d, base + i as u32));
                    }
                    barrier.wait(); // done
                    std::hint::black_box((&first, &second));
                    (inputs.cancels.len(), cancelled)
                })
            })
            .collect();
        barrier.wait();
        mem.base = resident_bytes();
        reset_peak_resident();
        for (phase, time) in times.iter_mut().enumerate() {
            if phase > 0 {
                barrier.wait(); // ready (workers gather their cancels before this one)
            }
            // The clock starts before "go", so no worker can start before it.
            let start = Instant::now();
            barrier.wait(); // go
            barrier.wait(); // done
            *time = start.elapsed();
            match phase {
                0 => {}
                1 => {
                    mem.after_cancel = resident_bytes();
                    mem.peak_first = peak_resident_bytes();
                }
                _ => mem.peak_second = peak_resident_bytes(),
            }
        }
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or((0, 0)))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    let mut p = p.clone();
    p.tasks = per_thread * threads;
    let pending_end = timer.pending();
    result(name, &p, times, cancel_ops, mem, cancelled, pending_end)
}
