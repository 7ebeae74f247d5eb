//! The `purgatory-perf` command line: subcommands `w1`, `w2`, `w3`, the default demo,
//! and the parent side of the one-process-per-measurement protocol ([`crate::harness::child`]).
//!
//! # Invariants
//! - Bad arguments end in a message on stderr and a non-zero exit status (2), never a
//!   panic; clap reports syntax errors, [`W3Params::validate`] and the checks here the rest.
//! - Runs interleave implementations (run 1 of each, then run 2 of each, ...), so a slow
//!   phase of the shared machine hits every implementation alike.
//! - With `--json` the last stdout line is one JSON object holding every figure; the
//!   table goes before it.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use serde_json::{Map, Value};

use crate::harness::child::{
    run_here, run_in_child, ChildJob, W1_ALL_IMPLEMENTATIONS, W1_IMPLEMENTATIONS,
};
use crate::harness::progress::spinner;
use crate::report::{summary_json, table, ImplRuns, W1_FIGURES, W2_FIGURES, W3_FIGURES};
use crate::workloads::w1::W1Params;
use crate::workloads::w2::W2Params;
use crate::workloads::w3::{
    W3Params, ALL_IMPLEMENTATIONS as W3_ALL_IMPLEMENTATIONS, IMPLEMENTATIONS as W3_IMPLEMENTATIONS,
};

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
purgatory-perf w3 --num 3000000 --rate 250000 --find-max --impl ours"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Workload>,
    /// Internal: run one measurement job (JSON) in this process.
    #[arg(long, hide = true)]
    child: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Workload {
    /// W1: timer churn, 1M adds, 90 % random-order cancels, a second wave of 1M adds.
    W1(W1Args),
    /// W2: 200k timers with deadlines in [0, 2 s] fired on the real clock.
    W2(W2Args),
    /// W3: Kafka's purgatory load test (TestPurgatoryPerformance).
    W3(W3Args),
}

#[derive(Debug, Args)]
struct Common {
    /// Implementations, comma-separated. w1: ours, binaryheap, btreemap, delayqueue
    /// (default) and the diagnostics wheel (our bare wheel), locked-wheel (the same
    /// behind one mutex) and ours-batch (our timer through its batch calls); w2: ours,
    /// binaryheap (a thread over Mutex<BinaryHeap> + Condvar), delayqueue; w3: ours,
    /// naive (default) and null (no purgatory: the tool's own cost).
    #[arg(long = "impl", value_delimiter = ',')]
    implementations: Vec<String>,
    /// Repeat each measurement this many times, each in a fresh process; report medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// Print a JSON object with every figure as the last stdout line.
    #[arg(long)]
    json: bool,
    /// Global allocator of the measurement processes (default: system for w1/w2,
    /// mimalloc for w3).
    #[arg(long, value_parser = ["system", "mimalloc"])]
    allocator: Option<String>,
}

impl Common {
    fn allocator(&self, default: &'static str) -> String {
        self.allocator.clone().unwrap_or_else(|| default.to_owned())
    }
}

#[derive(Debug, Args)]
struct W1Args {
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
    common: Common,
}

#[derive(Debug, Args)]
struct W2Args {
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
    common: Common,
}

#[derive(Debug, Args)]
struct W3Args {
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
    /// Find the highest rate held (actual >= 95 % of target), starting at --rate,
    /// doubling, then bisecting.
    #[arg(long)]
    find_max: bool,
    /// Shortest generator sleep in µs when ahead of schedule (bursts requests at low rates
    /// to save wake-ups; the average rate is unchanged), and the completer's tick (at
    /// least 1 ms): completions happen within one tick after they are due.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(0..=100_000))]
    pace_us: u64,
    /// Seed of the tables.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    common: Common,
}

/// Runs the tool with the process's arguments.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let outcome = match (&cli.child, cli.command) {
        (Some(job), _) => run_child(job),
        (None, Some(Workload::W1(a))) => w1(a),
        (None, Some(Workload::W2(a))) => w2(a),
        (None, Some(Workload::W3(a))) => w3(a),
        (None, None) => demo(),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("purgatory-perf: error: {message}");
            ExitCode::from(2)
        }
    }
}

fn run_child(job: &str) -> Result<(), String> {
    let job: ChildJob = serde_json::from_str(job).map_err(|e| format!("bad child job: {e}"))?;
    let result = run_here(&job)?;
    println!("{result}");
    Ok(())
}

