//! W3, purgatory load (Kafka's `TestPurgatoryPerformance`): requests arrive as a Poisson
//! process at `rate`, each watched on `keys` random keys with a `timeout`; a completer
//! completes those whose log-normal latency is below the timeout at arrival + latency,
//! the rest expire. W3-events (`events`): the completer marks the request ready and calls
//! `check_and_complete` on its first key instead of forcing it.
//!
//! # Invariants
//! - [`Implementation`] is the list of W3's implementations; [`run`] picks one with a
//!   single `match` before the run starts, and the timed code is generic over
//!   it (no dynamic call inside it).
//! - Every request is accounted once: at the end `completed + expired == num`, or the
//!   run reports that some were still pending when the drain limit passed.
//! - CPU time and peak memory are the whole process's (generator, completer, the
//!   purgatory's threads): run each implementation in a process of its own.
//! - The run's [`LoadContext`] is leaked (one per run, a few bytes per request) so that
//!   operations can refer to it with a plain reference.

pub mod completer;
pub mod generator;
pub mod null;
pub mod null_late;
pub mod op;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::harness::process::peak_resident_bytes;
use crate::harness::progress::Progress;
use crate::harness::sampling::{CyclicTable, KeyTable};
use crate::harness::stall_probe::{NetCpu, Stalls};
use crate::peers::{NaivePurgatory, TokioDelayQueuePurgatory, TokioTaskPurgatory};
use crate::report::{Figure, MIB};
use crate::workloads::{implementation_name, Job, Measurement, Workload};
pub use op::{LoadContext, LoadOp};

/// What the load tool needs of a purgatory (ours and the purgatory peers implement it).
pub trait LoadPurgatory<O>: Send + Sync {
    /// Names a waiting operation, for forced completion.
    type Handle: Send;
    /// Tries `op`, else watches it on `keys`; `None` if it completed here.
    fn watch(&self, op: O, keys: &[u64]) -> Option<Self::Handle>;
    /// Watches a batch of requests that arrived together, like `watch` on each (the
    /// default), appending one result per request to `out` in order; `batch` is left empty.
    fn watch_batch(&self, batch: &mut Vec<(O, &[u64])>, out: &mut Vec<Option<Self::Handle>>) {
        out.extend(batch.drain(..).map(|(op, keys)| self.watch(op, keys)));
    }
    /// Completes the operation unless already completed.
    fn force_complete(&self, handle: &Self::Handle) -> bool;
    /// Completes every operation of `handles` not yet completed, like `force_complete` on
    /// each (the default); returns how many this call completed.
    fn force_complete_batch(&self, handles: &[Self::Handle]) -> usize {
        handles.iter().filter(|h| self.force_complete(h)).count()
    }
    /// Tries the operations watched on `key`; returns how many completed.
    fn check_and_complete(&self, key: u64) -> usize;
    /// Stops the purgatory's threads, expiring what is still pending.
    fn shutdown(&self);
}

/// The implementations W3 runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Implementation {
    /// Our `purgatory::Purgatory`.
    Ours,
    /// Diagnostic: ours with its expirations run on a pool of two threads
    /// (`Executor::pool(2)`) instead of inline on the reaper.
    OursPool,
    /// Diagnostic: ours without the stand-in that relieves a reaper stuck in an expiry
    /// callback (`TimerBuilder::stand_in(None)`, the default before it existed).
    OursNoStandIn,
    /// One mutex over a key map and a deadline heap, with a reaper thread
    /// ([`NaivePurgatory`]).
    Naive,
    /// No purgatory: the tool's own cost (plain W3 only; see [`null`]).
    Null,
    /// Test fixture: `null`, but every expiry answered 50 ms after its deadline (plain W3
    /// only; see [`null_late`]): it keeps up with any rate and is never on time.
    NullLate,
    /// A tokio task per waiting request, watcher lists in a `DashMap`
    /// ([`TokioTaskPurgatory`]).
    TokioTask,
    /// One tokio task driving a `DelayQueue`, fed through an unbounded channel
    /// ([`TokioDelayQueuePurgatory`]). Its hand-off never pushes back: read its held
    /// rate next to its expiry lateness and memory.
    TokioDelayqueue,
}

/// W3 as the load tool runs it.
#[derive(Debug)]
pub struct PurgatoryLoad;

