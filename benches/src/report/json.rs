//! The `--json` summary: one object with the workload, its parameters, and per
//! implementation every figure's median, spread and raw runs, plus ratios to ours.
//!
//! # Invariants
//! - Field names are an interface people script against: `workload`, `params`,
//!   `results` (each with `impl`, `run_count`, every flattened figure's median, `spread`
//!   and `runs`) and `ratio_to_ours` (per peer, per figure).
//! - A number that JSON cannot hold (NaN, infinity) is written as `null`.

use serde_json::{Map, Value};

use crate::report::{ratio_to_ours, spreads, ImplRuns};

/// The JSON summary object: one entry per implementation with every figure's median at
/// top level, its min/max under `spread`, the raw runs, and ratios to ours.
pub fn summary_json(workload: &str, params: Value, all: &[ImplRuns]) -> Value {
    let ours = all.iter().find(|r| r.is_ours()).map(|r| spreads(&r.runs));
    let mut results = Vec::new();
    let mut ratios = Map::new();
    for runs in all {
        let s = spreads(&runs.runs);
        let mut entry = Map::new();
        entry.insert("impl".into(), Value::from(runs.name.clone()));
        entry.insert("run_count".into(), Value::from(runs.runs.len()));
        let mut spread = Map::new();
        let mut ratio = Map::new();
        for (k, v) in &s {
            entry.insert(k.clone(), json_number(v.median));
            spread.insert(
                k.clone(),
                serde_json::json!({ "min": json_number(v.min), "max": json_number(v.max) }),
            );
            if let Some(r) = ratio_to_ours(v, ours.as_ref().and_then(|o| o.get(k))) {
                ratio.insert(k.clone(), json_number(r));
            }
        }
        entry.insert("spread".into(), Value::Object(spread));
        entry.insert("runs".into(), Value::Array(runs.runs.clone()));
        if !runs.is_ours() && ours.is_some() {
            ratios.insert(runs.name.clone(), Value::Object(ratio));
        }
        results.push(Value::Object(entry));
    }
    let mut top = Map::new();
    top.insert("workload".into(), Value::from(workload));
    top.insert("params".into(), params);
    top.insert("results".into(), Value::Array(results));
    top.insert("ratio_to_ours".into(), Value::Object(ratios));
    Value::Object(top)
}

fn json_number(v: f64) -> Value {
    serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_runs::two_implementations;
    use serde_json::json;

    #[test]
    fn medians_and_ratios() {
        let s = summary_json("w1", json!({}), &two_implementations());
        assert_eq!(s["results"][0]["add_ns"], json!(20.0));
        assert_eq!(s["results"][0]["spread"]["add_ns"]["max"], json!(30.0));
        assert_eq!(s["ratio_to_ours"]["peer"]["add_ns"], json!(2.0));
    }
}
