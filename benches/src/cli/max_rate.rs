//! W3-max (`w3 --find-max`): the highest request rate each implementation holds, on time
//! and plain.
//!
//! Each implementation gets a [`RateSearch`] per criterion: first the on-time one (with
//! the lateness bound, the default), then the plain one, replayed over the attempts the
//! first one made and adding its own. Each attempt is one W3 run in a child process of
//! its own. Implementations take turns: one new attempt each, then the next round.
//!
//! # Invariants
//! - A rate is **held** when the actual rate reaches 95 % of the target: the generator
//!   only sleeps when ahead of schedule, so falling short means the system could not
//!   keep up. It is **held on time** when, in the same attempt, the expiry lateness p99
//!   is also within the bound (`--max-late-p99-ms`, default 10 ms): a peer whose hand-off
//!   never pushes back keeps up with the offered rate while its expiries fall behind,
//!   and that is not holding the rate. An attempt without expiries is on time.
//! - Both searches start at `--rate` and take an attempt's outcome from one run, so a
//!   rate held on time is held, and the on-time rate is never above the plain one. With
//!   `--plain` only the plain search runs (the tool's behaviour before the bound).
//! - Every new attempt is printed on stderr as it ends and kept, with its full result,
//!   in the JSON summary; the attempt line and the outcome give the expiry lateness
//!   (p99) and peak memory there, and a late attempt's line the machine stalls the run
//!   saw (on a loaded machine a stall longer than the bound can make any implementation
//!   late: read the verdict with them). Each knee (the highest rate held, on time and plain)
//!   is reported with the lateness p99 and peak memory of its attempt.
//! - JSON: `max_rate_held` and `first_failed_rate` keep their meaning (plain); the
//!   on-time outcome is under `on_time` (`null` with `--plain`), and the bound is the
//!   summary's `max_late_p99_ms`.
//! - With `--plot FILE`, every attempt's CPU per request is drawn against its offered
//!   rate ([`crate::report::plot`]) once every search is over.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::cli::rate_search::RateSearch;
use crate::report::plot::{plot_sweeps, Knee, Sweep, SweepPoint};
use crate::report::MIB;
use crate::workloads::w3::{Implementation, PurgatoryLoad, W3Params};
use crate::workloads::{implementation_name, Job, Workload};

/// Held: the actual rate reached 95 % of the target.
fn held(result: &Value, target: f64) -> bool {
    result["actual_rate"].as_f64().unwrap_or(0.0) >= 0.95 * target
}

/// On time: the expiry lateness p99 is within `bound_ms` (a missing figure is not).
fn on_time(result: &Value, bound_ms: f64) -> bool {
    result["expiry_late_p99_ms"]
        .as_f64()
        .is_some_and(|p99| p99 <= bound_ms)
}

