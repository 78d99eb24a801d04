//! What a simulation prints and writes: the table, the CSV of every sample, the SVG charts.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::shape::SAMPLE_S;
use crate::{RunResult, SimError};

/// The table of one scenario's runs, one row per algorithm, as Markdown (readable in a terminal
/// and pasted as is into docs).
pub fn table(results: &[RunResult]) -> String {
    let mut out = String::new();
    if let Some(first) = results.first() {
        let s = &first.scenario;
        // A host count of its own (`--hosts`) splits the same load over another fleet.
        let hosts = match crate::Scenario::named(s.name, None) {
            Ok(named) if named.hosts != s.hosts => format!(", here over {} hosts", s.hosts),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{}: {}{hosts} ({} s, seed {})\n",
            s.name, s.about, s.duration_s, first.seed
        );
    }
    // New columns go last: scripts read the table by column (crates/cli/tests/all/sim.rs).
    out.push_str(
        "| algorithm | enforcement delay | steady-state error | peak overshoot after 1 s | Jain fairness | wrongful drops | control-plane B/host/s | added latency p50 / p99 | second after first |\n",
    );
    out.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    let opt = |v: Option<f64>, f: &dyn Fn(f64) -> String| v.map_or("-".to_owned(), f);
    let percent = |v: f64| format!("{:.1}%", v * 100.0);
    for r in results {
        let m = &r.metrics;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.1} / {:.1} ms | {} |",
            r.algorithm.name(),
            opt(m.enforcement_delay_s, &|v| format!("{v:.1} s")),
            opt(m.steady_error, &percent),
            opt(m.peak_overshoot, &percent),
            opt(m.jain, &|v| format!("{v:.3}")),
            m.wrongful_drops,
            m.control_bytes_per_host_s,
            m.round_trip_p50_ms,
            m.round_trip_p99_ms,
            opt(m.second_after_first, &percent),
        );
    }
    for r in results {
        if let Some(t) = r.metrics.tier_drops {
            let _ = writeln!(
                out,
                "\n{} by criticality over the measured window: {} of the requests dropped, {} of the critical ones, {} of the sheddable ones.",
                r.algorithm.name(),
                percent(t.all),
                percent(t.critical),
                percent(t.sheddable),
            );
        }
    }
    for r in results {
        if let Some(t) = r.metrics.tokens {
            let (from, to) = r.scenario.measure;
            let _ = writeln!(
                out,
                "\n{}'s token budget: {:.3} of the budget admitted over {from}-{to} s ({} answers); offered {}x the budget before {} s, {} of {} requests refused, {} of them while the budget had room.",
                r.algorithm.name(),
                t.admitted,
                t.answers,
                t.under_factor,
                r.scenario.step_from_s,
                t.under_refused,
                t.under_offered,
                t.under_wrongful,
            );
        }
    }
    for r in results {
        if let Some(f) = r.trace.failover {
            let _ = writeln!(out, "\n{}", failover_line(r, &f));
        }
    }
    if let Some(first) = results.first() {
        let n = &first.metrics.noise;
        let _ = writeln!(
            out,
            "\nNoise band at the limit (3 standard deviations of Poisson arrivals): a 100 ms sample ±{}, 1 s (overshoots) ±{}, the measured window (steady-state error) ±{}{}.",
            percent(n.sample_3sd),
            percent(n.second_3sd),
            percent(n.window_3sd),
            opt(n.coin_jain, &|j| format!(
                "; Jain's index of independent coins (binomial) at the ratio {}'s hosts saw: {j:.3}",
                first.algorithm.name()
            )),
        );
    }
    out
}

/// Every sample of every run, one row per (algorithm, sample): `algorithm,t_s,offered_rps,
/// admitted_rps,limit_rps`; for a token budget the rates are tokens a second.
pub fn csv(results: &[RunResult]) -> String {
    let mut out = String::from("algorithm,t_s,offered_rps,admitted_rps,limit_rps\n");
    for r in results {
        for s in &r.trace.samples {
            let _ = writeln!(
                out,
                "{},{:.1},{:.0},{:.0},{:.0}",
                r.algorithm.name(),
                s.t_s,
                s.offered as f64 / SAMPLE_S,
                s.admitted as f64 / SAMPLE_S,
                r.scenario.limit_rps
            );
        }
    }
    out
}

/// Writes `DIR/SCENARIO.csv`, `DIR/SCENARIO.svg` and `DIR/SCENARIO.md` (the table); returns the
/// paths written.
pub fn write(dir: &Path, results: &[RunResult]) -> Result<Vec<PathBuf>, SimError> {
    let Some(first) = results.first() else {
        return Ok(Vec::new());
    };
    let err = |path: &Path, e: &dyn std::fmt::Display| SimError::Write {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|e| err(dir, &e))?;
    let name = first.scenario.name;
    let csv_path = dir.join(format!("{name}.csv"));
    std::fs::write(&csv_path, csv(results)).map_err(|e| err(&csv_path, &e))?;
    let md_path = dir.join(format!("{name}.md"));
    std::fs::write(&md_path, table(results)).map_err(|e| err(&md_path, &e))?;
    let svg_path = dir.join(format!("{name}.svg"));
    chart(&svg_path, results).map_err(|e| err(&svg_path, &e))?;
    Ok(vec![csv_path, svg_path, md_path])
}

