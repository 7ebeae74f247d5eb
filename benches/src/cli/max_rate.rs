//! W3-max (`w3 --find-max`): the highest request rate each implementation holds.
//!
//! Starting at `--rate`, the target doubles while the implementation holds it (or, if it
//! does not hold the starting rate, halves until it does), then the gap between the last
//! rate held and the first one missed is bisected a few times.
//! Each attempt is one W3 run in a child process of its own.
//!
//! # Invariants
//! - A rate is held when the actual rate reaches 95 % of the target: the generator only
//!   sleeps when ahead of schedule, so falling short means the system could not keep up.
//! - Doubling stops once the target passes [`MAX_RATE`] (and then nothing is bisected);
//!   halving stops before the target falls below [`MIN_RATE`] (held: 0).
//! - Every attempt is printed on stderr as it ends and kept, with its full result, in
//!   the JSON summary. The attempt line and the outcome line also give the expiry
//!   lateness (p99) and peak memory, since a peer with an unbounded hand-off can keep
//!   up with the offered rate while its expiries fall behind.
//! - With `--plot FILE`, every attempt's CPU per request is drawn against its offered
//!   rate ([`crate::report::plot`]) once every implementation's search is over.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::report::plot::{plot_sweeps, Sweep, SweepPoint};
use crate::report::MIB;
use crate::workloads::w3::{Implementation, PurgatoryLoad, W3Params};
use crate::workloads::{implementation_name, Job, Workload};

/// Bisection steps after the doubling phase.
const BISECT_STEPS: u32 = 4;
/// The highest target rate tried, requests/s.
pub const MAX_RATE: f64 = 64e6;
/// The lowest target rate tried, requests/s.
pub const MIN_RATE: f64 = 1e3;

/// Held: the actual rate reached 95 % of the target.
fn held(result: &Value, target: f64) -> bool {
    result["actual_rate"].as_f64().unwrap_or(0.0) >= 0.95 * target
}

/// Expiry lateness p99 and peak memory of one attempt's result, as the lines show them.
fn lateness_and_memory(result: &Value) -> String {
    format!(
        "expiry late p99 {:.2} ms, peak RSS {:.1} MiB",
        result["expiry_late_p99_ms"].as_f64().unwrap_or(f64::NAN),
        result["peak_rss_bytes"].as_f64().unwrap_or(f64::NAN) * MIB
    )
}

/// Searches the highest rate held by each of `implementations`, prints the outcome and,
/// with `json`, a summary (`"workload": "w3-max"`); with `plot`, draws the sweep there.
pub(super) fn find_max(
    implementations: &[Implementation],
    params: &W3Params,
    json: bool,
    allocator: &str,
    plot: Option<&Path>,
) -> Result<(), String> {
    let mut results = Vec::new();
    let mut sweeps = Vec::new();
    let mut text = format!(
        "W3-max (highest rate held at >= 95 %): {}\n",
        PurgatoryLoad::title(params)
    );
    for &implementation in implementations {
        let name = implementation_name(&implementation);
        let mut attempts = Vec::new();
        let mut points = Vec::new();
        // The result of the highest rate held so far.
        let mut at_best = None;
        let mut try_rate = |rate: f64| -> Result<bool, String> {
            let job = Job::<PurgatoryLoad> {
                implementation,
                params: W3Params {
                    rate,
                    ..params.clone()
                },
            };
            let r = job.run_in_child(allocator)?;
            let ok = held(&r, rate);
            eprintln!(
                "  {name}: target {rate:.0}/s -> actual {:.0}/s {} ({})",
                r["actual_rate"].as_f64().unwrap_or(0.0),
                if ok { "held" } else { "NOT held" },
                lateness_and_memory(&r)
            );
            points.push(SweepPoint {
                offered_rate: rate,
                cpu_s_per_million: r["cpu_s_per_million"].as_f64().unwrap_or(0.0),
                held: ok,
            });
            if ok {
                at_best = Some(lateness_and_memory(&r));
            }
            attempts.push(serde_json::json!({ "target_rate": rate, "held": ok, "result": r }));
            Ok(ok)
        };
        let mut low = 0.0;
        let mut high = params.rate;
        if try_rate(high)? {
            low = high;
            high *= 2.0;
            while high <= MAX_RATE && try_rate(high)? {
                low = high;
                high *= 2.0;
            }
        } else {
            // Not even the starting rate: halve until a rate is held.
            while high / 2.0 >= MIN_RATE {
                let rate = (high / 2.0).round();
                if try_rate(rate)? {
                    low = rate;
                    break;
                }
                high = rate;
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
        let _ = write!(
            text,
            "  {name}: highest rate held {low:.0} req/s (first failing rate {high:.0})"
        );
        let _ = match at_best {
            Some(there) => writeln!(text, "; there: {there}"),
            None => writeln!(text),
        };
        sweeps.push(Sweep {
            name: name.clone(),
            points,
            max_rate_held: low,
        });
        results.push(serde_json::json!({
            "impl": name,
            "max_rate_held": low,
            "first_failed_rate": high,
            "attempts": attempts,
        }));
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
        plot_sweeps(path, &title, &sweeps)?;
        eprintln!("purgatory-perf: sweep drawn in {}", path.display());
    }
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
