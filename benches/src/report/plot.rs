//! The picture of a W3 rate sweep (`w3 --find-max --plot FILE.svg`): process CPU
//! seconds per million requests against the offered rate, one line per implementation,
//! with each implementation's knees (the highest rate it held on time, and plain) marked.
//! Drawn with `plotters`' SVG backend; text stays text, set by the viewer in a sans-serif
//! font.
//!
//! # Invariants
//! - Every attempt of the sweep is one point (several at a rate tried several times),
//!   joined in order of offered rate: an attempt held on time is a filled dot, one held
//!   but late a ring around a small dot, one missed a hollow ring. Without a lateness
//!   bound every attempt held is on time.
//! - The x axis is logarithmic (the sweep doubles) and covers every attempt; the y axis
//!   starts at 0 and covers every point, with room above them for the legend.
//! - Each implementation's name is in the legend with its knees: the rate held on time
//!   (with a bound) and the plain one, each with how many of its attempts held (on time)
//!   of how many, and the median expiry lateness p99 and peak memory of those. The
//!   on-time knee (the plain one without a bound) is a filled triangle on a dashed line
//!   from the axis up to its first attempt on time there, in the implementation's
//!   colour; a plain knee above it is a hollow triangle on a dotted line up to its first
//!   attempt held there. An implementation that held no rate has no knee.
//! - Nothing is written unless there is at least one point; an error says why.

use std::path::Path;

use plotters::prelude::*;

/// One attempt of a sweep.
#[derive(Clone, Copy, Debug)]
pub struct SweepPoint {
    /// The target rate of the attempt, requests/s.
    pub offered_rate: f64,
    /// Process CPU seconds per million requests.
    pub cpu_s_per_million: f64,
    /// Whether the rate was held (actual >= 95 % of it).
    pub held: bool,
    /// Whether it was held on time (held and the lateness within the bound; `held`
    /// without a bound).
    pub on_time: bool,
}

/// A highest rate decided held, and the figures of its attempts that held.
#[derive(Clone, Copy, Debug)]
pub struct Knee {
    /// The rate, requests/s.
    pub rate: f64,
    /// Attempts there that held (on time, for an on-time knee).
    pub passed: usize,
    /// Attempts made there.
    pub of: usize,
    /// Median expiry lateness p99 of the attempts that held, ms.
    pub expiry_late_p99_ms: f64,
    /// Median peak resident memory of the attempts that held, MiB.
    pub peak_rss_mib: f64,
}

/// One implementation's sweep.
#[derive(Clone, Debug)]
pub struct Sweep {
    /// Implementation name.
    pub name: String,
    /// Its attempts, in any order.
    pub points: Vec<SweepPoint>,
    /// The highest rate held, plain (none if no rate was).
    pub held: Option<Knee>,
    /// With a lateness bound: the highest rate held on time (none if no rate was).
    pub on_time: Option<Knee>,
}

/// Line colours, in implementation order (matplotlib's first six).
const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes the sweeps as an SVG picture to `path`, captioned `title`; `bound_ms` is the
/// lateness bound of the on-time knees (none: plain knees only).
pub fn plot_sweeps(
    path: &Path,
    title: &str,
    bound_ms: Option<f64>,
    sweeps: &[Sweep],
) -> Result<(), String> {
    let points = || sweeps.iter().flat_map(|s| &s.points);
    let (mut x_lo, mut x_hi, mut y_hi) = (f64::INFINITY, 0.0_f64, 0.0_f64);
    for p in points() {
        x_lo = x_lo.min(p.offered_rate);
        x_hi = x_hi.max(p.offered_rate);
        y_hi = y_hi.max(p.cpu_s_per_million);
    }
    if !(x_lo.is_finite() && x_lo > 0.0) {
        return Err("nothing to plot: the sweep made no attempt".into());
    }
    // Headroom above the highest point for the legend (about 18 px a line of the
    // ~480 px plot, plus its frame), so the legend never hides a point.
    let legend = (40.0 + 18.0 * sweeps.len() as f64) / 480.0;
    let y_top = y_hi / (1.0 - legend.min(0.6)) * 1.05;
    draw(
        path,
        title,
        bound_ms,
        sweeps,
        (x_lo / 1.3, x_hi * 1.3),
        y_top,
    )
    .map_err(|e| format!("cannot draw {}: {e}", path.display()))
}