/// One panel per algorithm: offered, admitted and the limit over time, requests per second on a
/// shared scale (logarithmic when the offered load dwarfs the limit, as in a 15x surge).
fn chart(path: &Path, results: &[RunResult]) -> Result<(), Box<dyn std::error::Error>> {
    let height = 260 * results.len() as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((results.len(), 1));
    let max = results
        .iter()
        .flat_map(|r| r.trace.samples.iter())
        .map(|s| s.offered.max(s.admitted) as f64 / SAMPLE_S)
        .fold(1.0_f64, f64::max)
        * 1.05;
    for (panel, r) in panels.iter().zip(results) {
        let duration = r.scenario.duration_s;
        let limit = r.scenario.limit_rps;
        let series = |f: &dyn Fn(&crate::FleetSample) -> f64| -> Vec<(f64, f64)> {
            r.trace.samples.iter().map(|s| (s.t_s, f(s))).collect()
        };
        let offered = series(&|s| s.offered as f64 / SAMPLE_S);
        let admitted = series(&|s| s.admitted as f64 / SAMPLE_S);
        let caption = format!("{}: {}", r.scenario.name, r.algorithm.name());
        let mut builder = ChartBuilder::on(panel);
        builder
            .caption(caption, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(70);
        let lines = Lines {
            offered,
            admitted,
            limit,
            duration,
        };
        // A token budget counts tokens: its offered and admitted load is tokens a second.
        let unit = if r.scenario.answers.is_some() {
            "tokens/s"
        } else {
            "requests/s"
        };
        if max > 8.0 * limit {
            let chart =
                builder.build_cartesian_2d(0.0..duration, (limit / 20.0..max).log_scale())?;
            lines.draw(chart, &format!("{unit} (log)"))?;
        } else {
            let chart = builder.build_cartesian_2d(0.0..duration, 0.0..max)?;
            lines.draw(chart, unit)?;
        }
    }
    root.present()?;
    Ok(())
}

/// The three series of one panel, drawn the same way on a linear or a logarithmic axis.
struct Lines {
    offered: Vec<(f64, f64)>,
    admitted: Vec<(f64, f64)>,
    limit: f64,
    duration: f64,
}

impl Lines {
    fn draw<'a, DB, Y>(
        self,
        mut chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
        y_desc: &str,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        DB: DrawingBackend + 'a,
        DB::ErrorType: 'static,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        let style = |c: &RGBColor| ShapeStyle::from(c).stroke_width(2);
        chart
            .configure_mesh()
            .x_desc("simulated seconds")
            .y_desc(y_desc)
            .draw()?;
        let limit = vec![(0.0, self.limit), (self.duration, self.limit)];
        for (points, label, color) in [
            (self.offered, "offered", BLUE),
            (self.admitted, "admitted", GREEN),
            (limit, "limit", RED),
        ] {
            chart
                .draw_series(LineSeries::new(points, style(&color)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
        Ok(())
    }
}

/// What a controller's failover did to a run: when the standby led and instructed, and the
/// fleet's admitted rate against the limit in each second from the kill until two seconds after
/// the new leader's instructions arrived, with the worst.
pub fn failover_line(r: &RunResult, f: &crate::engine::FailoverTrace) -> String {
    let limit = r.scenario.limit_rps;
    let samples_per_s = (1.0 / crate::shape::SAMPLE_S).round() as usize;
    let from = f.killed_s.floor() as usize;
    let to = f
        .reached_zone_s
        .map_or(r.scenario.duration_s, |t| t + 2.0)
        .min(r.scenario.duration_s)
        .ceil() as usize;
    let seconds: Vec<(usize, f64)> = (from..to)
        .map(|s| {
            let admitted: u64 = r
                .trace
                .samples
                .iter()
                .skip(s * samples_per_s)
                .take(samples_per_s)
                .map(|x| x.admitted)
                .sum();
            (s, admitted as f64 / limit)
        })
        .collect();
    let worst = seconds
        .iter()
        .max_by(|a, b| (a.1 - 1.0).abs().total_cmp(&(b.1 - 1.0).abs()));
    let when =
        |t: Option<f64>| t.map_or("never".to_owned(), |t| format!("{:.2} s", t - f.killed_s));
    let mut line = format!(
        "{}: the leader died at {:.1} s; the standby led {:.2} s later at epoch {}, sent its first instructions {} after the death and they reached an aggregator {} after it. Admitted per second against the limit from the death on:",
        r.algorithm.name(),
        f.killed_s,
        f.led_s - f.killed_s,
        f.epoch,
        when(f.instructed_s),
        when(f.reached_zone_s),
    );
    for (s, part) in &seconds {
        let _ = write!(line, " {s}-{} s {:.0}%;", s + 1, part * 100.0);
    }
    if let Some((s, part)) = worst {
        let _ = write!(
            line,
            " the worst second {s}-{} s at {:.0}%.",
            s + 1,
            part * 100.0
        );
    }
    line
}