/// Expiry lateness p99 and peak memory of one attempt's result, as the lines show them.
fn lateness_and_memory(result: &Value) -> String {
    format!(
        "expiry late p99 {:.2} ms, peak RSS {:.1} MiB",
        result["expiry_late_p99_ms"].as_f64().unwrap_or(f64::NAN),
        result["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN) * MIB
    )
}

/// One attempt: its target rate and its run's result.
struct Attempt {
    rate: f64,
    result: Value,
}

/// One implementation's searches and attempts.
struct ImplSweep {
    implementation: Implementation,
    name: String,
    /// With a bound: the on-time search, stepped first.
    on_time: Option<RateSearch>,
    plain: RateSearch,
    attempts: Vec<Attempt>,
}

impl ImplSweep {
    fn new(implementation: Implementation, start: f64, bound_ms: Option<f64>) -> Self {
        ImplSweep {
            implementation,
            name: implementation_name(&implementation),
            on_time: bound_ms.map(|_| RateSearch::new(start)),
            plain: RateSearch::new(start),
            attempts: Vec::new(),
        }
    }

    /// Advances the searches over the attempts already made until one needs a new
    /// rate, and runs that attempt; false once both searches are over.
    fn step(
        &mut self,
        params: &W3Params,
        bound_ms: Option<f64>,
        allocator: &str,
    ) -> Result<bool, String> {
        loop {
            let (search, bound) = match (&mut self.on_time, bound_ms) {
                (Some(s), Some(bound)) if s.next_rate().is_some() => (s, Some(bound)),
                _ => (&mut self.plain, None),
            };
            let Some(rate) = search.next_rate() else {
                return Ok(false);
            };
            let verdict = |r: &Value| held(r, rate) && bound.is_none_or(|b| on_time(r, b));
            if let Some(done) = self.attempts.iter().find(|a| a.rate == rate) {
                search.record(rate, verdict(&done.result));
                continue;
            }
            let job = Job::<PurgatoryLoad> {
                implementation: self.implementation,
                params: W3Params {
                    rate,
                    ..params.clone()
                },
            };
            let r = job.run_in_child(allocator)?;
            search.record(rate, verdict(&r));
            let verdict = match (held(&r, rate), bound_ms) {
                (false, _) => "NOT held".to_owned(),
                (true, None) => "held".to_owned(),
                (true, Some(b)) if on_time(&r, b) => "held, on time".to_owned(),
                (true, Some(b)) => format!(
                    "held, LATE (p99 over {b} ms; the machine stalled the process {} times \
over 5 ms, the longest {:.0} ms)",
                    r["stall_count"].as_u64().unwrap_or(0),
                    r["stall_max_ms"].as_f64().unwrap_or(0.0)
                ),
            };
            eprintln!(
                "  {}: target {rate:.0}/s -> actual {:.0}/s {verdict} ({})",
                self.name,
                r["actual_rate"].as_f64().unwrap_or(0.0),
                lateness_and_memory(&r)
            );
            self.attempts.push(Attempt { rate, result: r });
            return Ok(true);
        }
    }

    /// The result of the attempt at `rate`, if one was made.
    fn at(&self, rate: f64) -> Option<&Value> {
        self.attempts
            .iter()
            .find(|a| a.rate == rate)
            .map(|a| &a.result)
    }

    /// A search's knee: its rate and, if held, its attempt's figures.
    fn knee(&self, search: &RateSearch) -> (f64, f64, Option<&Value>) {
        let (low, high) = search.outcome();
        (low, high, (low > 0.0).then(|| self.at(low)).flatten())
    }
}

/// A knee as the JSON summary gives it.
fn knee_json(low: f64, high: f64, there: Option<&Value>) -> Value {
    let figure = |key: &str| there.map_or(Value::Null, |r| r[key].clone());
    json!({
        "max_rate_held": low,
        "first_failed_rate": high,
        "at_max_rate_held": there.map(|_| json!({
            "actual_rate": figure("actual_rate"),
            "expiry_late_p99_ms": figure("expiry_late_p99_ms"),
            "peak_rss_bytes": figure("peak_rss_bytes"),
            "cpu_s_per_million": figure("cpu_s_per_million"),
        })),
    })
}

/// A knee for the picture.
fn plot_knee(low: f64, there: Option<&Value>) -> Option<Knee> {
    there.map(|r| Knee {
        rate: low,
        expiry_late_p99_ms: r["expiry_late_p99_ms"].as_f64().unwrap_or(f64::NAN),
        peak_rss_mib: r["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN) * MIB,
    })
}

/// A knee as the outcome lines give it.
fn knee_line(text: &mut String, name: &str, what: &str, knee: (f64, f64, Option<&Value>)) {
    let (low, high, there) = knee;
    let _ = write!(
        text,
        "  {name}: {what} {low:.0} req/s (first failing rate {high:.0})"
    );
    let _ = match there {
        Some(r) => writeln!(text, "; there: {}", lateness_and_memory(r)),
        None => writeln!(text),
    };
}

/// Searches the highest rate each of `implementations` holds on time within `bound_ms`
/// (if given) and plain, prints the outcome and, with `json`, a summary (`"workload":
/// "w3-max"`); with `plot`, draws the sweep there.
pub(super) fn find_max(
    implementations: &[Implementation],
    params: &W3Params,
    bound_ms: Option<f64>,
    json: bool,
    allocator: &str,
    plot: Option<&Path>,
) -> Result<(), String> {
    let mut sweeps: Vec<ImplSweep> = implementations
        .iter()
        .map(|&i| ImplSweep::new(i, params.rate, bound_ms))
        .collect();
    loop {
        let mut any = false;
        for sweep in &mut sweeps {
            any |= sweep.step(params, bound_ms, allocator)?;
        }
        if !any {
            break;
        }
    }
    let mut text = match bound_ms {
        Some(b) => format!(
            "W3-max (on time: actual >= 95 % of target and expiry late p99 <= {b} ms; \
plain: actual >= 95 %): {}\n",
            PurgatoryLoad::title(params)
        ),
        None => format!(
            "W3-max (plain: actual >= 95 % of target, lateness not counted): {}\n",
            PurgatoryLoad::title(params)
        ),
    };
    let mut results = Vec::new();
    let mut pictures = Vec::new();
    for sweep in &sweeps {
        let plain = sweep.knee(&sweep.plain);
        let timely = sweep.on_time.as_ref().map(|s| sweep.knee(s));
        if let Some(knee) = timely {
            knee_line(&mut text, &sweep.name, "on time", knee);
        }
        knee_line(&mut text, &sweep.name, "plain", plain);
        let points = sweep
            .attempts
            .iter()
            .map(|a| {
                let kept_up = held(&a.result, a.rate);
                SweepPoint {
                    offered_rate: a.rate,
                    cpu_s_per_million: a.result["cpu_s_per_million"].as_f64().unwrap_or(0.0),
                    held: kept_up,
                    on_time: kept_up && bound_ms.is_none_or(|b| on_time(&a.result, b)),
                }
            })
            .collect();
        pictures.push(Sweep {
            name: sweep.name.clone(),
            points,
            held: plot_knee(plain.0, plain.2),
            on_time: timely.and_then(|(low, _, there)| plot_knee(low, there)),
        });
        let attempts: Vec<Value> = sweep
            .attempts
            .iter()
            .map(|a| {
                let kept_up = held(&a.result, a.rate);
                json!({
                    "target_rate": a.rate,
                    "held": kept_up,
                    "on_time": bound_ms.map(|b| kept_up && on_time(&a.result, b)),
                    "result": a.result,
                })
            })
            .collect();
        let mut entry = knee_json(plain.0, plain.1, plain.2);
        entry["impl"] = json!(sweep.name);
        entry["on_time"] = timely.map_or(Value::Null, |(l, h, t)| knee_json(l, h, t));
        entry["attempts"] = Value::Array(attempts);
        results.push(entry);
    }
    println!("{text}");
    if let Some(path) = plot {
        let title = format!(
            "W3-max sweep: --num {} --timeout {} --pct50 {} --pct75 {} --keys {} --key-space-size {}{}",
            params.num,
            params.timeout_ms,
            params.pct50_ms,
            params.pct75_ms,
            params.keys,
            params.key_space,
            if params.events { " --events" } else { "" }
        );
        plot_sweeps(path, &title, bound_ms, &pictures)?;
        eprintln!("purgatory-perf: sweep drawn in {}", path.display());
    }
    if json {
        let summary = json!({
            "workload": "w3-max",
            "params": params,
            "max_late_p99_ms": bound_ms,
            "results": results,
        });
        println!("{summary}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_time_needs_the_rate_and_the_lateness() {
        let r = json!({"actual_rate": 960.0, "expiry_late_p99_ms": 12.0});
        assert!(held(&r, 1000.0));
        assert!(!on_time(&r, 10.0));
        assert!(on_time(&r, 12.0));
        assert!(!held(&r, 1100.0));
        assert!(!on_time(&json!({"actual_rate": 960.0}), 10.0));
    }
}
