//! Results: tables in Markdown, the targets of the benchmark issue, and the
//! plot.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// A Markdown table.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Heading above the table.
    pub title: String,
    /// What the table measured and how, one paragraph.
    pub note: String,
    /// Column names.
    pub header: Vec<String>,
    /// Cells, already formatted.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these columns.
    pub fn new(title: &str, note: &str, header: &[&str]) -> Table {
        Table {
            title: title.to_owned(),
            note: note.to_owned(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn markdown(&self, out: &mut String) {
        let _ = writeln!(out, "### {}\n", self.title);
        if !self.note.is_empty() {
            let _ = writeln!(out, "{}\n", self.note);
        }
        let _ = writeln!(out, "| {} |", self.header.join(" | "));
        let align: Vec<&str> = self
            .header
            .iter()
            .enumerate()
            .map(|(i, _)| if i == 0 { "---" } else { "---:" })
            .collect();
        let _ = writeln!(out, "|{}|", align.join("|"));
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out.push('\n');
    }
}

/// One point of the concurrency sweep (batch 50), in jobs (rows) per second.
#[derive(Clone, Copy, Debug)]
pub struct SweepPoint {
    /// pgbench clients.
    pub clients: u32,
    /// pg_lease claim_pending + release_batch.
    pub lease: f64,
    /// Hand-written CTE claim + DELETE.
    pub hand: f64,
    /// 50-row primary-key UPDATE, rows per second.
    pub ceiling: f64,
}

/// Everything one run measured.
#[derive(Debug, Default)]
pub struct Results {
    /// The tables, in the order they were measured.
    pub tables: Vec<Table>,
    /// Named numbers the targets are computed from.
    pub metrics: BTreeMap<&'static str, f64>,
    /// The concurrency sweep, for the plot.
    pub sweep: Vec<SweepPoint>,
    /// Lines describing the setup (versions, settings, sizes).
    pub setup: Vec<String>,
}

/// Formats a rate: `43.5k` or `812`.
pub fn rate(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// Formats a ratio: `0.61×`.
pub fn ratio(v: f64) -> String {
    format!("{v:.2}×")
}

struct Target {
    what: &'static str,
    /// Measured value, or None when a needed metric is missing.
    value: Option<f64>,
    goal: f64,
    /// Goal is an upper bound (latency) rather than a lower one.
    at_most: bool,
    unit: &'static str,
}

fn targets(m: &BTreeMap<&'static str, f64>) -> Vec<Target> {
    let get = |k: &str| m.get(k).copied();
    let div = |a: &str, b: &str| match (get(a), get(b)) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    vec![
        Target {
            what: "Worker 1 × 16 slots, defaults / hand-written batch-50 SQL, 200k no-op jobs",
            value: div("worker_jobs_s", "worker_hand_jobs_s"),
            goal: 1.0,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "Worker 2 × 8 slots, defaults / hand-written batch-50 SQL, 200k no-op jobs",
            value: div("worker_split_jobs_s", "worker_hand_jobs_s"),
            goal: 1.0,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "Worker 1 × 16 slots, defaults, 10 ms jobs / (16 slots / 10 ms)",
            value: get("worker_slow_share"),
            goal: 0.9,
            at_most: false,
            unit: "share",
        },
        Target {
            what: "pg_lease batch 50 / 50-row PK UPDATE ceiling (rows/s)",
            value: div("lease_b50", "ceiling_50_rows"),
            goal: 0.5,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "pg_lease batch 1 / 1-row PK UPDATE ceiling (two statements per job)",
            value: div("lease_b1", "ceiling_1_rows"),
            goal: 0.45,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "pg_lease batch 1 / hand-written batch 1",
            value: div("lease_b1", "hand_b1"),
            goal: 0.9,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "pg_lease batch 50 / hand-written batch 50",
            value: div("lease_b50", "hand_b50"),
            goal: 1.0,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "pg_lease batch 50 / hand-written batch 50, a tenth of the rows",
            value: div("lease_b50_small", "hand_b50_small"),
            goal: 1.0,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "Rust client batch 50 / pgbench, same SQL, 16 connections",
            value: div("client_b50", "lease_b50"),
            goal: 0.8,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "Rust client batch 1 / pgbench, same SQL, 16 connections",
            value: div("client_b1", "lease_b1"),
            goal: 0.8,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "claim latency (batch 1, median) at the largest backlog / at 10^3",
            value: div("claim_lat_largest", "claim_lat_1e3"),
            goal: 1.5,
            at_most: true,
            unit: "×",
        },
        Target {
            what: "renewals that are HOT updates",
            value: get("renew_hot_share"),
            goal: 0.9,
            at_most: false,
            unit: "share",
        },
        Target {
            what: "pg_lease batch 50 with pinned xmin / without (moonshot 0.8×)",
            value: div("lease_pinned", "lease_unpinned"),
            goal: 0.6,
            at_most: false,
            unit: "×",
        },
        Target {
            what: "sustained churn, second half: table + indexes / their live rows' size",
            value: get("churn_versus_live"),
            goal: 10.0,
            at_most: true,
            unit: "×",
        },
        Target {
            what: "sustained churn: size at the end / size half-way",
            value: get("churn_late_growth"),
            goal: 1.1,
            at_most: true,
            unit: "×",
        },
    ]
}

fn show(v: f64, unit: &str) -> String {
    match unit {
        "×" => ratio(v),
        "share" => format!("{:.0}%", v * 100.0),
        _ => rate(v),
    }
}

impl Results {
    /// The whole report in Markdown: targets (ratios) first, then the setup,
    /// then every table with absolute numbers.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        out.push_str("### Targets (ratios from this run)\n\n");
        out.push_str("| target | measured | goal | |\n|---|---:|---:|---|\n");
        for t in targets(&self.metrics) {
            let (measured, verdict) = match t.value {
                None => ("—".to_owned(), "not measured".to_owned()),
                Some(v) => {
                    let met = if t.at_most { v <= t.goal } else { v >= t.goal };
                    let by = if t.at_most { v / t.goal } else { t.goal / v };
                    let verdict = if met {
                        "met".to_owned()
                    } else if t.unit == "share" {
                        format!("**missed** by {:.0} points", (t.goal - v) * 100.0)
                    } else {
                        format!("**missed** ({:.2}× short)", by)
                    };
                    (show(v, t.unit), verdict)
                }
            };
            let goal = format!(
                "{}{}",
                if t.at_most { "≤ " } else { "≥ " },
                show(t.goal, t.unit)
            );
            let _ = writeln!(out, "| {} | {measured} | {goal} | {verdict} |", t.what);
        }
        out.push_str("\n### Setup\n\n");
        for line in &self.setup {
            let _ = writeln!(out, "* {line}");
        }
        out.push('\n');
        for table in &self.tables {
            table.markdown(&mut out);
        }
        out
    }
}

/// Fonts tried for the plot's text, in order (Debian's fonts-dejavu-core
/// first); `PG_LEASE_BENCH_FONT` overrides.
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers a TTF for plotters' ab_glyph text backend. The font is read at
/// run time rather than embedded, so no font file is vendored; without one
/// the plot cannot have labels and is skipped.
fn load_font() -> Result<(), String> {
    let env = std::env::var("PG_LEASE_BENCH_FONT").ok();
    let candidates = env
        .iter()
        .map(String::as_str)
        .chain(FONT_PATHS.iter().copied());
    for path in candidates {
        if let Ok(bytes) = std::fs::read(path) {
            // plotters keeps the font for the rest of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{path} is not a usable TTF font"));
        }
    }
    Err(format!(
        "no TTF font found (tried {}; install fonts-dejavu-core or set PG_LEASE_BENCH_FONT)",
        FONT_PATHS.join(", ")
    ))
}

/// The sweep as JSON (`sweep.json` next to the report), so that the plot
/// can be drawn again from a run's data (`bench --plot-from DIR`).
pub fn sweep_json(sweep: &[SweepPoint]) -> String {
    let points: Vec<serde_json::Value> = sweep
        .iter()
        .map(|p| {
            serde_json::json!({
                "clients": p.clients, "lease": p.lease, "hand": p.hand, "ceiling": p.ceiling,
            })
        })
        .collect();
    serde_json::Value::Array(points).to_string()
}

/// Reads what [`sweep_json`] wrote.
pub fn sweep_from_json(text: &str) -> Result<Vec<SweepPoint>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("sweep.json: {e}"))?;
    let points = value.as_array().ok_or("sweep.json: not an array")?;
    points
        .iter()
        .map(|p| {
            let num = |k: &str| {
                p.get(k)
                    .and_then(serde_json::Value::as_f64)
                    .ok_or_else(|| format!("sweep.json: point without {k}"))
            };
            Ok(SweepPoint {
                clients: num("clients")? as u32,
                lease: num("lease")?,
                hand: num("hand")?,
                ceiling: num("ceiling")?,
            })
        })
        .collect()
}

