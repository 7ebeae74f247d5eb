//! W3-max (`w3 --find-max`): the highest request rate each implementation holds, on time
//! and plain.
//!
//! Each implementation gets a [`MajoritySearch`] per criterion: first the on-time one
//! (with the lateness bound, the default), then the plain one, replayed over the
//! attempts the first one made and adding its own. Each rate a search tries is decided by
//! a majority of up to `--attempts` attempts there (default 3), stopping once the
//! majority is settled; each attempt is one W3 run in a child process of its own.
//! Implementations take turns attempt by attempt: one new attempt each, then the next
//! round, so a slow phase of the machine hits all of them alike.
//!
//! # Invariants
//! - A rate is **held** when the actual rate reaches 95 % of the target: the generator
//!   only sleeps when ahead of schedule, so falling short means the system could not
//!   keep up. It is **held on time** when, in the same attempt, the expiry lateness p99
//!   is also within the bound (`--max-late-p99-ms`, default 10 ms): a peer whose hand-off
//!   never pushes back keeps up with the offered rate while its expiries fall behind,
//!   and that is not holding the rate. An attempt without expiries is on time.
//! - Both searches start at `--rate` and judge each attempt from its one run, so an
//!   attempt on time is held. The plain search reuses every attempt already made at a
//!   rate and adds attempts only while its own majority there is unsettled; it may still
//!   decide a rate differently from the on-time one only where the on-time one counted
//!   held but late attempts against it. With `--plain` only the plain search runs (the
//!   tool's behaviour before the bound). With `--attempts 1` each rate is decided by one
//!   attempt and the rates tried are the ones the single-attempt search tried.
//! - Every new attempt is printed on stderr as it ends and kept, with its full result,
//!   in the JSON summary; the attempt line and the outcome give the expiry lateness
//!   (p99) and peak memory there, and a late attempt's line the machine stalls the run
//!   saw (on a loaded machine a stall longer than the bound can make any implementation
//!   late: read the verdict with them). Each knee (the highest rate decided held, on time
//!   and plain) is reported with how many of its attempts held (on time, for the on-time
//!   one) of how many were made there, and the median of those held attempts' lateness
//!   p99 and peak memory (and, in the JSON, actual rate and CPU).
//! - JSON: `max_rate_held` and `first_failed_rate` keep their meaning (plain), with
//!   `held_at_max_rate` of `attempts_at_max_rate` beside them and the medians under
//!   `at_max_rate_held`; the on-time outcome is under `on_time` (`null` with `--plain`),
//!   the bound is the summary's `max_late_p99_ms` and the attempt count its
//!   `attempts_per_rate`.
//! - With `--plot FILE`, every attempt's CPU per request is drawn against its offered
//!   rate ([`crate::report::plot`]) once every search is over.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::cli::majority_search::{MajoritySearch, Tally};
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

/// Passes a search's criterion at `rate`: held and, with a bound, on time within it.
fn passes(result: &Value, rate: f64, bound_ms: Option<f64>) -> bool {
    held(result, rate) && bound_ms.is_none_or(|b| on_time(result, b))
}