impl Workload for PurgatoryLoad {
    const NAME: &'static str = "w3";
    const DEFAULT_IMPLEMENTATIONS: &'static [Implementation] =
        &[Implementation::Ours, Implementation::Naive];
    // With the system allocator the request generator itself saturates first.
    const DEFAULT_ALLOCATOR: &'static str = "mimalloc";
    const FIGURES: &'static [Figure] = &[
        Figure::new("elapsed_ms", "elapsed ms", 1.0, 0),
        Figure::new("target_rate", "target req/s", 1.0, 0),
        Figure::new("actual_rate", "actual req/s", 1.0, 0),
        Figure::new("cpu_ms", "process CPU ms", 1.0, 0),
        Figure::new("cpu_s_per_million", "CPU s per 1M requests", 1.0, 2),
        Figure::new("peak_rss_bytes", "peak RSS MiB", MIB, 1),
        Figure::new("completed", "completed", 1.0, 0),
        Figure::new("expired", "expired", 1.0, 0),
        Figure::new("expiry_late_p50_ms", "expiry late p50 ms", 1.0, 2),
        Figure::new("expiry_late_p99_ms", "expiry late p99 ms", 1.0, 2),
        Figure::new("expiry_late_max_ms", "expiry late max ms", 1.0, 2),
        Figure::new("stall_count", "machine stalls > 5 ms", 1.0, 0),
        Figure::new("stall_max_ms", "longest stall ms", 1.0, 1),
    ];
    /// The child draws its own progress line (requests issued, rate, pending).
    const PARENT_SPINNER: bool = false;

    type Implementation = Implementation;
    type Params = W3Params;
    type Result = W3Result;

    /// The parameters as command-line flags (Kafka's names).
    fn title(p: &W3Params) -> String {
        format!(
            "W3{}: --num {} --rate {} --timeout {} --pct50 {} --pct75 {} --keys {} --key-space-size {}",
            if p.events { "-events" } else { "" },
            p.num,
            p.rate,
            p.timeout_ms,
            p.pct50_ms,
            p.pct75_ms,
            p.keys,
            p.key_space
        )
    }

    fn run(implementation: Implementation, p: &W3Params) -> Result<W3Result, String> {
        run(implementation, p).map_err(|e| e.to_string())
    }

    fn measurement(job: Job<Self>) -> Measurement {
        Measurement::W3(job)
    }
}

/// Largest `--timeout` accepted, in ms (the completer's ring covers one timeout).
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// W3 parameters (Kafka's names).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct W3Params {
    /// Requests.
    pub num: usize,
    /// Target requests per second.
    pub rate: f64,
    /// Each operation's timeout, ms.
    pub timeout_ms: u64,
    /// Median completion latency, ms.
    pub pct50_ms: f64,
    /// 75th-percentile completion latency, ms.
    pub pct75_ms: f64,
    /// Keys per request.
    pub keys: usize,
    /// Distinct keys.
    pub key_space: u64,
    /// W3-events: complete through `check_and_complete` instead of forcing.
    pub events: bool,
    /// Shortest generator sleep, µs.
    pub pace_us: u64,
    /// Seed of the tables.
    pub seed: u64,
}

impl Default for W3Params {
    fn default() -> Self {
        W3Params {
            num: 1_000_000,
            rate: 10_000.0,
            timeout_ms: 200,
            pct50_ms: 20.0,
            pct75_ms: 60.0,
            keys: 3,
            key_space: 100,
            events: false,
            pace_us: 2_000,
            seed: 1,
        }
    }
}

impl W3Params {
    /// Checks the parameters; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.num == 0 || self.num > u32::MAX as usize {
            return Err(format!(
                "--num must be between 1 and {}, got {}",
                u32::MAX,
                self.num
            ));
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            return Err(format!(
                "--rate must be a positive number of requests/s, got {}",
                self.rate
            ));
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_TIMEOUT_MS {
            return Err(format!(
                "--timeout must be between 1 and {MAX_TIMEOUT_MS} ms, got {}",
                self.timeout_ms
            ));
        }
        if !(self.pct50_ms.is_finite() && self.pct50_ms > 0.0) {
            return Err(format!(
                "--pct50 must be a positive number of ms, got {}",
                self.pct50_ms
            ));
        }
        if !(self.pct75_ms.is_finite() && self.pct75_ms >= self.pct50_ms) {
            return Err(format!(
                "--pct75 ({}) must be at least --pct50 ({})",
                self.pct75_ms, self.pct50_ms
            ));
        }
        if self.keys == 0 || self.keys > 1000 {
            return Err(format!(
                "--keys must be between 1 and 1000, got {}",
                self.keys
            ));
        }
        if self.key_space < self.keys as u64 {
            return Err(format!(
                "--key-space-size ({}) must be at least --keys ({})",
                self.key_space, self.keys
            ));
        }
        Ok(())
    }
}