/// Draws throughput vs concurrency at batch 50 (pg_lease, hand-written, the
/// 50-row ceiling) into a PNG.
pub fn plot(sweep: &[SweepPoint], path: &Path, title: &str) -> Result<(), String> {
    if sweep.is_empty() {
        return Err("no sweep points to plot".to_owned());
    }
    load_font()?;
    let e = |err: &dyn std::fmt::Display| format!("plot {}: {err}", path.display());
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let max_x = sweep.iter().map(|p| p.clients).max().unwrap_or(1) as f64;
    let values = || sweep.iter().flat_map(|p| [p.lease, p.hand, p.ceiling]);
    // A log axis: the ceiling is an order of magnitude above the drains, and
    // on a linear axis the two drain lines would lie on top of each other.
    let max_y = values().fold(1.0_f64, f64::max) * 1.5;
    // From a power of ten, so that the axis has labels below the first decade.
    let lowest = (values().fold(f64::INFINITY, f64::min) / 1.5).clamp(1.0, max_y / 2.0);
    let min_y = 10f64.powf(lowest.log10().floor());
    // Clients on a log2 axis: 1, 2, 4, ... spread evenly.
    let lx = |c: u32| (c as f64).log2();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.2..max_x.log2() + 0.2, (min_y..max_y).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("concurrent clients (pgbench -c), log scale")
        .y_desc("jobs (rows) per second, log scale")
        .x_labels(sweep.len() + 2)
        .y_labels(30)
        .x_label_formatter(&|v| format!("{:.0}", 2f64.powf(*v)))
        .y_label_formatter(&|v| rate(*v))
        .label_style(("sans-serif", 16))
        .draw()
        .map_err(|x| e(&x))?;
    type Series = (&'static str, RGBColor, fn(&SweepPoint) -> f64);
    let series: [Series; 3] = [
        ("pg_lease (claim_pending + release_batch)", BLUE, |p| {
            p.lease
        }),
        ("hand-written (CTE + SKIP LOCKED, DELETE)", RED, |p| p.hand),
        ("ceiling: 50-row PK UPDATE, rows/s", BLACK, |p| p.ceiling),
    ];
    for (label, color, get) in series {
        let points: Vec<(f64, f64)> = sweep.iter().map(|p| (lx(p.clients), get(p))).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
            .map_err(|x| e(&x))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 5, color.filled())),
            )
            .map_err(|x| e(&x))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
