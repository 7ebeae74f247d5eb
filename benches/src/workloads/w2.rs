//! W2, timer expiry on the real clock: 200,000 tasks with deadlines uniform in
//! [0, 2,000] ms from the start, added as fast as possible, then every one left to fire
//! with the implementation's own driving thread.
//!
//! # Invariants
//! - [`Implementation`] is the list of W2's implementations; [`run`] picks one with a
//!   single `match` whose arms hold each one's add loop, statically dispatched.
//! - All implementations measure against one origin `Instant`: ours through
//!   [`OriginClock`], the peers through `origin + deadline`, so lateness means the same
//!   thing for all of them.
//! - Each task records the instant it ran, once, in its own slot; lateness is that
//!   instant minus its deadline (negative = fired early, a defect).
//! - One W2 run per process (the recorder is process-global so a task stays a bare
//!   `u32`); the load tool gives every run a process of its own.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use timer_core::{TimerBuilder, TimerTask};

use crate::harness::process::peak_resident_bytes;
use crate::harness::sampling::uniform;
use crate::harness::stall_probe::{NetCpu, Stalls};
use crate::ours::OriginClock;
use crate::peers::{delay_queue_expiry_run, CondvarTimer};
use crate::report::statistics::percentile_sorted;
use crate::report::{Figure, MIB};
use crate::workloads::{implementation_name, Job, Measurement, Workload};

/// W2 parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct W2Params {
    /// Tasks (200,000).
    pub tasks: usize,
    /// Latest deadline in ms after the start (2,000).
    pub max_deadline_ms: u64,
    /// Seed of the deadlines.
    pub seed: u64,
}

impl Default for W2Params {
    fn default() -> Self {
        W2Params {
            tasks: 200_000,
            max_deadline_ms: 2_000,
            seed: 1,
        }
    }
}

/// Lateness statistics in milliseconds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Lateness {
    /// Tasks counted.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
    /// Minimum (negative: a task fired early).
    pub min_ms: f64,
}

impl Lateness {
    fn of(mut nanos: Vec<i64>) -> Lateness {
        nanos.sort_unstable();
        let ms = |v: Option<i64>| v.map_or(0.0, |v| v as f64 / 1e6);
        Lateness {
            count: nanos.len(),
            p50_ms: ms(percentile_sorted(&nanos, 50.0)),
            p99_ms: ms(percentile_sorted(&nanos, 99.0)),
            max_ms: ms(nanos.last().copied()),
            min_ms: ms(nanos.first().copied()),
        }
    }
}

/// W2 figures of one implementation in one process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct W2Result {
    /// Which implementation.
    pub implementation: String,
    /// Tasks.
    pub tasks: usize,
    /// Tasks that fired (must equal `tasks`).
    pub fired: usize,
    /// Time from the start until the last add returned.
    pub add_ms: f64,
    /// Time from the start until every task had fired.
    pub all_fired_ms: f64,
    /// Lateness over all tasks.
    pub lateness: Lateness,
    /// Lateness over the tasks whose deadline fell after the last add.
    pub lateness_after_adds: Lateness,
    /// Process CPU time during the run (adds, driving, firing), in ms.
    pub cpu_ms: f64,
    /// Peak resident memory of the process.
    pub peak_rss_bytes: u64,
    /// Machine stalls seen during the run (the probe's CPU is excluded from `cpu_ms`).
    #[serde(flatten)]
    pub stalls: Stalls,
}

/// The implementations W2 runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Implementation {
    /// Our `timer_core::Timer` on an [`OriginClock`], fired by its own reaper.
    Ours,
    /// A dedicated thread over `Mutex<BinaryHeap>` + `Condvar` ([`CondvarTimer`]).
    #[value(name = "binaryheap")]
    BinaryHeap,
    /// tokio-util's `DelayQueue` on a current-thread runtime
    /// ([`delay_queue_expiry_run`]).
    #[value(name = "delayqueue")]
    DelayQueue,
}

/// W2 as the load tool runs it.
#[derive(Debug)]
pub struct TimerExpiry;

impl Workload for TimerExpiry {
    const NAME: &'static str = "w2";
    const DEFAULT_IMPLEMENTATIONS: &'static [Implementation] = &[
        Implementation::Ours,
        Implementation::BinaryHeap,
        Implementation::DelayQueue,
    ];
    const DEFAULT_ALLOCATOR: &'static str = "system";
    const FIGURES: &'static [Figure] = &[
        Figure::new("add_ms", "adds done (ms)", 1.0, 1),
        Figure::new("all_fired_ms", "all fired (ms)", 1.0, 1),
        Figure::new("lateness.p50_ms", "lateness p50 ms", 1.0, 3),
        Figure::new("lateness.p99_ms", "lateness p99 ms", 1.0, 3),
        Figure::new("lateness.max_ms", "lateness max ms", 1.0, 3),
        Figure::new("lateness.min_ms", "earliest (min) ms", 1.0, 3),
        Figure::new("lateness_after_adds.p50_ms", "after adds: p50 ms", 1.0, 3),
        Figure::new("lateness_after_adds.p99_ms", "after adds: p99 ms", 1.0, 3),
        Figure::new("lateness_after_adds.max_ms", "after adds: max ms", 1.0, 3),
        Figure::new("cpu_ms", "process CPU ms", 1.0, 0),
        Figure::new("peak_rss_bytes", "peak RSS MiB", MIB, 1),
        Figure::new("stall_count", "machine stalls > 5 ms", 1.0, 0),
        Figure::new("stall_max_ms", "longest stall ms", 1.0, 1),
    ];

    type Implementation = Implementation;
    type Params = W2Params;
    type Result = W2Result;

    fn title(p: &W2Params) -> String {
        format!(
            "W2 timer expiry: {} tasks, deadlines uniform in [0, {}] ms, real clock",
            p.tasks, p.max_deadline_ms
        )
    }

    fn run(implementation: Implementation, p: &W2Params) -> Result<W2Result, String> {
        run(implementation, p).map_err(|e| e.to_string())
    }

    fn measurement(job: Job<Self>) -> Measurement {
        Measurement::W2(job)
    }
}

