//! The `purgatory-perf` command line as clap types, and their conversion to each
//! workload's parameters.
//!
//! # Invariants
//! - This grammar is an interface people script against: subcommands, flags, `--impl`
//!   names and help texts change only on purpose. `--impl` stays a list of free strings
//!   here (so its help and its "unknown implementation" message stay the tool's own); the
//!   parent maps each name to the workload's `ValueEnum` before anything runs.
//! - Syntax and range errors are clap's; the checks that need several values together
//!   are [`W3Args::params`]'s and [`W3Params::validate`]'s.

use clap::{Args, Parser, Subcommand};

use crate::workloads::w1::W1Params;
use crate::workloads::w2::W2Params;
use crate::workloads::w3::W3Params;
use crate::workloads::Workload;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "purgatory-perf",
    version,
    about = "Load tool for timer-core and purgatory: workloads W1-W3 of workloads.md, ours vs peers.",
    long_about = "Load tool for timer-core and purgatory: workloads W1 (timer churn), W2 (timer \
expiry on the real clock) and W3 (Kafka's purgatory load test), ours against peer \
implementations. Every implementation and run is measured in a fresh process of its own.\n\n\
Without arguments it runs a ~15 s demo: W3-low-timeout at 100,000 requests/s for 750,000 \
requests, ours vs naive.",
    after_help = "Examples:\n  purgatory-perf w1 --runs 3\n  purgatory-perf w1 --threads 2\n  \
purgatory-perf w2\n  purgatory-perf w3 --num 1000000 --rate 10000 --timeout 200 --pct50 20 --pct75 60\n  \
purgatory-perf w3 --num 3000000 --rate 250000 --find-max --impl ours\n  \
purgatory-perf w3 --num 3000000 --rate 1500000 --find-max --max-late-p99-ms 10 --impl ours,tokio-delayqueue\n  \
purgatory-perf w3 --num 300000 --rate 250000 --find-max --plot sweep.svg --impl ours,naive,tokio-task"
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Option<Command>,
    /// Internal: run one measurement job (JSON) in this process.
    #[arg(long, hide = true)]
    pub(super) child: Option<String>,
}

/// The subcommands: one per workload.
#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// W1: timer churn, 1M adds, 90 % random-order cancels, a second wave of 1M adds.
    W1(W1Args),
    /// W2: 200k timers with deadlines in [0, 2 s] fired on the real clock.
    W2(W2Args),
    /// W3: Kafka's purgatory load test (TestPurgatoryPerformance).
    W3(W3Args),
}

/// The options every workload takes.
#[derive(Debug, Args)]
pub(super) struct Common {
    /// Implementations, comma-separated. w1: ours, binaryheap, btreemap, delayqueue
    /// (default) and the diagnostics wheel (our bare wheel), locked-wheel (the same
    /// behind one mutex) and ours-batch (our timer through its batch calls); w2: ours,
    /// binaryheap (a thread over Mutex<BinaryHeap> + Condvar), delayqueue; w3: ours,
    /// naive (default), null (no purgatory: the tool's own cost), tokio-task (a tokio task
    /// per request) and tokio-delayqueue (one task driving a tokio-util DelayQueue); and
    /// null-late, a test fixture (null with every expiry 50 ms late).
    #[arg(long = "impl", value_delimiter = ',')]
    pub(super) implementations: Vec<String>,
    /// Repeat each measurement this many times, each in a fresh process; report medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(super) runs: u32,
    /// Print a JSON object with every figure as the last stdout line.
    #[arg(long)]
    pub(super) json: bool,
    /// Global allocator of the measurement processes (default: system for w1/w2,
    /// mimalloc for w3).
    #[arg(long, value_parser = ["system", "mimalloc"])]
    pub(super) allocator: Option<String>,
}

impl Common {
    /// `--allocator`, else workload `W`'s default.
    pub(super) fn allocator<W: Workload>(&self) -> &str {
        self.allocator.as_deref().unwrap_or(W::DEFAULT_ALLOCATOR)
    }
}

