//! What the load tool reports: the runs of each implementation, reduced to a median and
//! a spread per figure and related to ours, then shown as a table ([`table`]) and as
//! one JSON object ([`json`]); [`statistics`] has the order statistics underneath, and
//! [`plot`] draws a W3 rate sweep as an SVG picture.
//!
//! # Invariants
//! - Each run's result is flattened to `figure -> number` (nested objects become dotted
//!   names such as `lateness.p99_ms`); the summary keeps every numeric figure, not only
//!   the ones the table shows.
//! - A ratio is `peer median / ours median` of the same figure in the same invocation
//!   (so `> 1` means the peer's number is larger); it is absent when ours is 0 or
//!   missing.

pub mod json;
pub mod plot;
pub mod statistics;
pub mod table;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::report::statistics::Spread;

/// The implementation every other one is related to.
pub const OURS: &str = "ours";

/// All runs of one implementation.
#[derive(Clone, Debug)]
pub struct ImplRuns {
    /// Implementation name.
    pub name: String,
    /// Each run's result object.
    pub runs: Vec<Value>,
}

impl ImplRuns {
    /// Whether these are ours, the runs ratios are taken against.
    pub fn is_ours(&self) -> bool {
        self.name == OURS
    }
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

/// A peer's median of one figure divided by ours; none when ours is missing or 0.
pub fn ratio_to_ours(peer: &Spread, ours: Option<&Spread>) -> Option<f64> {
    ours.filter(|o| o.median != 0.0)
        .map(|o| peer.median / o.median)
}

/// Runs to test the report with.
#[cfg(test)]
pub(crate) mod test_runs {
    use super::ImplRuns;
    use serde_json::json;

    /// Ours with three runs (median 20, min 10, max 30) and a peer with one (40).
    pub(crate) fn two_implementations() -> Vec<ImplRuns> {
        vec![
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
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flatten_nested() {
        let f = flatten(&json!({"a": 1, "b": {"c": 2.5}, "s": "x"}));
        assert_eq!(f.get("b.c"), Some(&2.5));
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn no_ratio_without_ours() {
        let peer = Spread::of(&[4.0]).unwrap();
        let zero = Spread::of(&[0.0]).unwrap();
        assert_eq!(
            ratio_to_ours(&peer, Some(&Spread::of(&[2.0]).unwrap())),
            Some(2.0)
        );
        assert_eq!(ratio_to_ours(&peer, Some(&zero)), None);
        assert_eq!(ratio_to_ours(&peer, None), None);
    }
}