/// Expiry lateness p99 and peak memory of one attempt's result (or of a knee's medians),
/// as the lines show them.
fn lateness_and_memory(result: &Value) -> String {
    format!(
        "expiry late p99 {:.2} ms, peak RSS {:.1} MiB",
        result["expiry_late_p99_ms"].as_f64().unwrap_or(f64::NAN),
        result["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN) * MIB
    )
}

/// The median of `values` (the mean of the middle two of an even count); `None` if
/// there are none.
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The figures a knee is reported with, each the median over `results` (the knee's
/// held attempts) of the results that have it; a figure none has is `null`.
fn median_figures(results: &[&Value]) -> Value {
    let median_of = |key: &str| {
        median(results.iter().filter_map(|r| r[key].as_f64()).collect())
            .map_or(Value::Null, |m| json!(m))
    };
    json!({
        "actual_rate": median_of("actual_rate"),
        "expiry_late_p99_ms": median_of("expiry_late_p99_ms"),
        "peak_rss_bytes": median_of("peak_rss_bytes"),
        "cpu_s_per_million": median_of("cpu_s_per_million"),
    })
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
    on_time: Option<MajoritySearch>,
    plain: MajoritySearch,
    attempts: Vec<Attempt>,
}

/// A search's knee: the highest rate decided held (0 if none), the lowest decided
/// missed above it, and, if one was held, its tally and the results of its attempts
/// that passed.
struct KneeAt<'a> {
    low: f64,
    high: f64,
    held: Option<(Tally, Vec<&'a Value>)>,
}

impl ImplSweep {
    fn new(
        implementation: Implementation,
        start: f64,
        bound_ms: Option<f64>,
        attempts: usize,
    ) -> Self {
        ImplSweep {
            implementation,
            name: implementation_name(&implementation),
            on_time: bound_ms.map(|_| MajoritySearch::new(start, attempts)),
            plain: MajoritySearch::new(start, attempts),
            attempts: Vec::new(),
        }
    }

    /// Whether each attempt made at `rate` passes the criterion of `bound_ms`, in order.
    fn outcomes(attempts: &[Attempt], rate: f64, bound_ms: Option<f64>) -> Vec<bool> {
        attempts
            .iter()
            .filter(|a| a.rate == rate)
            .map(|a| passes(&a.result, rate, bound_ms))
            .collect()
    }

    /// Advances the searches over the attempts already made until one needs another
    /// attempt, and returns its rate; `None` once both searches are over.
    fn next_rate(&mut self, bound_ms: Option<f64>) -> Option<f64> {
        let made = &self.attempts;
        let timely = self
            .on_time
            .as_mut()
            .and_then(|s| s.next_attempt(|rate| Self::outcomes(made, rate, bound_ms)));
        timely.or_else(|| {
            self.plain
                .next_attempt(|rate| Self::outcomes(made, rate, None))
        })
    }

    /// Runs the next attempt the searches need; false once both searches are over.
    fn step(
        &mut self,
        params: &W3Params,
        bound_ms: Option<f64>,
        allocator: &str,
    ) -> Result<bool, String> {
        let Some(rate) = self.next_rate(bound_ms) else {
            return Ok(false);
        };
        let nth = self.attempts.iter().filter(|a| a.rate == rate).count() + 1;
        let job = Job::<PurgatoryLoad> {
            implementation: self.implementation,
            params: W3Params {
                rate,
                ..params.clone()
            },
        };
        let r = job.run_in_child(allocator)?;
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
            "  {}: target {rate:.0}/s (attempt {nth}) -> actual {:.0}/s {verdict} ({})",
            self.name,
            r["actual_rate"].as_f64().unwrap_or(0.0),
            lateness_and_memory(&r)
        );
        self.attempts.push(Attempt { rate, result: r });
        Ok(true)
    }

    /// The knee of `search`, whose criterion is `bound_ms`'s.
    fn knee(&self, search: &MajoritySearch, bound_ms: Option<f64>) -> KneeAt<'_> {
        let (low, high) = search.outcome();
        let held = search.knee_tally().map(|tally| {
            let passed = self
                .attempts
                .iter()
                .filter(|a| a.rate == low && passes(&a.result, low, bound_ms))
                .map(|a| &a.result)
                .collect();
            (tally, passed)
        });
        KneeAt { low, high, held }
    }
}

/// A knee as the JSON summary gives it.
fn knee_json(knee: &KneeAt) -> Value {
    let tally = knee.held.as_ref().map(|(t, _)| *t);
    json!({
        "max_rate_held": knee.low,
        "first_failed_rate": knee.high,
        "held_at_max_rate": tally.map(|t| t.passed),
        "attempts_at_max_rate": tally.map(|t| t.of),
        "at_max_rate_held": knee.held.as_ref().map(|(_, passed)| median_figures(passed)),
    })
}

