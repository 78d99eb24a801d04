//! Draws what `bench/proxy/run.sh` printed as an SVG chart: for each of its open-loop tables
//! (Redis on loopback, across the link, shared with the fleet), the latency that nginx, spillway
//! (a bucket not hit) and the Redis-per-request limiter add over direct at p50, p99 and p99.5,
//! with the allowance the sidecar's added tail is held to: a tenth of the Redis path's added p99.5.
//! Std-only, built with `rustc -O` like the other helpers beside it.
//!
//! Usage: chart RUN.md > CHART.svg   (RUN.md: run.sh's standard output)

use std::fmt::Write as _;

/// One open-loop table: its title and the added p50, p99 and p99.5 (ms) of each path.
struct Panel {
    title: &'static str,
    rows: [[f64; 3]; 3],
}

const PATHS: [&str; 3] = ["nginx, limit_req", "spillway", "Redis per request"];
const COLOURS: [&str; 3] = ["#9e9e9e", "#1f77b4", "#ff7f0e"];
const PERCENTILES: [&str; 3] = ["p50", "p99", "p99.5"];

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: chart RUN.md > CHART.svg");
        std::process::exit(2);
    });
    let text = std::fs::read_to_string(&path).unwrap_or_else(|err| {
        eprintln!("cannot read {path}: {err}");
        std::process::exit(1);
    });
    let panels = parse(&text).unwrap_or_else(|err| {
        eprintln!("{path}: {err}");
        std::process::exit(1);
    });
    print!("{}", svg(&panels));
}

/// The three open-loop tables, each from its heading line to the blank line after its rows.
fn parse(text: &str) -> Result<Vec<Panel>, String> {
    let titles = [
        ("Open loop: paced", "Redis on loopback"),
        ("Open loop, Redis across the link: paced", "Redis across the link"),
        (
            "Open loop, Redis across the link and serving",
            "across the link, shared with a fleet",
        ),
    ];
    let lines: Vec<&str> = text.lines().collect();
    let mut panels = Vec::new();
    for (heading, title) in titles {
        let start = lines
            .iter()
            .position(|l| l.starts_with(heading))
            .ok_or_else(|| format!("no table headed \"{heading}\""))?;
        let mut direct = None;
        let mut rows = [None; 3];
        let table = lines.iter().enumerate().skip(start + 1);
        for (number, line) in table.skip_while(|(_, l)| !l.starts_with('|')) {
            if !line.starts_with('|') {
                break;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if cells.len() < 7 {
                continue;
            }
            let name = cells[1];
            let row = match name {
                n if n.starts_with("direct") => None,
                n if n.starts_with("nginx") => Some(0),
                "spillway proxy, limit not hit" => Some(1),
                n if n.contains("Redis per request") => Some(2),
                _ => continue,
            };
            let mut times = [0.0; 3];
            for (i, cell) in cells[4..7].iter().enumerate() {
                times[i] = cell
                    .split_whitespace()
                    .next()
                    .and_then(|ms| ms.parse().ok())
                    .ok_or_else(|| format!("line {}: no time in \"{cell}\"", number + 1))?;
            }
            match row {
                None => direct = Some(times),
                Some(i) => rows[i] = Some(times),
            }
        }
        let direct = direct.ok_or_else(|| format!("no direct row under \"{heading}\""))?;
        let mut added = [[0.0; 3]; 3];
        for (i, row) in rows.iter().enumerate() {
            let row = row.ok_or_else(|| format!("no {} row under \"{heading}\"", PATHS[i]))?;
            for p in 0..3 {
                added[i][p] = row[p] - direct[p];
            }
        }
        panels.push(Panel {
            title,
            rows: added,
        });
    }
    Ok(panels)
}

/// A round axis maximum at or above `max`: 1, 2 or 5 times a power of ten.
fn nice(max: f64) -> f64 {
    let max = max.max(0.1);
    let power = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|v| *v >= max)
        .unwrap_or(10.0 * power)
}