struct Recorder {
    origin: Instant,
    fired_at: Box<[AtomicU64]>,
    remaining: AtomicUsize,
    waiter: Thread,
}

static RECORDER: OnceLock<Recorder> = OnceLock::new();

/// Records that task `index` ran now. Does nothing outside a W2 run.
fn fire(index: u32) {
    let Some(r) = RECORDER.get() else { return };
    let nanos = u64::try_from(r.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
    if let Some(slot) = r.fired_at.get(index as usize) {
        slot.store(nanos, Ordering::Relaxed);
    }
    if r.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
        r.waiter.unpark();
    }
}

/// Our W2 task: fires index `.0`.
struct FireTask(u32);

impl TimerTask for FireTask {
    fn run(self) {
        fire(self.0)
    }
}

/// Why a W2 run could not be made.
#[derive(Debug)]
pub enum W2Error {
    /// W2 already ran in this process.
    AlreadyRan,
    /// Building a timer or runtime failed.
    Setup(String),
    /// Not every task fired within the allowed time.
    TimedOut {
        /// Tasks that had not fired.
        remaining: usize,
    },
}

impl std::fmt::Display for W2Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            W2Error::AlreadyRan => f.write_str("W2 runs once per process"),
            W2Error::Setup(e) => write!(f, "setup failed: {e}"),
            W2Error::TimedOut { remaining } => {
                write!(
                    f,
                    "{remaining} tasks had not fired 30 s after the last deadline"
                )
            }
        }
    }
}

impl std::error::Error for W2Error {}

/// Runs W2 with `implementation`, in this process (once: see the module's invariants).
pub fn run(implementation: Implementation, p: &W2Params) -> Result<W2Result, W2Error> {
    let deadlines: Vec<u64> = uniform(p.tasks, 0, p.max_deadline_ms * 1_000_000, p.seed);
    let cpu = NetCpu::start();
    let origin = Instant::now();
    let recorder = Recorder {
        origin,
        fired_at: (0..p.tasks).map(|_| AtomicU64::new(0)).collect(),
        remaining: AtomicUsize::new(p.tasks),
        waiter: std::thread::current(),
    };
    RECORDER.set(recorder).map_err(|_| W2Error::AlreadyRan)?;
    let Some(rec) = RECORDER.get() else {
        return Err(W2Error::AlreadyRan);
    };
    let wait_limit = Duration::from_millis(p.max_deadline_ms) + Duration::from_secs(30);
    let wait_all = || {
        while rec.remaining.load(Ordering::Acquire) > 0 && origin.elapsed() < wait_limit {
            std::thread::park_timeout(Duration::from_millis(50));
        }
    };
    let origin = rec.origin;
    let add_done;
    match implementation {
        Implementation::Ours => {
            let timer = TimerBuilder::new()
                .clock(OriginClock(origin))
                .build::<FireTask>()
                .map_err(|e| W2Error::Setup(e.to_string()))?;
            for (i, &d) in deadlines.iter().enumerate() {
                let _ = timer.add_at(Duration::from_nanos(d), FireTask(i as u32));
            }
            add_done = origin.elapsed();
            wait_all();
            timer.shutdown();
        }
        Implementation::BinaryHeap => {
            let timer = CondvarTimer::start(fire).map_err(|e| W2Error::Setup(e.to_string()))?;
            for (i, &d) in deadlines.iter().enumerate() {
                timer.add_at(origin + Duration::from_nanos(d), i as u32);
            }
            add_done = origin.elapsed();
            wait_all();
            timer.shutdown();
        }
        Implementation::DelayQueue => {
            let adds = std::cell::Cell::new(Duration::ZERO);
            delay_queue_expiry_run(&deadlines, origin, fire, || adds.set(origin.elapsed()))
                .map_err(|e| W2Error::Setup(e.to_string()))?;
            add_done = adds.get();
        }
    }
    let (cpu, stalls) = cpu.finish();
    let remaining = rec.remaining.load(Ordering::Acquire);
    if remaining > 0 {
        return Err(W2Error::TimedOut { remaining });
    }
    let fired_at: Vec<u64> = rec
        .fired_at
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .collect();
    let all_fired = fired_at.iter().copied().max().unwrap_or(0);
    let add_done_nanos = u64::try_from(add_done.as_nanos()).unwrap_or(u64::MAX);
    let lateness = |filter: &dyn Fn(u64) -> bool| -> Vec<i64> {
        deadlines
            .iter()
            .zip(&fired_at)
            .filter(|(&d, _)| filter(d))
            .map(|(&d, &f)| f as i64 - d as i64)
            .collect()
    };
    Ok(W2Result {
        implementation: implementation_name(&implementation),
        tasks: p.tasks,
        fired: p.tasks - remaining,
        add_ms: add_done.as_secs_f64() * 1e3,
        all_fired_ms: all_fired as f64 / 1e6,
        lateness: Lateness::of(lateness(&|_| true)),
        lateness_after_adds: Lateness::of(lateness(&|d| d > add_done_nanos)),
        cpu_ms: cpu.as_secs_f64() * 1e3,
        peak_rss_bytes: peak_resident_bytes(),
        stalls,
    })
}
