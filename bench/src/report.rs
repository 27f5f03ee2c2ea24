//! The results table, its JSON, and the plots.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;
use serde_json::json;

use crate::contention::Contended;
use crate::measure::{micros, percentile};

/// One figure, next to the floor it is judged against.
#[derive(Debug, Clone)]
pub struct Row {
    pub engine: &'static str,
    pub figure: String,
    /// The value, in `unit`.
    pub value: f64,
    pub unit: &'static str,
    /// The floor's name and value (same unit), when the figure has one.
    pub floor: Option<(String, f64)>,
    /// The target ratio to the floor, when the issue sets one; for rates
    /// (`unit` ending in "/s") the ratio is floor ÷ value, so lower is better
    /// everywhere.
    pub target: Option<f64>,
}

impl Row {
    pub fn time(engine: &'static str, figure: impl Into<String>, value: Duration) -> Self {
        Row {
            engine,
            figure: figure.into(),
            value: micros(value),
            unit: "µs",
            floor: None,
            target: None,
        }
    }

    pub fn rate(engine: &'static str, figure: impl Into<String>, per_sec: f64) -> Self {
        Row {
            engine,
            figure: figure.into(),
            value: per_sec,
            unit: "/s",
            floor: None,
            target: None,
        }
    }

    pub fn count(engine: &'static str, figure: impl Into<String>, count: u64) -> Self {
        Row {
            engine,
            figure: figure.into(),
            value: count as f64,
            unit: "n",
            floor: None,
            target: None,
        }
    }

    /// The p50 and p99 release → grant latency of a contended run.
    pub fn handoffs(engine: &'static str, run: &Contended) -> [Row; 2] {
        let mut samples = run.handoffs.clone();
        [
            Row::time(
                engine,
                format!("{} waiters: handoff p50", run.tasks),
                percentile(&mut samples, 50.0),
            ),
            Row::time(
                engine,
                format!("{} waiters: handoff p99", run.tasks),
                percentile(&mut samples, 99.0),
            ),
        ]
    }

    pub fn against(mut self, floor: &Row, target: Option<f64>) -> Self {
        self.floor = Some((floor.figure.clone(), floor.value));
        self.target = target;
        self
    }

    /// value ÷ floor for times, floor ÷ value for rates: 1.0 is on the floor.
    pub fn ratio(&self) -> Option<f64> {
        let (_, floor) = self.floor.as_ref()?;
        Some(if self.unit == "/s" {
            floor / self.value
        } else {
            self.value / floor
        })
    }

    pub fn verdict(&self) -> &'static str {
        match (self.ratio(), self.target) {
            (Some(ratio), Some(target)) if ratio <= target => "met",
            (Some(_), Some(_)) => "NOT MET",
            _ => "",
        }
    }
}

pub fn print_table(rows: &[Row]) {
    println!();
    println!(
        "{:<9} {:<52} {:>12} {:>5}  {:<40} {:>7} {:>7}  verdict",
        "engine", "figure", "value", "unit", "floor", "ratio", "target"
    );
    for row in rows {
        let (floor, ratio) = match (&row.floor, row.ratio()) {
            (Some((name, value)), Some(ratio)) => {
                (format!("{name} ({value:.1})"), format!("{ratio:.2}x"))
            }
            _ => (String::new(), String::new()),
        };
        let target = row.target.map(|t| format!("<={t:.2}x")).unwrap_or_default();
        println!(
            "{:<9} {:<52} {:>12.1} {:>5}  {:<40} {:>7} {:>7}  {}",
            row.engine,
            row.figure,
            row.value,
            row.unit,
            floor,
            ratio,
            target,
            row.verdict()
        );
    }
}