fn draw(
    path: &Path,
    title: &str,
    bound_ms: Option<f64>,
    sweeps: &[Sweep],
    (x_lo, x_hi): (f64, f64),
    y_top: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (x_lo..x_hi).log_scale().with_key_points(ticks(x_lo, x_hi)),
            0.0..y_top.max(1e-3),
        )?;
    chart
        .configure_mesh()
        .x_desc(match bound_ms {
            Some(b) => format!(
                "offered rate, req/s (log scale); filled: held, p99 <= {b} ms; ring with dot: \
held late; ring: missed; triangles: knees"
            ),
            None => "offered rate, requests/s (log scale); filled dot: held, ring: missed, \
triangle and dashed line: highest rate held"
                .to_owned(),
        })
        .y_desc("process CPU s per 1M requests")
        .x_label_formatter(&|v| rate_label(*v))
        .y_label_formatter(&|v| format!("{v:.2}"))
        .label_style(("sans-serif", 14))
        .light_line_style(WHITE)
        .draw()?;
    for (i, sweep) in sweeps.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut points = sweep.points.clone();
        points.sort_by(|a, b| a.offered_rate.total_cmp(&b.offered_rate));
        let xy = |p: &SweepPoint| (p.offered_rate, p.cpu_s_per_million);
        let knee_text = |knee: Option<Knee>| match knee {
            Some(k) => format!(
                "{} ({} of {}; p99 {:.1} ms, {:.0} MiB)",
                rate_label(k.rate),
                k.passed,
                k.of,
                k.expiry_late_p99_ms,
                k.peak_rss_mib
            ),
            None => "none".to_owned(),
        };
        let label = match bound_ms {
            Some(_) => format!(
                "{}: on time {}; plain {}",
                sweep.name,
                knee_text(sweep.on_time),
                knee_text(sweep.held)
            ),
            None => format!("{}: held {}", sweep.name, knee_text(sweep.held)),
        };
        chart
            .draw_series(LineSeries::new(
                points.iter().map(xy),
                colour.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], colour.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| {
            let ring = if p.on_time {
                colour.filled()
            } else {
                WHITE.filled()
            };
            let dot = if p.held && !p.on_time { 2 } else { 0 };
            EmptyElement::at(xy(p))
                + Circle::new((0, 0), 5, ring)
                + Circle::new((0, 0), 5, colour.stroke_width(2))
                + Circle::new((0, 0), dot, colour.filled())
        }))?;
        // The headline knee: on time with a bound, plain without; the plain one above it
        // hollow and dotted.
        let (first, second) = match bound_ms {
            Some(_) => (sweep.on_time, sweep.held),
            None => (sweep.held, None),
        };
        let point_at = |knee: Option<Knee>, on_time: bool| {
            knee.and_then(|k| {
                points
                    .iter()
                    .find(|p| p.offered_rate == k.rate && if on_time { p.on_time } else { p.held })
                    .copied()
            })
        };
        if let Some(knee) = point_at(first, true) {
            chart.draw_series(DashedLineSeries::new(
                [(knee.offered_rate, 0.0), xy(&knee)],
                6,
                4,
                colour.stroke_width(1),
            ))?;
            chart.draw_series(std::iter::once(TriangleMarker::new(
                xy(&knee),
                9,
                colour.filled(),
            )))?;
        }
        let distinct = second.filter(|s| first.is_none_or(|f| f.rate != s.rate));
        if let Some(knee) = point_at(distinct, false) {
            chart.draw_series(DashedLineSeries::new(
                [(knee.offered_rate, 0.0), xy(&knee)],
                2,
                3,
                colour.stroke_width(1),
            ))?;
            chart.draw_series(std::iter::once(TriangleMarker::new(
                xy(&knee),
                9,
                colour.stroke_width(2),
            )))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The x axis's ticks: 1, 2 and 5 times the powers of ten between `lo` and `hi`.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        ticks.extend(
            [1.0, 2.0, 5.0]
                .map(|m| m * decade)
                .into_iter()
                .filter(|t| (lo..=hi).contains(t)),
        );
        decade *= 10.0;
    }
    ticks
}

/// A rate as people write it, to three significant digits: 750k, 1.56M.
fn rate_label(rate: f64) -> String {
    let (value, unit) = if rate >= 1e6 {
        (rate / 1e6, "M")
    } else if rate >= 1e3 {
        (rate / 1e3, "k")
    } else {
        (rate, "")
    };
    let decimals = match value {
        v if v >= 100.0 => 0,
        v if v >= 10.0 => 1,
        _ => 2,
    };
    let text = format!("{value:.decimals$}");
    let text = if decimals > 0 {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text}{unit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_like_people_write_them() {
        assert_eq!(rate_label(750_000.0), "750k");
        assert_eq!(rate_label(593_750.0), "594k");
        assert_eq!(rate_label(1_500_000.0), "1.5M");
        assert_eq!(rate_label(1_562_500.0), "1.56M");
        assert_eq!(rate_label(2_000_000.0), "2M");
        assert_eq!(rate_label(500.0), "500");
    }

    #[test]
    fn ticks_are_one_two_five_per_decade_inside_the_range() {
        assert_eq!(
            ticks(150_000.0, 2_600_000.0),
            [200_000.0, 500_000.0, 1e6, 2e6]
        );
    }

    #[test]
    fn refuses_an_empty_sweep() {
        let sweeps = [Sweep {
            name: "ours".into(),
            points: Vec::new(),
            held: None,
            on_time: None,
        }];
        let path = std::env::temp_dir().join("purgatory-perf-empty-sweep.svg");
        assert!(plot_sweeps(&path, "t", Some(10.0), &sweeps).is_err());
    }
}
