//! Aggregating repeated runs and printing them: medians and spreads per figure, ratios
//! to ours, a readable table, and the one-line JSON summary.
//!
//! # Invariants
//! - Each run's result is flattened to `figure -> number` (nested objects become dotted
//!   names such as `lateness.p99_ms`); the summary keeps every numeric figure, not only
//!   the ones the table shows.
//! - A ratio is `peer median / ours median` of the same figure in the same invocation
//!   (so `> 1` means the peer's number is larger); it is absent when ours is 0 or
//!   missing.

pub mod statistics;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{Map, Value};

use crate::report::statistics::Spread;

/// All runs of one implementation.
#[derive(Clone, Debug)]
pub struct ImplRuns {
    /// Implementation name.
    pub name: String,
    /// Each run's result object.
    pub runs: Vec<Value>,
}

/// A figure shown in the table.
#[derive(Clone, Copy, Debug)]
pub struct Figure {
    /// Flattened field name.
    pub key: &'static str,
    /// Row label.
    pub label: &'static str,
    /// Scale applied before printing (for example bytes to MiB).
    pub scale: f64,
    /// Decimals printed.
    pub decimals: usize,
}

impl Figure {
    /// A row showing field `key` as `label`, multiplied by `scale`, with `decimals`.
    pub const fn new(key: &'static str, label: &'static str, scale: f64, decimals: usize) -> Self {
        Figure {
            key,
            label,
            scale,
            decimals,
        }
    }
}

/// Scale from bytes to MiB.
pub const MIB: f64 = 1.0 / (1024.0 * 1024.0);

/// Flattens nested objects into dotted numeric fields.
pub fn flatten(value: &Value) -> BTreeMap<String, f64> {
    fn walk(prefix: &str, value: &Value, out: &mut BTreeMap<String, f64>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            Value::Number(n) => {
                if let Some(f) = n.as_f64() {
                    out.insert(prefix.to_owned(), f);
                }
            }
            Value::Bool(b) => {
                out.insert(prefix.to_owned(), f64::from(u8::from(*b)));
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk("", value, &mut out);
    out
}

/// Median and spread of every numeric figure over the runs.
pub fn spreads(runs: &[Value]) -> BTreeMap<String, Spread> {
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in runs {
        for (k, v) in flatten(run) {
            values.entry(k).or_default().push(v);
        }
    }
    values
        .into_iter()
        .filter_map(|(k, v)| Spread::of(&v).map(|s| (k, s)))
        .collect()
}

/// The JSON summary object: one entry per implementation with every figure's median at
/// top level, its min/max under `spread`, the raw runs, and ratios to ours.
pub fn summary_json(workload: &str, params: Value, all: &[ImplRuns]) -> Value {
    let ours = all
        .iter()
        .find(|r| r.name == "ours")
        .map(|r| spreads(&r.runs));
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
            if let Some(o) = ours.as_ref().and_then(|o| o.get(k)) {
                if o.median != 0.0 {
                    ratio.insert(k.clone(), json_number(v.median / o.median));
                }
            }
        }
        entry.insert("spread".into(), Value::Object(spread));
        entry.insert("runs".into(), Value::Array(runs.runs.clone()));
        if runs.name != "ours" && ours.is_some() {
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

/// A table: one row per figure present, one column per implementation, each cell the
/// median, its spread when there were several runs, and the ratio to ours.
pub fn table(title: &str, figures: &[Figure], all: &[ImplRuns]) -> String {
    let stats: Vec<_> = all.iter().map(|r| spreads(&r.runs)).collect();
    let ours = all.iter().position(|r| r.name == "ours");
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["figure".to_owned()];
    header.extend(all.iter().map(|r| {
        if r.runs.len() > 1 {
            format!("{} (median of {})", r.name, r.runs.len())
        } else {
            r.name.clone()
        }
    }));
    rows.push(header);
    for f in figures {
        if stats.iter().all(|s| !s.contains_key(f.key)) {
            continue;
        }
        let mut row = vec![f.label.to_owned()];
        for (i, s) in stats.iter().enumerate() {
            let cell = match s.get(f.key) {
                None => "-".to_owned(),
                Some(v) => {
                    let mut cell = format!("{:.*}", f.decimals, v.median * f.scale);
                    if all[i].runs.len() > 1 {
                        let _ = write!(cell, " ±{:.0}%", v.relative_range_pct() / 2.0);
                    }
                    if let Some(o) = ours.filter(|&o| o != i).and_then(|o| stats[o].get(f.key)) {
                        if o.median != 0.0 {
                            let _ = write!(cell, " ({:.2}x)", v.median / o.median);
                        }
                    }
                    cell
                }
            };
            row.push(cell);
        }
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = format!("{title}\n");
    for (n, row) in rows.iter().enumerate() {
        for (c, cell) in row.iter().enumerate() {
            if c == 0 {
                let _ = write!(out, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(out, "  {cell:>w$}", w = widths[c]);
            }
        }
        out.push('\n');
        if n == 0 {
            out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
            out.push('\n');
        }
    }
    if ours.is_some() && all.len() > 1 {
        out.push_str("(x) = that implementation's median divided by ours; ± = half the min-max range over runs\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn medians_ratios_and_table() {
        let all = vec![
            ImplRuns {
                name: "ours".into(),
                runs: vec![
                    json!({"add_ns": 10.0}),
                    json!({"add_ns": 30.0}),
                    json!({"add_ns": 20.0}),
                ],
            },
            ImplRuns {
                name: "peer".into(),
                runs: vec![json!({"add_ns": 40.0})],
            },
        ];
        let s = summary_json("w1", json!({}), &all);
        assert_eq!(s["results"][0]["add_ns"], json!(20.0));
        assert_eq!(s["ratio_to_ours"]["peer"]["add_ns"], json!(2.0));
        let figures = [
            Figure::new("add_ns", "ns per add", 1.0, 1),
            Figure::new("cancel_ns", "ns per cancel", 1.0, 1),
        ];
        let t = table("W1", &figures, &all);
        assert!(t.contains("ns per add"));
        assert!(t.contains("(2.00x)"));
        assert!(
            !t.contains("ns per cancel"),
            "absent figures are not printed"
        );
    }

    #[test]
    fn flatten_nested() {
        let f = flatten(&json!({"a": 1, "b": {"c": 2.5}, "s": "x"}));
        assert_eq!(f.get("b.c"), Some(&2.5));
        assert_eq!(f.len(), 2);
    }
}
