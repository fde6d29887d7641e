//! The SVG plots written with `--out`.
//!
//! `latency.svg` is a percentile distribution in the style of HdrHistogram's plotter: the x
//! axis is the percentile on a log scale of 1/(1−q), so that 90 %, 99 %, 99.9 %, … are evenly
//! spaced and the tail gets as much room as the body; y is the latency at that percentile,
//! also on a log scale, so that round trips of microseconds and latencies of milliseconds fit
//! on one plot. One line per histogram of the run.
//!
//! `sweep.svg` is the capacity curve: for each shard count, the latency at each objective's
//! percentile (y, log scale) against the rate the broker achieved (x), one point per step;
//! each objective is a dashed horizontal line. Filled points held, hollow ones broke.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::prelude::*;

const SIZE: (u32, u32) = (1000, 640);
/// Line colours, in turn (from matplotlib's default cycle).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
/// The ticks per half distance of the percentile iteration, as in the `.hgrm` files.
const TICKS_PER_HALF_DISTANCE: u32 = 5;
/// The last percentile the x axis reaches at least (99.9 %), and at most (99.99999 %).
const MIN_DECADES: u32 = 3;
const MAX_DECADES: u32 = 7;

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// The percentile at x = 1/(1−q) = 10^d: 0 %, 90 %, 99 %, 99.9 %, …
pub fn percentile_label(x: f64) -> String {
    let decades = x.log10().round();
    if decades < 0.5 {
        return "0%".into();
    }
    let d = decades as usize;
    if d == 1 {
        "90%".into()
    } else {
        format!("99{}{}%", if d > 2 { "." } else { "" }, "9".repeat(d - 2))
    }
}

/// The points of a percentile distribution: (1/(1−q), value in ns), for every q < 1 of the
/// `.hgrm` iteration (q = 1 lies at infinity; the max is in the table).
pub fn percentile_points(hist: &Histogram<u64>) -> Vec<(f64, f64)> {
    if hist.is_empty() {
        return Vec::new();
    }
    hist.iter_quantiles(TICKS_PER_HALF_DISTANCE)
        .map(|step| (step.quantile_iterated_to(), step.value_iterated_to()))
        .filter(|&(q, _)| q < 1.0)
        .map(|(q, v)| (1.0 / (1.0 - q), v as f64))
        .collect()
}

/// A log axis from the decade at or below `lo` to the one at or above `hi` (both > 0),
/// with room above `hi` so that no point sits on the frame.
fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.log10().floor());
    let mut hi = 10f64.powf((hi * 1.25).log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    (lo, hi)
}

/// The log latency axis for these values (ns): whole decades around the positive ones, or
/// 1 µs to 1 ms when there are none (zero has no place on a log axis).
fn latency_axis(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|&v| v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if hi > 0.0 {
        decades(lo, hi)
    } else {
        (1e3, 1e6)
    }
}

/// The legend box in the upper left corner, over the lines.
fn draw_legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
) -> Result<(), String>
where
    X: Ranged,
    Y: Ranged,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)
}

/// Latency axis labels: nanoseconds shown in µs, or ms when the axis reaches 10 ms.
fn latency_unit(hi_ns: f64) -> (&'static str, f64) {
    if hi_ns > 10e6 {
        ("ms", 1e6)
    } else {
        ("µs", 1e3)
    }
}

