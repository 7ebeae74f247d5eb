//! The `purgatory-perf` tool: reads the command line (`args.rs`), and either runs one
//! measurement job in this process (a child) or, as the parent, takes one workload
//! through the one path every workload shares (`run_workload`): pick the
//! implementations, measure each in child processes, summarise, print. W3's `--find-max`
//! (on time and plain, and its `--plot`) is `max_rate.rs`, over the search of
//! `rate_search.rs` with each rate decided by a majority of attempts
//! (`majority_search.rs`); without arguments the tool runs a short W3 demo.
//!
//! # Invariants
//! - Bad arguments end in a message on stderr and a non-zero exit status (2), never a
//!   panic; clap reports syntax errors, `args.rs` and the workload the rest.
//! - Every implementation named is checked before the first measurement starts.
//! - Runs interleave implementations (run 1 of each, then run 2 of each, ...), so a slow
//!   phase of the shared machine hits every implementation alike.
//! - With `--json` the last stdout line is one JSON object holding every figure; the
//!   table goes before it.

mod args;
mod majority_search;
mod max_rate;
mod rate_search;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};

use crate::harness::child::serve;
use crate::harness::progress::spinner;
use crate::report::json::summary_json;
use crate::report::table::table;
use crate::report::{spreads, ImplRuns};
use crate::workloads::w1::TimerChurn;
use crate::workloads::w2::TimerExpiry;
use crate::workloads::w3::{PurgatoryLoad, W3Params};
use crate::workloads::{implementation_name, Job, Measurement, Workload};

use self::args::{Cli, Command, Common};

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
        (Some(job), _) => serve(job, Measurement::run_here),
        (None, Some(Command::W1(a))) => run_workload::<TimerChurn>(&a.common, || Ok(a.params())),
        (None, Some(Command::W2(a))) => run_workload::<TimerExpiry>(&a.common, || Ok(a.params())),
        (None, Some(Command::W3(a))) if a.find_max => {
            pick::<PurgatoryLoad>(&a.common.implementations).and_then(|implementations| {
                let params = a.params()?;
                if a.common.runs != 1 {
                    return Err(
                        "--runs does not apply to --find-max: each attempt is one run \
and the implementations take turns; run the search again to repeat it"
                            .into(),
                    );
                }
                let allocator = a.common.allocator::<PurgatoryLoad>();
                let plot = a.plot.as_deref();
                let bound = a.on_time_bound();
                max_rate::find_max(
                    &implementations,
                    &params,
                    bound,
                    a.attempts as usize,
                    a.common.json,
                    allocator,
                    plot,
                )
            })
        }
        (None, Some(Command::W3(a))) => run_workload::<PurgatoryLoad>(&a.common, || a.params()),
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

/// The path every workload takes: picks the implementations (`--impl`, else the
/// workload's defaults), makes the parameters, measures, relates the runs to a baseline
/// where the workload has one, then prints the table and, with `--json`, the summary.
fn run_workload<W: Workload>(
    common: &Common,
    params: impl FnOnce() -> Result<W::Params, String>,
) -> Result<(), String> {
    let implementations = pick::<W>(&common.implementations)?;
    let params = params()?;
    let allocator = common.allocator::<W>();
    let show = W::PARENT_SPINNER && !common.json && std::io::stderr().is_terminal();
    let measure = |label: &str, params: &W::Params| {
        measure::<W>(
            label,
            allocator,
            &implementations,
            common.runs,
            show,
            params,
        )
    };
    let mut all = measure(W::NAME, &params)?;
    if let Some((label, baseline)) = W::baseline(&params) {
        let baseline = measure(label, &baseline)?;
        for (runs, base) in all.iter_mut().zip(&baseline) {
            let base = spreads(&base.runs);
            for run in &mut runs.runs {
                W::relate_to_baseline(run, &base);
            }
        }
    }
    println!("{}", table(&W::title(&params), W::FIGURES, &all));
    if common.json {
        let params = serde_json::to_value(&params).unwrap_or_default();
        println!("{}", summary_json(W::NAME, params, &all));
    }
    Ok(())
}

/// The implementations named on the command line, deduplicated in the order given, or
/// the workload's defaults when none is. Names are trimmed and compared ignoring case.
fn pick<W: Workload>(requested: &[String]) -> Result<Vec<W::Implementation>, String> {
    if requested.is_empty() {
        return Ok(W::DEFAULT_IMPLEMENTATIONS.to_vec());
    }
    let mut picked = Vec::new();
    for name in requested {
        let name = name.trim().to_ascii_lowercase();
        let Ok(implementation) = W::Implementation::from_str(&name, false) else {
            let known: Vec<String> = W::Implementation::value_variants()
                .iter()
                .map(implementation_name)
                .collect();
            return Err(format!(
                "unknown implementation `{name}` for {}; choose from: {}",
                W::NAME,
                known.join(", ")
            ));
        };
        if !picked.contains(&implementation) {
            picked.push(implementation);
        }
    }
    Ok(picked)
}

/// Runs each implementation `runs` times with `params`, interleaved, each run in a
/// child process of its own; `show` draws a spinner labelled `label`.
fn measure<W: Workload>(
    label: &str,
    allocator: &str,
    implementations: &[W::Implementation],
    runs: u32,
    show: bool,
    params: &W::Params,
) -> Result<Vec<ImplRuns>, String> {
    let mut all: Vec<ImplRuns> = implementations
        .iter()
        .map(|implementation| ImplRuns {
            name: implementation_name(implementation),
            runs: Vec::new(),
        })
        .collect();
    let bar = spinner(show);
    for run in 1..=runs {
        for (entry, &implementation) in all.iter_mut().zip(implementations) {
            bar.set_message(format!("{label}: {} run {run}/{runs}", entry.name));
            let job = Job::<W> {
                implementation,
                params: params.clone(),
            };
            let result = job
                .run_in_child(allocator)
                .map_err(|e| format!("{label} {} run {run}: {e}", entry.name))?;
            entry.runs.push(result);
        }
    }
    bar.finish_and_clear();
    Ok(all)
}

/// The demo: W3-low-timeout at 100,000 requests/s for 750,000 requests, ours vs naive,
/// the same as `w3 --num 750000 --rate 100000 --impl ours,naive`.
fn demo() -> Result<(), String> {
    eprintln!(
        "purgatory-perf demo: W3-low-timeout, 750,000 requests at 100,000/s, ours vs naive \
(about 15 s; see --help for the workloads)"
    );
    let common = Common {
        implementations: vec!["ours".to_owned(), "naive".to_owned()],
        runs: 1,
        json: false,
        allocator: None,
    };
    run_workload::<PurgatoryLoad>(&common, || {
        Ok(W3Params {
            num: 750_000,
            rate: 100_000.0,
            ..W3Params::default()
        })
    })
}
