//! The table the tool prints: one row per figure, one column per implementation.
//!
//! # Invariants
//! - A figure no implementation reported is left out; a cell whose implementation did
//!   not report it shows `-`.
//! - A cell is the median (scaled, rounded to the figure's decimals), then `±` half the
//!   min-max range in percent of the median when there were several runs, then the ratio
//!   to ours as `(N.NNx)` for every implementation but ours.

use std::fmt::Write as _;

use crate::report::{ratio_to_ours, spreads, Figure, ImplRuns};

/// A table: one row per figure present, one column per implementation, each cell the
/// median, its spread when there were several runs, and the ratio to ours.
pub fn table(title: &str, figures: &[Figure], all: &[ImplRuns]) -> String {
    let stats: Vec<_> = all.iter().map(|r| spreads(&r.runs)).collect();
    let ours = all.iter().position(ImplRuns::is_ours);
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
                    let theirs = ours.filter(|&o| o != i).and_then(|o| stats[o].get(f.key));
                    if let Some(r) = ratio_to_ours(v, theirs) {
                        let _ = write!(cell, " ({r:.2}x)");
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
    use crate::report::test_runs::two_implementations;

    #[test]
    fn medians_ratios_and_absent_figures() {
        let figures = [
            Figure::new("add_ns", "ns per add", 1.0, 1),
            Figure::new("cancel_ns", "ns per cancel", 1.0, 1),
        ];
        let t = table("W1", &figures, &two_implementations());
        assert!(t.contains("ns per add"));
        assert!(t.contains("20.0 ±50%"));
        assert!(t.contains("(2.00x)"));
        assert!(
            !t.contains("ns per cancel"),
            "absent figures are not printed"
        );
    }
}