fn svg(panels: &[Panel]) -> String {
    let (panel_w, panel_h, top, left, bottom) = (300.0, 300.0, 70.0, 50.0, 40.0);
    let width = left + panel_w * panels.len() as f64 + 20.0;
    let height = top + panel_h + bottom;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{left}" y="20" font-size="14" font-weight="bold">Latency added over direct, open loop (ms, medians of the rounds)</text>"#
    );
    for (i, (path, colour)) in PATHS.iter().zip(COLOURS).enumerate() {
        let x = left + i as f64 * 160.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="32" width="12" height="12" fill="{colour}"/><text x="{}" y="42">{path}</text>"#,
            x + 16.0
        );
    }
    let x = left + 3.0 * 160.0;
    let _ = writeln!(
        out,
        r#"<line x1="{x}" y1="38" x2="{}" y2="38" stroke="black" stroke-dasharray="4 3"/><text x="{}" y="42">allowance: a tenth of the Redis path's added p99.5</text>"#,
        x + 20.0,
        x + 24.0
    );
    let plot_h = panel_h - 40.0;
    for (k, panel) in panels.iter().enumerate() {
        let x0 = left + k as f64 * panel_w;
        let y0 = top + 20.0 + plot_h;
        let max = panel.rows.iter().flatten().fold(0.0f64, |m, v| m.max(*v));
        let axis = nice(max * 1.05);
        let y = |v: f64| y0 - plot_h * v.clamp(0.0, axis) / axis;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
            x0 + panel_w / 2.0,
            top + 8.0,
            panel.title
        );
        // Steps of 1 or 2 times a power of ten: five of them, or four when the axis is 2, 20, ...
        let ticks = if format!("{axis:e}").starts_with('2') { 4 } else { 5 };
        for t in 0..=ticks {
            // Rounded, so a tick reads 0.3 rather than 0.30000000000000004.
            let v = (axis * t as f64 / ticks as f64 * 1e6).round() / 1e6;
            let _ = writeln!(
                out,
                r##"<line x1="{x0}" y1="{yy}" x2="{}" y2="{yy}" stroke="#e0e0e0"/><text x="{}" y="{}" text-anchor="end">{v}</text>"##,
                x0 + panel_w - 20.0,
                x0 - 4.0,
                y(v) + 4.0,
                yy = y(v),
            );
        }
        let group_w = (panel_w - 20.0) / 3.0;
        let bar_w = group_w / 4.0;
        for (p, percentile) in PERCENTILES.iter().enumerate() {
            let gx = x0 + p as f64 * group_w + bar_w / 2.0;
            for (i, colour) in COLOURS.iter().enumerate() {
                let v = panel.rows[i][p];
                let bx = gx + i as f64 * bar_w;
                let _ = writeln!(
                    out,
                    r#"<rect x="{bx:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{colour}"><title>{}, {percentile}: {v:.2} ms</title></rect>"#,
                    y(v),
                    bar_w - 2.0,
                    y0 - y(v),
                    PATHS[i]
                );
            }
            let _ = writeln!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{percentile}</text>"#,
                gx + 1.5 * bar_w,
                y0 + 16.0
            );
        }
        // The goal for the tail: spillway's added p99.5 at most a tenth of the Redis path's.
        let allowance = panel.rows[2][2] / 10.0;
        let gx = x0 + 2.0 * group_w + bar_w / 2.0;
        let _ = writeln!(
            out,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black" stroke-dasharray="4 3"><title>allowance, a tenth of the Redis path's added p99.5: {allowance:.2} ms</title></line>"#,
            gx - 4.0,
            y(allowance),
            gx + 3.0 * bar_w + 2.0,
            y(allowance)
        );
        let _ = writeln!(
            out,
            r#"<line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}" stroke="black"/>"#,
            x0 + panel_w - 20.0
        );
    }
    out.push_str("</svg>\n");
    out
}