/// `w1`'s options.
#[derive(Debug, Args)]
pub(super) struct W1Args {
    /// Tasks per wave (over all threads).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    tasks: u64,
    /// Threads adding and cancelling concurrently (W1-mt: 2). With more than 1, each
    /// implementation is also run on 1 thread to report the speedup.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    threads: u64,
    /// Percentage of the first wave cancelled.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u32).range(0..=100))]
    cancel_pct: u32,
    /// Seed of the inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    pub(super) common: Common,
}

/// `w2`'s options.
#[derive(Debug, Args)]
pub(super) struct W2Args {
    /// Tasks.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    tasks: u64,
    /// Latest deadline, ms after the start.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    max_deadline_ms: u64,
    /// Seed of the deadlines.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    pub(super) common: Common,
}

/// `w3`'s options.
#[derive(Debug, Args)]
pub(super) struct W3Args {
    /// Number of requests.
    #[arg(long, default_value_t = 1_000_000)]
    num: u64,
    /// Target request rate, requests/s.
    #[arg(long, default_value_t = 10_000.0, allow_negative_numbers = true)]
    rate: f64,
    /// Timeout of each operation, ms.
    #[arg(long, default_value_t = 200, allow_negative_numbers = true)]
    timeout: i64,
    /// Median completion latency, ms.
    #[arg(long, default_value_t = 20.0, allow_negative_numbers = true)]
    pct50: f64,
    /// 75th-percentile completion latency, ms.
    #[arg(long, default_value_t = 60.0, allow_negative_numbers = true)]
    pct75: f64,
    /// Keys per request.
    #[arg(long, default_value_t = 3)]
    keys: usize,
    /// Number of distinct keys.
    #[arg(long = "key-space-size", default_value_t = 100)]
    key_space_size: u64,
    /// W3-events: mark requests ready and call check_and_complete on a key instead of
    /// force-completing them.
    #[arg(long)]
    events: bool,
    /// Find the highest rate held, starting at --rate, doubling (or halving, if the
    /// starting rate is not held), then bisecting. A rate is held on time when the actual
    /// rate reaches 95 % of the target and the expiry lateness p99 is within
    /// --max-late-p99-ms; the search reports that rate first, then the plain one (95 %
    /// alone, lateness not counted). Implementations step through their searches in
    /// turn (one attempt each, then the next), so a slow phase of the machine hits all.
    /// Each rate is decided by a majority of up to --attempts attempts at it; the rate
    /// reported is the highest one decided held, with how many of its attempts held and
    /// the median lateness p99 and peak memory of those.
    #[arg(long)]
    pub(super) find_max: bool,
    /// With --find-max: decide each rate tried by a majority of up to this many attempts
    /// (odd), stopping once the majority is settled (with 3: two agreeing attempts, or a
    /// third on a split); the on-time search's attempts count for the plain one too. 1
    /// decides each rate by one attempt.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "find_max", value_parser = attempt_count, allow_negative_numbers = true)]
    pub(super) attempts: u32,
    /// With --find-max: the expiry lateness p99 a rate is held on time within, ms
    /// [default: 10].
    #[arg(long, value_name = "MS", requires = "find_max", value_parser = lateness_bound, allow_negative_numbers = true)]
    pub(super) max_late_p99_ms: Option<f64>,
    /// With --find-max: search the plain rate only (actual >= 95 % of target, lateness not
    /// counted), as the tool did before the on-time search; fewer attempts.
    #[arg(long, requires = "find_max", conflicts_with = "max_late_p99_ms")]
    pub(super) plain: bool,
    /// With --find-max: also draw the sweep as an SVG picture at this path (CPU s per
    /// 1M requests against the offered rate, one line per implementation, knees marked).
    #[arg(long, value_name = "FILE.svg", requires = "find_max")]
    pub(super) plot: Option<std::path::PathBuf>,
    /// Shortest generator sleep in µs when ahead of schedule (bursts requests at low rates
    /// to save wake-ups; the average rate is unchanged), and the completer's tick (at
    /// least 1 ms): completions happen within one tick after they are due.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pace_us: u64,
    /// Seed of the tables.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    pub(super) common: Common,
}