/// W3 figures of one implementation in one process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct W3Result {
    /// Which implementation.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Requests.
    pub num: usize,
    /// Time to issue every request, ms.
    pub elapsed_ms: f64,
    /// Target rate, requests/s.
    pub target_rate: f64,
    /// Achieved rate: `num / elapsed`.
    pub actual_rate: f64,
    /// Process CPU time from the first request until all were completed or expired, ms.
    pub cpu_ms: f64,
    /// CPU seconds per million requests.
    pub cpu_s_per_million: f64,
    /// Peak resident memory of the process, bytes.
    pub peak_rss_bytes: u64,
    /// Completed by an event or forced.
    pub completed: u64,
    /// Completed by their timeout.
    pub expired: u64,
    /// Expiry lateness (completion instant minus issue + timeout), median, ms.
    pub expiry_late_p50_ms: f64,
    /// Expiry lateness, 99th percentile, ms.
    pub expiry_late_p99_ms: f64,
    /// Expiry lateness, maximum, ms.
    pub expiry_late_max_ms: f64,
    /// Expiry lateness, minimum, ms (negative would mean an early expiry).
    pub expiry_late_min_ms: f64,
    /// Time from the last issue until every request was completed or expired, ms.
    pub drain_ms: f64,
    /// Machine stalls seen during the run (the probe's CPU is excluded from `cpu_ms`).
    #[serde(flatten)]
    pub stalls: Stalls,
}

/// Why a W3 run could not be made.
#[derive(Debug)]
pub enum W3Error {
    /// Bad parameters.
    Invalid(String),
    /// Building the purgatory failed.
    Setup(String),
}

impl std::fmt::Display for W3Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            W3Error::Invalid(m) => f.write_str(m),
            W3Error::Setup(e) => write!(f, "setup failed: {e}"),
        }
    }
}

impl std::error::Error for W3Error {}

/// Runs W3 with `implementation`, in this process.
pub fn run(implementation: Implementation, p: &W3Params) -> Result<W3Result, W3Error> {
    p.validate().map_err(W3Error::Invalid)?;
    let name = implementation_name(&implementation);
    let name = name.as_str();
    match implementation {
        Implementation::Ours => {
            let purgatory = purgatory::Purgatory::<u64, LoadOp>::builder()
                .name("w3")
                .build()
                .map_err(|e| W3Error::Setup(e.to_string()))?;
            Ok(run_with(name, &purgatory, p))
        }
        Implementation::OursPool => {
            let pool = purgatory::Executor::pool(2).map_err(|e| W3Error::Setup(e.to_string()))?;
            let purgatory = purgatory::Purgatory::<u64, LoadOp>::builder()
                .name("w3")
                .timer(purgatory::TimerBuilder::new().executor(pool))
                .build()
                .map_err(|e| W3Error::Setup(e.to_string()))?;
            Ok(run_with(name, &purgatory, p))
        }
        Implementation::OursNoStandIn => {
            let purgatory = purgatory::Purgatory::<u64, LoadOp>::builder()
                .name("w3")
                .timer(purgatory::TimerBuilder::new().stand_in(None))
                .build()
                .map_err(|e| W3Error::Setup(e.to_string()))?;
            Ok(run_with(name, &purgatory, p))
        }
        Implementation::Naive => {
            let purgatory = NaivePurgatory::<u64, LoadOp>::start(1000)
                .map_err(|e| W3Error::Setup(e.to_string()))?;
            Ok(run_with(name, &purgatory, p))
        }
        Implementation::Null if p.events => Err(W3Error::Invalid(
            "`null` measures the tool alone and cannot run W3-events".into(),
        )),
        Implementation::Null => Ok(run_with(name, &null::NullPurgatory, p)),
        Implementation::NullLate if p.events => Err(W3Error::Invalid(
            "`null-late` is a test fixture for plain W3 and cannot run W3-events".into(),
        )),
        Implementation::NullLate => {
            let purgatory =
                null_late::LateNullPurgatory::start().map_err(|e| W3Error::Setup(e.to_string()))?;
            Ok(run_with(name, &purgatory, p))
        }
        Implementation::TokioTask => {
            let purgatory = TokioTaskPurgatory::<LoadOp>::start(1000)
                .map_err(|e| W3Error::Setup(e.to_string()))?;
            Ok(run_with(name, &purgatory, p))
        }
        Implementation::TokioDelayqueue => {
            let purgatory = TokioDelayQueuePurgatory::<LoadOp>::start(1000)
                .map_err(|e| W3Error::Setup(e.to_string()))?;
            Ok(run_with(name, &purgatory, p))
        }
    }
}