pub fn write_json(
    path: &Path,
    rows: &[Row],
    contended: &[(&'static str, Contended)],
) -> std::io::Result<()> {
    let rows: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "engine": r.engine, "figure": r.figure, "value": r.value, "unit": r.unit,
                "floor": r.floor.as_ref().map(|(n, v)| json!({"figure": n, "value": v})),
                "ratio": r.ratio(), "target": r.target, "verdict": r.verdict(),
            })
        })
        .collect();
    let handoffs: Vec<_> = contended
        .iter()
        .map(|(engine, c)| {
            let mut samples = c.handoffs.clone();
            json!({
                "engine": engine, "tasks": c.tasks, "grants_per_sec": c.grants_per_sec,
                "handoff_p50_us": micros(percentile(&mut samples, 50.0)),
                "handoff_p99_us": micros(percentile(&mut samples, 99.0)),
                "samples": samples.len(),
            })
        })
        .collect();
    let doc = json!({ "rows": rows, "contention": handoffs });
    std::fs::write(path, serde_json::to_string_pretty(&doc).expect("json"))
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

/// Release → grant latency as cumulative distributions, one line per run.
pub fn plot_handoffs(
    path: &Path,
    contended: &[(&'static str, Contended)],
) -> Result<(), Box<dyn std::error::Error>> {
    let max_us = contended
        .iter()
        .flat_map(|(_, c)| c.handoffs.iter().map(|d| micros(*d)))
        .fold(1.0f64, f64::max)
        .min(50_000.0);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("release → grant handoff latency (CDF)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((1.0f64..max_us).log_scale(), 0.0f64..1.0)?;
    chart
        .configure_mesh()
        .x_desc("latency (µs, log scale)")
        .y_desc("fraction of handoffs")
        .draw()?;
    for (i, (engine, run)) in contended.iter().enumerate() {
        let mut samples: Vec<f64> = run.handoffs.iter().map(|d| micros(*d).max(1.0)).collect();
        samples.sort_by(f64::total_cmp);
        let n = samples.len().max(1) as f64;
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                samples
                    .iter()
                    .enumerate()
                    .map(|(k, v)| (v.min(max_us), (k + 1) as f64 / n)),
                color.stroke_width(2),
            ))?
            .label(format!("{engine}, {} waiters", run.tasks))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Grants per second against the number of tasks on one name, per engine.
pub fn plot_contention(
    path: &Path,
    caption: &str,
    curves: &[(&'static str, Vec<(usize, f64)>)],
) -> Result<(), Box<dyn std::error::Error>> {
    let lines: Vec<_> = curves
        .iter()
        .map(|(engine, curve)| {
            (
                *engine,
                curve.iter().map(|(t, r)| (*t as f64, *r)).collect(),
            )
        })
        .collect();
    plot_lines(path, caption, ("tasks", "grants/s"), &lines, true)
}

/// Renewals per bucket of `bucket` over time, one line per engine: kept
/// leases renewing spread out, or in bunches.
pub fn plot_renewals(
    path: &Path,
    bucket: Duration,
    series: &[(&'static str, Vec<u64>)],
) -> Result<(), Box<dyn std::error::Error>> {
    let secs = bucket.as_secs_f64();
    let lines: Vec<_> = series
        .iter()
        .map(|(engine, counts)| {
            let points = counts.iter().enumerate();
            (
                *engine,
                points.map(|(k, n)| (k as f64 * secs, *n as f64)).collect(),
            )
        })
        .collect();
    let caption = format!(
        "renewals of {} kept leases, per {} ms",
        crate::held::HELD,
        bucket.as_millis()
    );
    let axes = ("seconds since the last lease was taken", "renewals");
    plot_lines(path, &caption, axes, &lines, false)
}

/// One line per engine from the origin, axes named `(x, y)`; `dots` marks
/// each point too.
fn plot_lines(
    path: &Path,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    lines: &[(&'static str, Vec<(f64, f64)>)],
    dots: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let points = || lines.iter().flat_map(|(_, line)| line.iter());
    let max_y = points().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
    let max_x = points().map(|p| p.0).fold(1.0f64, f64::max) * 1.05;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0f64..max_x, 0.0f64..max_y)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()?;
    for (i, (engine, line)) in lines.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(*engine)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        if dots {
            chart.draw_series(line.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