fn pick(
    requested: &[String],
    defaults: &[&str],
    known: &[&str],
    workload: &str,
) -> Result<Vec<String>, String> {
    if requested.is_empty() {
        return Ok(defaults.iter().map(|s| (*s).to_owned()).collect());
    }
    let mut out: Vec<String> = Vec::new();
    for name in requested {
        let name = name.trim().to_ascii_lowercase();
        if !known.contains(&name.as_str()) {
            return Err(format!(
                "unknown implementation `{name}` for {workload}; choose from: {}",
                known.join(", ")
            ));
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

/// Runs `job(impl)` `runs` times for each implementation, interleaved, each in a child.
fn measure(
    label: &str,
    allocator: &str,
    implementations: &[String],
    runs: u32,
    show: bool,
    job: impl Fn(&str) -> ChildJob,
) -> Result<Vec<ImplRuns>, String> {
    let mut all: Vec<ImplRuns> = implementations
        .iter()
        .map(|name| ImplRuns {
            name: name.clone(),
            runs: Vec::new(),
        })
        .collect();
    let bar = spinner(show);
    for run in 1..=runs {
        for entry in &mut all {
            bar.set_message(format!("{label}: {} run {run}/{runs}", entry.name));
            let result = run_in_child(&job(&entry.name), allocator)
                .map_err(|e| format!("{label} {} run {run}: {e}", entry.name))?;
            entry.runs.push(result);
        }
    }
    bar.finish_and_clear();
    Ok(all)
}

fn emit(
    title: &str,
    figures: &[crate::report::Figure],
    all: &[ImplRuns],
    json: bool,
    summary: Value,
) {
    println!("{}", table(title, figures, all));
    if json {
        println!("{summary}");
    }
}

fn show_progress(json: bool) -> bool {
    use std::io::IsTerminal;
    !json && std::io::stderr().is_terminal()
}

fn w1(a: W1Args) -> Result<(), String> {
    let implementations = pick(
        &a.common.implementations,
        &W1_IMPLEMENTATIONS,
        &W1_ALL_IMPLEMENTATIONS,
        "w1",
    )?;
    let params = W1Params {
        tasks: a.tasks as usize,
        cancel_pct: a.cancel_pct,
        threads: a.threads as usize,
        ..W1Params::default()
    };
    let params = W1Params {
        seed: a.seed,
        ..params
    };
    let show = show_progress(a.common.json);
    let job = |p: &W1Params| {
        let p = p.clone();
        move |name: &str| ChildJob::W1 {
            implementation: name.to_owned(),
            params: p.clone(),
        }
    };
    let allocator = a.common.allocator("system");
    let mut all = measure(
        "w1",
        &allocator,
        &implementations,
        a.common.runs,
        show,
        job(&params),
    )?;
    let mut title = format!(
        "W1 timer churn: {} tasks, {} % cancelled, {} thread(s)",
        params.tasks, params.cancel_pct, params.threads
    );
    if params.threads > 1 {
        let single = W1Params {
            threads: 1,
            ..params.clone()
        };
        let base = measure(
            "w1 (1 thread)",
            &allocator,
            &implementations,
            a.common.runs,
            show,
            job(&single),
        )?;
        for (multi, one) in all.iter_mut().zip(&base) {
            let one = crate::report::spreads(&one.runs);
            for run in &mut multi.runs {
                add_speedups(run, &one);
            }
        }
        title.push_str(" (ns = wall time / ops of all threads)");
    }
    let summary = summary_json(
        "w1",
        serde_json::to_value(&params).unwrap_or_default(),
        &all,
        Map::new(),
    );
    emit(&title, W1_FIGURES, &all, a.common.json, summary);
    Ok(())
}

fn add_speedups(
    run: &mut Value,
    single: &std::collections::BTreeMap<String, crate::report::statistics::Spread>,
) {
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

fn w2(a: W2Args) -> Result<(), String> {
    let implementations = pick(
        &a.common.implementations,
        &crate::workloads::w2::IMPLEMENTATIONS,
        &crate::workloads::w2::IMPLEMENTATIONS,
        "w2",
    )?;
    let params = W2Params {
        tasks: a.tasks as usize,
        max_deadline_ms: a.max_deadline_ms,
        seed: a.seed,
    };
    let show = show_progress(a.common.json);
    let allocator = a.common.allocator("system");
    let all = measure(
        "w2",
        &allocator,
        &implementations,
        a.common.runs,
        show,
        |name| ChildJob::W2 {
            implementation: name.to_owned(),
            params: params.clone(),
        },
    )?;
    let title = format!(
        "W2 timer expiry: {} tasks, deadlines uniform in [0, {}] ms, real clock",
        params.tasks, params.max_deadline_ms
    );
    let summary = summary_json(
        "w2",
        serde_json::to_value(&params).unwrap_or_default(),
        &all,
        Map::new(),
    );
    emit(&title, W2_FIGURES, &all, a.common.json, summary);
    Ok(())
}

fn w3_params(a: &W3Args) -> Result<W3Params, String> {
    if a.timeout < 1 {
        return Err(format!(
            "--timeout must be at least 1 ms, got {}",
            a.timeout
        ));
    }
    let p = W3Params {
        num: usize::try_from(a.num).unwrap_or(usize::MAX),
        rate: a.rate,
        timeout_ms: a.timeout as u64,
        pct50_ms: a.pct50,
        pct75_ms: a.pct75,
        keys: a.keys,
        key_space: a.key_space_size,
        events: a.events,
        pace_us: a.pace_us,
        seed: a.seed,
    };
    p.validate()?;
    Ok(p)
}

fn w3_title(p: &W3Params) -> String {
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

fn w3(a: W3Args) -> Result<(), String> {
    let implementations = pick(
        &a.common.implementations,
        &W3_IMPLEMENTATIONS,
        &W3_ALL_IMPLEMENTATIONS,
        "w3",
    )?;
    let params = w3_params(&a)?;
    let allocator = a.common.allocator("mimalloc");
    if a.find_max {
        return find_max(&implementations, &params, a.common.json, &allocator);
    }
    let all = measure(
        "w3",
        &allocator,
        &implementations,
        a.common.runs,
        false,
        |name| ChildJob::W3 {
            implementation: name.to_owned(),
            params: params.clone(),
        },
    )?;
    let summary = summary_json(
        "w3",
        serde_json::to_value(&params).unwrap_or_default(),
        &all,
        Map::new(),
    );
    emit(&w3_title(&params), W3_FIGURES, &all, a.common.json, summary);
    Ok(())
}

/// Held: the actual rate reached 95 % of the target.
fn held(result: &Value, target: f64) -> bool {
    result["actual_rate"].as_f64().unwrap_or(0.0) >= 0.95 * target
}

fn find_max(
    implementations: &[String],
    params: &W3Params,
    json: bool,
    allocator: &str,
) -> Result<(), String> {
    const BISECT_STEPS: u32 = 4;
    const MAX_RATE: f64 = 64e6;
    let mut results = Vec::new();
    let mut text = format!(
        "W3-max (highest rate held at >= 95 %): {}\n",
        w3_title(params)
    );
    for name in implementations {
        let mut attempts = Vec::new();
        let mut try_rate = |rate: f64| -> Result<bool, String> {
            let p = W3Params {
                rate,
                ..params.clone()
            };
            let r = run_in_child(
                &ChildJob::W3 {
                    implementation: name.clone(),
                    params: p,
                },
                allocator,
            )?;
            let ok = held(&r, rate);
            eprintln!(
                "  {name}: target {rate:.0}/s -> actual {:.0}/s {}",
                r["actual_rate"].as_f64().unwrap_or(0.0),
                if ok { "held" } else { "NOT held" }
            );
            attempts.push(serde_json::json!({ "target_rate": rate, "held": ok, "result": r }));
            Ok(ok)
        };
        let mut low = 0.0;
        let mut high = params.rate;
        while try_rate(high)? {
            low = high;
            high *= 2.0;
            if high > MAX_RATE {
                break;
            }
        }
        if low > 0.0 && high <= MAX_RATE {
            for _ in 0..BISECT_STEPS {
                let mid = ((low + high) / 2.0).round();
                if try_rate(mid)? {
                    low = mid;
                } else {
                    high = mid;
                }
            }
        }
        let _ = writeln!(
            text,
            "  {name}: highest rate held {low:.0} req/s (first failing rate {high:.0})"
        );
        results.push(serde_json::json!({
            "impl": name,
            "max_rate_held": low,
            "first_failed_rate": high,
            "attempts": attempts,
        }));
    }
    use std::fmt::Write as _;
    println!("{text}");
    if json {
        let summary = serde_json::json!({
            "workload": "w3-max",
            "params": params,
            "results": results,
        });
        println!("{summary}");
    }
    Ok(())
}

fn demo() -> Result<(), String> {
    eprintln!(
        "purgatory-perf demo: W3-low-timeout, 750,000 requests at 100,000/s, ours vs naive \
(about 15 s; see --help for the workloads)"
    );
    let params = W3Params {
        num: 750_000,
        rate: 100_000.0,
        ..W3Params::default()
    };
    let implementations = vec!["ours".to_owned(), "naive".to_owned()];
    let all = measure("w3", "mimalloc", &implementations, 1, false, |name| {
        ChildJob::W3 {
            implementation: name.to_owned(),
            params: params.clone(),
        }
    })?;
    let summary = summary_json(
        "w3",
        serde_json::to_value(&params).unwrap_or_default(),
        &all,
        Map::new(),
    );
    emit(&w3_title(&params), W3_FIGURES, &all, false, summary);
    Ok(())
}