/// The lateness bound a rate is held on time within by default, ms.
pub(super) const DEFAULT_MAX_LATE_P99_MS: f64 = 10.0;

/// `--max-late-p99-ms`: a finite number of ms, at least 0.
fn lateness_bound(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(ms) if ms.is_finite() && ms >= 0.0 => Ok(ms),
        _ => Err(format!("expected a number of ms, at least 0, got `{text}`")),
    }
}

/// The most attempts `--attempts` takes: a search of ~11 rates then runs up to 11 x
/// this many W3 runs per implementation.
const MAX_ATTEMPTS: u32 = 99;

/// `--attempts`: an odd count from 1 to [`MAX_ATTEMPTS`], so a majority is never tied.
fn attempt_count(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(n) if n % 2 == 1 && n <= MAX_ATTEMPTS => Ok(n),
        _ => Err(format!(
            "expected an odd number of attempts from 1 to {MAX_ATTEMPTS} (a rate is decided \
by their majority, which an even count can tie), got `{text}`"
        )),
    }
}

impl W1Args {
    /// The run's parameters.
    pub(super) fn params(&self) -> W1Params {
        W1Params {
            tasks: self.tasks as usize,
            cancel_pct: self.cancel_pct,
            threads: self.threads as usize,
            seed: self.seed,
            ..W1Params::default()
        }
    }
}

impl W2Args {
    /// The run's parameters.
    pub(super) fn params(&self) -> W2Params {
        W2Params {
            tasks: self.tasks as usize,
            max_deadline_ms: self.max_deadline_ms,
            seed: self.seed,
        }
    }
}

impl W3Args {
    /// With --find-max: the lateness bound of a rate held on time, ms; `None` with
    /// `--plain`.
    pub(super) fn on_time_bound(&self) -> Option<f64> {
        (!self.plain).then(|| self.max_late_p99_ms.unwrap_or(DEFAULT_MAX_LATE_P99_MS))
    }

    /// The run's parameters, checked; the message says what is wrong.
    pub(super) fn params(&self) -> Result<W3Params, String> {
        if self.timeout < 1 {
            return Err(format!(
                "--timeout must be at least 1 ms, got {}",
                self.timeout
            ));
        }
        let p = W3Params {
            num: usize::try_from(self.num).unwrap_or(usize::MAX),
            rate: self.rate,
            timeout_ms: self.timeout as u64,
            pct50_ms: self.pct50,
            pct75_ms: self.pct75,
            keys: self.keys,
            key_space: self.key_space_size,
            events: self.events,
            pace_us: self.pace_us,
            seed: self.seed,
        };
        p.validate()?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `w3 --find-max` with `extra`, parsed.
    fn find_max(extra: &[&str]) -> Result<W3Args, clap::Error> {
        let args = ["purgatory-perf", "w3", "--find-max"].iter().chain(extra);
        match Cli::try_parse_from(args)?.command {
            Some(Command::W3(a)) => Ok(a),
            other => panic!("not w3: {other:?}"),
        }
    }

    #[test]
    fn attempts_is_an_odd_count_three_by_default() {
        assert_eq!(find_max(&[]).unwrap().attempts, 3);
        assert_eq!(find_max(&["--attempts", "1"]).unwrap().attempts, 1);
        assert_eq!(find_max(&["--attempts", "5"]).unwrap().attempts, 5);
        for bad in ["0", "2", "4", "-1", "101", "three"] {
            let e = find_max(&["--attempts", bad]).expect_err(bad).to_string();
            assert!(
                e.contains("--attempts") && e.contains("an odd number of attempts"),
                "{bad}: {e}"
            );
        }
        let e = Cli::try_parse_from(["purgatory-perf", "w3", "--attempts", "3"])
            .expect_err("--attempts without --find-max")
            .to_string();
        assert!(e.contains("--find-max"), "{e}");
    }
}