fn number(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The caption, margins and axis label areas that both plots share.
fn chart_builder<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, ("sans-serif", 18))
        .margin(20)
        .margin_right(45)
        .x_label_area_size(45)
        .y_label_area_size(70);
    builder
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Writes `latency.svg`: one percentile distribution per (label, histogram).
pub fn latency(
    path: &Path,
    title: &str,
    hists: &[(String, &Histogram<u64>)],
) -> Result<(), String> {
    let series: Vec<(&str, Vec<(f64, f64)>)> = hists
        .iter()
        .map(|(label, h)| (label.as_str(), percentile_points(h)))
        .filter(|(_, points)| !points.is_empty())
        .collect();
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let x_decades = (x_max.log10().ceil() as u32).clamp(MIN_DECADES, MAX_DECADES);
    let x_hi = 10f64.powi(x_decades as i32);
    let (y_lo, y_hi) = latency_axis(all.map(|p| p.1));
    let (unit, scale) = latency_unit(y_hi);

    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let key_points: Vec<f64> = (0..=x_decades).map(|d| 10f64.powi(d as i32)).collect();
    let mut chart = chart_builder(&root, title)
        .build_cartesian_2d(
            (1.0..x_hi).log_scale().with_key_points(key_points),
            (y_lo / scale..y_hi / scale).log_scale(),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc(format!("latency ({unit})"))
        .x_label_formatter(&|x| percentile_label(*x))
        .y_label_formatter(&|y| number(*y))
        .draw()
        .map_err(err)?;
    for (i, (label, points)) in series.iter().enumerate() {
        let c = colour(i);
        // Zero (recorded for early redeliveries) has no place on a log axis: draw it at the
        // bottom.
        let scaled = points.iter().map(|&(x, v)| (x, v.max(y_lo) / scale));
        chart
            .draw_series(LineSeries::new(scaled, c.stroke_width(2)))
            .map_err(err)?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    draw_legend(&mut chart)?;
    root.present().map_err(err)
}

/// One line of the sweep plot: a shard count at one objective's percentile.
pub struct SweepLine {
    pub label: String,
    /// Which shard count: lines of one shard count share a colour.
    pub group: usize,
    /// Which objective: its points are drawn with a shape of their own.
    pub slo: usize,
    /// (achieved rate per second, latency in ns, held), in the order of offered rate.
    pub points: Vec<(f64, f64, bool)>,
}

/// Writes `sweep.svg`: latency against achieved rate per shard count, the objectives as
/// dashed lines.
pub fn sweep(
    path: &Path,
    title: &str,
    latency: &str,
    lines: &[SweepLine],
    slos: &[(String, f64)],
) -> Result<(), String> {
    let points = lines.iter().flat_map(|l| l.points.iter());
    let x_hi = points.clone().map(|p| p.0).fold(1.0, f64::max) * 1.08;
    let (y_lo, y_hi) = latency_axis(points.map(|p| p.1).chain(slos.iter().map(|s| s.1)));
    let (unit, scale) = latency_unit(y_hi);
    let rate_unit = if x_hi >= 2e6 { ("M", 1e6) } else { ("k", 1e3) };

    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = chart_builder(&root, title)
        .build_cartesian_2d(0.0..x_hi, (y_lo / scale..y_hi / scale).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!("achieved rate ({} messages/s)", rate_unit.0))
        .y_desc(format!("{latency} latency ({unit})"))
        .x_label_formatter(&|x| number(*x / rate_unit.1))
        .y_label_formatter(&|y| number(*y))
        .draw()
        .map_err(err)?;
    for (i, (label, limit)) in slos.iter().enumerate() {
        let style = BLACK.mix(0.7).stroke_width(1 + (i == 0) as u32);
        let y = limit / scale;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, y), (x_hi, y)],
                8,
                6,
                style,
            ))
            .map_err(err)?
            .label(format!("SLO {label}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    for line in lines {
        let c = colour(line.group);
        let xy: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|p| (p.0, p.1.max(y_lo) / scale))
            .collect();
        chart
            .draw_series(LineSeries::new(xy.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(line.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        // Filled where the step held, hollow where it broke; one shape per objective.
        let marks = xy.into_iter().zip(&line.points).map(|(p, point)| {
            let style = if point.2 {
                c.filled()
            } else {
                c.stroke_width(2)
            };
            (p, style)
        });
        match line.slo {
            0 => chart.draw_series(marks.map(|(p, s)| Circle::new(p, 4, s))),
            1 => chart.draw_series(marks.map(|(p, s)| TriangleMarker::new(p, 5, s))),
            _ => chart.draw_series(marks.map(|(p, s)| Cross::new(p, 4, s))),
        }
        .map_err(err)?;
    }
    draw_legend(&mut chart)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_labels_per_decade() {
        let labels: Vec<String> = (0..6).map(|d| percentile_label(10f64.powi(d))).collect();
        assert_eq!(labels, ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]);
    }

    #[test]
    fn points_leave_out_the_maximum_and_rise() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 1_000_000, 3).unwrap();
        for v in 1..=1000 {
            h.record(v).unwrap();
        }
        let points = percentile_points(&h);
        assert_eq!(points[0], (1.0, 1.0));
        assert!(points.iter().all(|p| p.0.is_finite()));
        assert!(points
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!(points.last().unwrap().0 >= 100.0);
        assert!(percentile_points(&Histogram::<u64>::new(3).unwrap()).is_empty());
    }

    #[test]
    fn axes_span_whole_decades() {
        assert_eq!(decades(3.0, 4200.0), (1.0, 10_000.0));
        assert_eq!(decades(100.0, 100.0), (100.0, 1000.0));
        assert_eq!(decades(3.0, 984.0), (1.0, 10_000.0));
        assert_eq!(
            latency_axis([0.0, 3.0, 4200.0].into_iter()),
            (1.0, 10_000.0)
        );
        assert_eq!(latency_axis([0.0].into_iter()), (1e3, 1e6));
        assert_eq!(latency_unit(5e6).0, "µs");
        assert_eq!(latency_unit(50e6).0, "ms");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(20.0), "20");
        assert_eq!(number(0.0), "0");
    }
}