/// A knee for the picture.
fn plot_knee(knee: &KneeAt) -> Option<Knee> {
    knee.held.as_ref().map(|(tally, passed)| {
        let m = median_figures(passed);
        Knee {
            rate: knee.low,
            passed: tally.passed,
            of: tally.of,
            expiry_late_p99_ms: m["expiry_late_p99_ms"].as_f64().unwrap_or(f64::NAN),
            peak_rss_mib: m["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN) * MIB,
        }
    })
}

/// A knee as the outcome lines give it: `what` names the search ("on time", "plain"),
/// `passed` what its attempts pass as ("on time", "held").
fn knee_line(text: &mut String, name: &str, (what, passed_as): (&str, &str), knee: &KneeAt) {
    let _ = write!(text, "  {name}: {what} {:.0} req/s", knee.low);
    let _ = match &knee.held {
        Some((tally, passed)) => writeln!(
            text,
            " ({} of {} {passed_as}; first failing rate {:.0}); there, median of {}: {}",
            tally.passed,
            tally.of,
            knee.high,
            passed.len(),
            lateness_and_memory(&median_figures(passed))
        ),
        None => writeln!(text, " (first failing rate {:.0})", knee.high),
    };
}

/// Searches the highest rate each of `implementations` holds on time within `bound_ms`
/// (if given) and plain, prints the outcome and, with `json`, a summary (`"workload":
/// "w3-max"`); with `plot`, draws the sweep there.
pub(super) fn find_max(
    implementations: &[Implementation],
    params: &W3Params,
    bound_ms: Option<f64>,
    attempts: usize,
    json: bool,
    allocator: &str,
    plot: Option<&Path>,
) -> Result<(), String> {
    let mut sweeps: Vec<ImplSweep> = implementations
        .iter()
        .map(|&i| ImplSweep::new(i, params.rate, bound_ms, attempts))
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
plain: actual >= 95 %; each rate by a majority of up to {attempts} attempts): {}\n",
            PurgatoryLoad::title(params)
        ),
        None => format!(
            "W3-max (plain: actual >= 95 % of target, lateness not counted; each rate by a \
majority of up to {attempts} attempts): {}\n",
            PurgatoryLoad::title(params)
        ),
    };
    let mut results = Vec::new();
    let mut pictures = Vec::new();
    for sweep in &sweeps {
        let plain = sweep.knee(&sweep.plain, None);
        let timely = sweep.on_time.as_ref().map(|s| sweep.knee(s, bound_ms));
        if let Some(knee) = &timely {
            knee_line(&mut text, &sweep.name, ("on time", "on time"), knee);
        }
        knee_line(&mut text, &sweep.name, ("plain", "held"), &plain);
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
            held: plot_knee(&plain),
            on_time: timely.as_ref().and_then(plot_knee),
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
        let mut entry = knee_json(&plain);
        entry["impl"] = json!(sweep.name);
        entry["on_time"] = timely.as_ref().map_or(Value::Null, knee_json);
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
            "attempts_per_rate": attempts,
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

    /// An attempt's result: `kept` of the target rate reached, with this lateness p99
    /// and peak memory (MiB).
    fn result(rate: f64, kept: f64, p99_ms: f64, rss_mib: f64) -> Value {
        json!({
            "actual_rate": rate * kept,
            "expiry_late_p99_ms": p99_ms,
            "peak_rss_bytes": rss_mib / MIB,
            "cpu_s_per_million": 1.0,
        })
    }

    #[test]
    fn the_knee_is_the_highest_rate_a_majority_held_with_the_medians_of_those() {
        // Holds up to 2M. At 2M the first attempt is late (20 ms) and the third on time
        // but the slowest on time (8 ms), the memory 10, 30, 20 MiB; at 4M the second
        // attempt holds, on time.
        let machine = |rate: f64, k: usize| match (rate, k) {
            (r, 0) if r == 2e6 => result(r, 1.0, 20.0, 10.0),
            (r, 1) if r == 2e6 => result(r, 1.0, 2.0, 30.0),
            (r, _) if r == 2e6 => result(r, 1.0, 8.0, 20.0),
            (r, 1) if r == 4e6 => result(r, 1.0, 1.0, 50.0),
            (r, _) if r <= 2e6 => result(r, 1.0, 1.0, 5.0),
            (r, _) => result(r, 0.5, 1.0, 50.0),
        };
        let mut sweep = ImplSweep::new(Implementation::Naive, 1e6, Some(10.0), 3);
        while let Some(rate) = sweep.next_rate(Some(10.0)) {
            let k = sweep.attempts.iter().filter(|a| a.rate == rate).count();
            sweep.attempts.push(Attempt {
                rate,
                result: machine(rate, k),
            });
        }
        let tried = |rate: f64| sweep.attempts.iter().filter(|a| a.rate == rate).count();
        // On time: 2M held on 2 of 3 (the late one third); plain: all three held, reused.
        assert_eq!((tried(1e6), tried(2e6), tried(4e6)), (2, 3, 3));
        let timely = sweep.knee(sweep.on_time.as_ref().unwrap(), Some(10.0));
        let plain = sweep.knee(&sweep.plain, None);
        // Bisecting 2M-4M: 3M, 2.5M, 2.25M and 2.125M missed on two attempts each; the
        // plain search decides every rate on the attempts the on-time one made.
        assert_eq!(sweep.attempts.len(), 2 + 3 + 3 + 4 * 2);
        assert_eq!((timely.low, timely.high), (2e6, 2.125e6));
        assert_eq!((plain.low, plain.high), (2e6, 2.125e6));
        let mut text = String::new();
        knee_line(&mut text, "naive", ("on time", "on time"), &timely);
        knee_line(&mut text, "naive", ("plain", "held"), &plain);
        assert_eq!(
            text,
            "  naive: on time 2000000 req/s (2 of 3 on time; first failing rate 2125000); \
there, median of 2: expiry late p99 5.00 ms, peak RSS 25.0 MiB\n  \
naive: plain 2000000 req/s (3 of 3 held; first failing rate 2125000); there, median of \
3: expiry late p99 8.00 ms, peak RSS 20.0 MiB\n"
        );
        let j = knee_json(&timely);
        assert_eq!(
            (
                j["held_at_max_rate"].clone(),
                j["attempts_at_max_rate"].clone()
            ),
            (json!(2), json!(3))
        );
        assert_eq!(j["at_max_rate_held"]["expiry_late_p99_ms"], json!(5.0));
    }
}