/// Runs W3 against `purgatory` (parameters already validated).
pub fn run_with<P: LoadPurgatory<LoadOp>>(name: &str, purgatory: &P, p: &W3Params) -> W3Result {
    let timeout = Duration::from_millis(p.timeout_ms);
    let schedule = generator::Schedule {
        gaps: CyclicTable::poisson_gaps_nanos(p.rate, 16, p.seed),
        latencies: CyclicTable::log_normal_latency_nanos(p.pct50_ms, p.pct75_ms, 16, p.seed + 1),
        keys: KeyTable::new(p.keys, p.key_space, 16, p.seed + 2),
    };
    let ctx: &'static LoadContext = Box::leak(Box::new(LoadContext::new(p.num, timeout, p.events)));
    // Made before the clock starts: the completer's memory is the tool's, not the run's
    // (see `completer`).
    let ring = completer::Ring::new(timeout, Duration::from_micros(p.pace_us.max(1_000)), p.rate);
    let inbox = completer::Inbox::with_capacity(ring.hand_over_capacity());
    let issued = AtomicU64::new(0);
    let cpu = NetCpu::start();
    let show_progress = std::io::stderr().is_terminal();
    let generated = std::thread::scope(|scope| {
        let completer = std::thread::Builder::new()
            .name("w3-completer".into())
            .spawn_scoped(scope, || {
                completer::run(purgatory, &inbox, ctx, &schedule.keys, ring)
            });
        let progress = show_progress.then(|| {
            Progress::start(scope, format!("w3 {name}"), p.num as u64, || {
                let issued = issued.load(Ordering::Relaxed);
                (
                    issued,
                    issued.saturating_sub(ctx.completed() + ctx.expired()),
                )
            })
        });
        let generated = generator::run(
            purgatory,
            ctx,
            &schedule,
            &inbox,
            p.num,
            timeout,
            p.events,
            Duration::from_micros(p.pace_us),
            &issued,
        );
        inbox.close();
        if let Ok(completer) = completer {
            let _ = completer.join();
        }
        // Everything left must expire within one timeout; allow generous slack.
        let limit = Instant::now() + timeout + Duration::from_secs(30);
        while ctx.completed() + ctx.expired() < p.num as u64 && Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(progress) = progress {
            progress.finish();
        }
        generated
    });
    let drained_nanos = ctx.now_nanos();
    let (cpu, stalls) = cpu.finish();
    let peak = peak_resident_bytes();
    purgatory.shutdown();
    let elapsed_nanos = generated
        .end_nanos
        .saturating_sub(generated.start_nanos)
        .max(1);
    let ms = |v: Option<i64>| v.map_or(0.0, |v| v as f64 / 1e6);
    let lateness = ctx.lateness();
    W3Result {
        implementation: name.to_owned(),
        num: p.num,
        elapsed_ms: elapsed_nanos as f64 / 1e6,
        target_rate: p.rate,
        actual_rate: p.num as f64 / (elapsed_nanos as f64 / 1e9),
        cpu_ms: cpu.as_secs_f64() * 1e3,
        cpu_s_per_million: cpu.as_secs_f64() * 1e6 / p.num as f64,
        peak_rss_bytes: peak,
        completed: ctx.completed(),
        expired: ctx.expired(),
        expiry_late_p50_ms: ms(lateness.percentile(50.0)),
        expiry_late_p99_ms: ms(lateness.percentile(99.0)),
        expiry_late_max_ms: ms(lateness.max()),
        expiry_late_min_ms: ms(lateness.min()),
        drain_ms: drained_nanos.saturating_sub(generated.end_nanos) as f64 / 1e6,
        stalls,
    }
}
