//! SVG charts written directly (no plotting dependency): latency CDF, IOPS vs queue depth, and
//! IOPS time series. Each chart is a standalone SVG 1.1 document.

use crate::report::{ConfigReport, fmt_count, fmt_ns};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const W: f64 = 760.0;
const H: f64 = 440.0;
const L: f64 = 80.0; // left margin
const R: f64 = 230.0; // right margin (legend)
const T: f64 = 40.0;
const B: f64 = 60.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// An axis: linear or log10, with a tick formatter.
#[derive(Clone, Copy)]
pub(crate) struct Axis {
    pub label: &'static str,
    pub log: bool,
    pub fmt: fn(f64) -> String,
    /// The axis reaches at least this value even where no point does (e.g. the end of a run
    /// whose last sample sits at the middle of its bucket).
    pub end: Option<f64>,
}

/// One line.
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Vertical bars `(x, low, high)` drawn in the line's colour, e.g. the min–max spread of
    /// the repetitions behind each point; empty for none.
    pub bars: Vec<(f64, f64, f64)>,
}

impl Series {
    /// A line without bars.
    pub(crate) fn line(name: String, points: Vec<(f64, f64)>) -> Series {
        Series {
            name,
            points,
            bars: Vec::new(),
        }
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn nice_ticks(lo: f64, hi: f64, log: bool) -> Vec<f64> {
    if log {
        let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        return (a..=b)
            .map(|e| 10f64.powi(e))
            .filter(|v| *v >= lo * 0.999 && *v <= hi * 1.001)
            .collect();
    }
    let step = nice_step(hi - lo);
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while v <= hi + step * 1e-9 {
        out.push(v);
        v += step;
    }
    out
}

/// The tick step of a linear axis spanning `span`: 1, 2, 2.5 or 5 times a power of ten, at
/// most 6 steps.
fn nice_step(span: f64) -> f64 {
    let span = span.max(f64::MIN_POSITIVE);
    let mag = 10f64.powf((span / 5.0).log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(mag * 10.0)
}

/// The top of a linear axis whose data reach `hi`: at least 5 % above it (the highest point
/// stays off the frame) and on a tick (the top tick is drawn and labelled).
fn headroom_top(lo: f64, hi: f64) -> f64 {
    let mut top = lo + (hi - lo) * 1.05;
    for _ in 0..4 {
        let step = nice_step(top - lo);
        let t = lo + ((top - lo) / step - 1e-9).ceil() * step;
        if (t - top).abs() <= step * 1e-9 {
            return t;
        }
        top = t;
    }
    top
}

/// Render a line chart.
pub(crate) fn line_chart(title: &str, x: Axis, y: Axis, series: &[Series]) -> String {
    let drawable = |a: f64, b: f64| {
        a.is_finite() && b.is_finite() && (!x.log || a > 0.0) && (!y.log || b > 0.0)
    };
    // The frame holds the bars' ends as well as the points.
    let pts = series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .copied()
                .chain(s.bars.iter().flat_map(|&(a, lo, hi)| [(a, lo), (a, hi)]))
        })
        .filter(|&(a, b)| drawable(a, b));
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for (a, b) in pts {
        x0 = x0.min(a);
        x1 = x1.max(a);
        y0 = y0.min(b);
        y1 = y1.max(b);
    }
    if let Some(e) = x.end.filter(|e| e.is_finite() && (!x.log || *e > 0.0))
        && x0.is_finite()
    {
        x1 = x1.max(e);
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (
            if x.log { 1.0 } else { 0.0 },
            10.0,
            if y.log { 1.0 } else { 0.0 },
            1.0,
        );
    }
    // Linear axes start at 0 (time from the start of the run, IOPS from none).
    if !x.log {
        x0 = x0.min(0.0);
    }
    if !y.log {
        y0 = y0.min(0.0);
        if y1 > y0 {
            y1 = headroom_top(y0, y1);
        }
    }
    if x.log {
        x0 = 10f64.powf(x0.log10().floor());
        x1 = 10f64.powf(x1.log10().ceil());
    }
    if y.log {
        y0 = 10f64.powf(y0.log10().floor());
        y1 = 10f64.powf(y1.log10().ceil());
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let (pw, ph) = (W - L - R, H - T - B);
    let tx = |v: f64| {
        let f = if x.log {
            (v.log10() - x0.log10()) / (x1.log10() - x0.log10())
        } else {
            (v - x0) / (x1 - x0)
        };
        L + f * pw
    };
    let ty = |v: f64| {
        let f = if y.log {
            (v.log10() - y0.log10()) / (y1.log10() - y0.log10())
        } else {
            (v - y0) / (y1 - y0)
        };
        T + ph - f * ph
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<title>{}</title>
<rect width="{W}" height="{H}" fill="white"/>
<text class="title" x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        esc(title),
        L + pw / 2.0,
        esc(title)
    );
    let _ = writeln!(s, r##"<g class="grid" stroke="#ddd" stroke-width="1">"##);
    let xt = nice_ticks(x0, x1, x.log);
    let yt = nice_ticks(y0, y1, y.log);
    for &v in &xt {
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{T}" x2="{:.1}" y2="{:.1}"/>"#,
            tx(v),
            tx(v),
            T + ph
        );
    }
    for &v in &yt {
        let _ = writeln!(
            s,
            r#"<line x1="{L}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/>"#,
            ty(v),
            L + pw,
            ty(v)
        );
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(
        s,
        r#"<g class="axes" stroke="black"><line x1="{L}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/><line x1="{L}" y1="{T}" x2="{L}" y2="{:.1}"/></g>"#,
        T + ph,
        L + pw,
        T + ph,
        T + ph
    );
    for &v in &xt {
        let _ = writeln!(
            s,
            r#"<text class="xtick" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            tx(v),
            T + ph + 16.0,
            esc(&(x.fmt)(v))
        );
    }
    for &v in &yt {
        let _ = writeln!(
            s,
            r#"<text class="ytick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            L - 6.0,
            ty(v) + 4.0,
            esc(&(y.fmt)(v))
        );
    }
    let _ = writeln!(
        s,
        r#"<text class="xlabel" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        L + pw / 2.0,
        H - 18.0,
        esc(x.label)
    );
    let _ = writeln!(
        s,
        r#"<text class="ylabel" transform="translate(18,{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        T + ph / 2.0,
        esc(y.label)
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        for &(a, lo, hi) in &se.bars {
            if !(drawable(a, lo) && drawable(a, hi)) {
                continue;
            }
            let (px, top, bot) = (tx(a), ty(hi), ty(lo));
            let _ = writeln!(
                s,
                r#"<g class="spread" data-name="{}" stroke="{c}" stroke-width="1.5"><line class="bar" x1="{px:.1}" y1="{top:.1}" x2="{px:.1}" y2="{bot:.1}"/><line x1="{:.1}" y1="{top:.1}" x2="{:.1}" y2="{top:.1}"/><line x1="{:.1}" y1="{bot:.1}" x2="{:.1}" y2="{bot:.1}"/></g>"#,
                esc(&se.name),
                px - 4.0,
                px + 4.0,
                px - 4.0,
                px + 4.0
            );
        }
        let p: Vec<String> = se
            .points
            .iter()
            .filter(|&&(a, b)| drawable(a, b))
            .map(|&(a, b)| format!("{:.1},{:.1}", tx(a), ty(b)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline class="series" data-name="{}" fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            esc(&se.name),
            p.join(" ")
        );
        if se.points.len() <= 40 {
            for q in &p {
                if let Some((a, b)) = q.split_once(',') {
                    let _ = writeln!(s, r#"<circle cx="{a}" cy="{b}" r="3" fill="{c}"/>"#);
                }
            }
        }
        let ly = T + 10.0 + i as f64 * 18.0;
        let lx = L + pw + 14.0;
        let _ = writeln!(
            s,
            r#"<g class="legend"><line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text></g>"#,
            lx + 18.0,
            lx + 24.0,
            ly + 4.0,
            esc(&se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_pct(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}
fn fmt_lat(v: f64) -> String {
    fmt_ns(v)
}
fn fmt_num(v: f64) -> String {
    fmt_count(v)
}
/// A tick value as a short decimal: ticks are computed in floating point (`0.2 * 3` is
/// `0.6000000000000001`), so round to 6 decimals before printing.
fn fmt_int(v: f64) -> String {
    let r = (v * 1e6).round() / 1e6;
    format!("{}", if r == 0.0 { 0.0 } else { r })
}

/// Latency CDF of every configuration (all repetitions merged).
pub(crate) fn latency_cdf(results: &[ConfigReport]) -> String {
    let series: Vec<Series> = results
        .iter()
        .map(|r| {
            let points = r
                .merged_hist()
                .cdf()
                .into_iter()
                .map(|(v, f)| (v as f64, f))
                .collect();
            Series::line(r.label.clone(), points)
        })
        .collect();
    line_chart(
        "Latency CDF",
        Axis {
            label: "latency",
            log: true,
            fmt: fmt_lat,
            end: None,
        },
        Axis {
            label: "fraction of I/Os",
            log: false,
            fmt: fmt_pct,
            end: None,
        },
        &series,
    )
}

/// IOPS against queue depth, one line per (rw, bs, numjobs). Each point is the median IOPS of
/// the configuration's repetitions; with more than one, a bar spans their min–max (the spread
/// behind the table's ±CV), so a noisy point is visibly noisy.
pub(crate) fn iops_vs_qd(results: &[ConfigReport]) -> String {
    type Point = (f64, f64, Option<(f64, f64)>);
    let mut groups: BTreeMap<String, Vec<Point>> = BTreeMap::new();
    let mut repeated = false;
    for r in results {
        let c = &r.config;
        let key = format!(
            "{}{} bs={} jobs={}",
            c.name_prefix(),
            c.rw,
            crate::spec::fmt_size(c.bs),
            c.numjobs
        );
        let reps: Vec<f64> = r.runs.iter().map(|x| x.iops).collect();
        let mid = crate::report::median(&reps).unwrap_or(r.summary.iops.mean);
        // The summary's spread is over the same repetitions.
        let iops = &r.summary.iops;
        let bar = (reps.len() > 1).then_some((iops.min, iops.max));
        repeated |= bar.is_some();
        groups
            .entry(key)
            .or_default()
            .push((f64::from(c.iodepth), mid, bar));
    }
    let series: Vec<Series> = groups
        .into_iter()
        .map(|(name, mut pts)| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name,
                points: pts.iter().map(|&(x, y, _)| (x, y)).collect(),
                bars: pts
                    .iter()
                    .filter_map(|&(x, _, b)| b.map(|(lo, hi)| (x, lo, hi)))
                    .collect(),
            }
        })
        .collect();
    let title = if repeated {
        "IOPS vs queue depth (median of repetitions, bars min–max)"
    } else {
        "IOPS vs queue depth"
    };
    line_chart(
        title,
        Axis {
            label: "iodepth",
            log: true,
            fmt: fmt_int,
            end: None,
        },
        Axis {
            label: "IOPS",
            log: false,
            fmt: fmt_num,
            end: None,
        },
        &series,
    )
}

/// Per-second IOPS of the first repetition of every configuration. Each bucket's rate is
/// drawn at the middle of the time it covers, `[t, t + seconds)`: t + 0.5 for whole seconds,
/// and the middle of the shorter last bucket (2.25 s for the last 0.5 s of a 2.5 s run).
pub(crate) fn time_series(results: &[ConfigReport]) -> String {
    let series: Vec<Series> = results
        .iter()
        .filter_map(|r| {
            let run = r.runs.first()?;
            let points = run
                .series
                .iter()
                .map(|s| (s.t as f64 + s.seconds / 2.0, s.iops as f64))
                .collect();
            Some(Series::line(r.label.clone(), points))
        })
        .collect();
    // The axis runs to the end of the longest run, past its last bucket's middle.
    let end = results
        .iter()
        .filter_map(|r| {
            r.runs
                .first()?
                .series
                .last()
                .map(|s| s.t as f64 + s.seconds)
        })
        .fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))));
    line_chart(
        "IOPS per second",
        Axis {
            label: "time (s)",
            log: false,
            fmt: fmt_int,
            end,
        },
        Axis {
            label: "IOPS",
            log: false,
            fmt: fmt_num,
            end: None,
        },
        &series,
    )
}

/// Write all charts into `dir`; returns the files written.
pub fn write_all(dir: &Path, results: &[ConfigReport]) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    for (name, svg) in [
        ("latency-cdf.svg", latency_cdf(results)),
        ("iops-vs-qd.svg", iops_vs_qd(results)),
        ("timeseries.svg", time_series(results)),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, svg)?;
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{one_second, two_and_a_half_seconds};
    use crate::spec::JobSpec;

    /// A tick label as a number (`500`, `1.5k`, `2.00M`, `0.5`).
    fn tick_value(t: &str) -> f64 {
        let (num, mul) = match t.strip_suffix('k') {
            Some(n) => (n, 1e3),
            None => match t.strip_suffix('M') {
                Some(n) => (n, 1e6),
                None => (t, 1.0),
            },
        };
        num.parse::<f64>().unwrap() * mul
    }

    /// Pixel to value on a linear axis of a rendered chart (`"xtick"` or `"ytick"`), read
    /// back from the positions and labels of its first and last ticks, so the checks do not
    /// rely on the code under test's own scale.
    fn axis(doc: &roxmltree::Document, class: &str) -> impl Fn(f64) -> f64 + use<> {
        let ticks: Vec<(f64, f64)> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .map(|n| {
                let px: f64 = if class == "xtick" {
                    n.attribute("x").unwrap().parse().unwrap()
                } else {
                    // Labels sit 4 px below their tick line.
                    n.attribute("y").unwrap().parse::<f64>().unwrap() - 4.0
                };
                (px, tick_value(n.text().unwrap()))
            })
            .collect();
        assert!(ticks.len() >= 3, "{class}: {ticks:?}");
        let ((p0, v0), (p1, v1)) = (ticks[0], ticks[ticks.len() - 1]);
        move |px| v0 + (px - p0) * (v1 - v0) / (p1 - p0)
    }

    fn num(n: roxmltree::Node, a: &str) -> f64 {
        n.attribute(a).unwrap().parse().unwrap()
    }

    #[test]
    fn iops_vs_qd_points_are_medians_with_min_max_bars() {
        let job = |bs: u64, iodepth: u32| JobSpec {
            bs,
            iodepth,
            ..Default::default()
        };
        let reps = |v: &[u64]| v.iter().map(|&n| one_second(n)).collect::<Vec<_>>();
        let results = [
            // Means 1066.7 and 2233.3: the points must sit at the medians instead.
            ConfigReport::of(&job(4096, 1), &reps(&[900, 1300, 1000])),
            ConfigReport::of(&job(4096, 8), &reps(&[2600, 2000, 2100])),
            // One repetition: a point, no bar.
            ConfigReport::of(&job(65536, 1), &reps(&[500])),
            ConfigReport::of(&job(65536, 8), &reps(&[700])),
        ];
        let svg = iops_vs_qd(&results);
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let y = axis(&doc, "ytick");
        let close = |got: f64, want: f64| (got - want).abs() <= 2.0;
        // (series, x pixel, low, high) of every bar.
        let bars: Vec<(String, f64, f64, f64)> = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("spread"))
            .map(|g| {
                let b = g
                    .children()
                    .find(|c| c.attribute("class") == Some("bar"))
                    .unwrap();
                assert_eq!(num(b, "x1"), num(b, "x2"), "a bar is vertical");
                let name = g.attribute("data-name").unwrap().to_string();
                (name, num(b, "x1"), y(num(b, "y2")), y(num(b, "y1")))
            })
            .collect();
        assert_eq!(bars.len(), 2, "{bars:?}");
        for ((name, _, lo, hi), (want_lo, want_hi)) in
            bars.iter().zip([(900.0, 1300.0), (2000.0, 2600.0)])
        {
            assert_eq!(name, "read bs=4k jobs=1");
            assert!(close(*lo, want_lo) && close(*hi, want_hi), "{bars:?}");
        }
        // The line of each series goes through the medians, and each bar stands on its point.
        let lines: Vec<(String, Vec<(f64, f64)>)> = doc
            .descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .map(|l| {
                let pts = l
                    .attribute("points")
                    .unwrap()
                    .split(' ')
                    .map(|p| {
                        let (a, b) = p.split_once(',').unwrap();
                        (a.parse().unwrap(), b.parse::<f64>().unwrap())
                    })
                    .collect();
                (l.attribute("data-name").unwrap().to_string(), pts)
            })
            .collect();
        let medians = |name: &str| -> Vec<(f64, f64)> {
            lines.iter().find(|l| l.0 == name).unwrap().1.clone()
        };
        let with_bars = medians("read bs=4k jobs=1");
        assert_eq!(with_bars.len(), 2);
        for ((px, py), (want, bar)) in with_bars
            .iter()
            .zip([(1000.0, &bars[0]), (2100.0, &bars[1])])
        {
            assert!(close(y(*py), want), "median {want}: {with_bars:?}");
            assert_eq!(*px, bar.1, "bar off its point");
        }
        let single = medians("read bs=64k jobs=1");
        assert!(close(y(single[0].1), 500.0) && close(y(single[1].1), 700.0));
        assert!(svg.contains("median of repetitions, bars min–max"));
        // Without repetitions: no bars, and the title claims none.
        let svg = iops_vs_qd(&results[2..]);
        assert!(
            !svg.contains("class=\"spread\"") && !svg.contains("median"),
            "{svg}"
        );
    }

    #[test]
    fn time_series_points_sit_at_the_middle_of_their_buckets() {
        // 2.5 s at 1000 IOPS: buckets [0,1), [1,2) and the partial [2,2.5).
        let run = two_and_a_half_seconds();
        let svg = time_series(&[ConfigReport::of(&JobSpec::default(), &[run])]);
        let doc = roxmltree::Document::parse(&svg).unwrap();
        let (x, y) = (axis(&doc, "xtick"), axis(&doc, "ytick"));
        let line = doc
            .descendants()
            .find(|n| n.has_tag_name("polyline"))
            .unwrap();
        let pts: Vec<(f64, f64)> = line
            .attribute("points")
            .unwrap()
            .split(' ')
            .map(|p| {
                let (a, b) = p.split_once(',').unwrap();
                (x(a.parse().unwrap()), y(b.parse().unwrap()))
            })
            .collect();
        assert_eq!(pts.len(), 3);
        for ((t, iops), want) in pts.iter().zip([0.5, 1.5, 2.25]) {
            assert!((t - want).abs() < 0.01, "{pts:?}");
            assert!((iops - 1000.0).abs() < 5.0, "{pts:?}");
        }
        // The time axis starts at the start of the run, not at the first point.
        let first = doc
            .descendants()
            .find(|n| n.attribute("class") == Some("xtick"))
            .unwrap();
        assert_eq!(first.text(), Some("0"));
        // ... and reaches its end (2.5 s), not just the last bucket's middle (2.25 s).
        let last = doc
            .descendants()
            .filter(|n| n.attribute("class") == Some("xtick"))
            .filter_map(|n| n.text()?.parse::<f64>().ok())
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(last >= 2.5, "last x tick {last}");
    }

    #[test]
    fn linear_y_axes_end_on_a_tick_above_the_data() {
        for hi in [800_000.0, 1.0, 0.93, 7.2e6, 42.0, 100.0, 3.0] {
            let top = headroom_top(0.0, hi);
            assert!(top >= hi * 1.05 - 1e-9, "{hi} -> {top}");
            let t = nice_ticks(0.0, top, false);
            let last = *t.last().unwrap();
            assert!(
                (last - top).abs() <= top * 1e-9,
                "{hi}: top {top} is no tick: {t:?}"
            );
            assert!(t.len() >= 3 && t.len() <= 8, "{hi}: {t:?}");
        }
        // The old frame ended at the data: 800k had no tick of its own at the top.
        assert_eq!(headroom_top(0.0, 800_000.0), 1_000_000.0);
    }

    #[test]
    fn ticks() {
        assert_eq!(
            nice_ticks(0.0, 10.0, false),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(
            nice_ticks(1.0, 1000.0, true),
            vec![1.0, 10.0, 100.0, 1000.0]
        );
    }

    #[test]
    fn tick_labels_are_round() {
        assert_eq!(fmt_int(0.6000000000000001), "0.6");
        assert_eq!(fmt_int(0.1 + 0.2), "0.3");
        assert_eq!(fmt_int(32.0), "32");
        assert_eq!(fmt_int(-0.0), "0");
        // Every tick of a sub-second time axis prints short.
        for v in nice_ticks(0.0, 1.2, false) {
            let s = fmt_int(v);
            assert!(s.len() <= 4, "{v} printed as {s}");
        }
    }

    #[test]
    fn empty_chart_is_still_svg() {
        let s = line_chart(
            "t<>",
            Axis {
                label: "x",
                log: true,
                fmt: fmt_int,
                end: None,
            },
            Axis {
                label: "y",
                log: false,
                fmt: fmt_int,
                end: None,
            },
            &[],
        );
        assert!(s.contains("<svg") && s.contains("t&lt;&gt;"));
    }
}
