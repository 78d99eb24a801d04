//! One SVG per bucket: the history (each hour's highest minute), the forecast band of next
//! week, and the current and proposed limits. Drawn with plotters' SVG backend alone, as the
//! simulator's and the demo's charts are: text is left to the browser, so no font library or
//! font file is needed to draw it.

use plotters::coord::CoordTranslate;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::history::History;
use crate::plan::Proposal;
use crate::report::rate;
use crate::series::{DAY, HOUR, WEEK};
use crate::time;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 420;
const LEFT: u32 = 70;
const RIGHT: u32 = 150;
const TOP: u32 = 40;
const BOTTOM: u32 = 55;

/// A file name for the bucket's chart: `api__gw-a.svg`, with anything but letters, digits, `.`,
/// `_` and `-` replaced.
pub fn file_name(p: &Proposal) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    match &p.region {
        Some(region) => format!(
            "{}__{}__{}.svg",
            clean(&p.service),
            clean(&p.bucket),
            clean(region)
        ),
        None => format!("{}__{}.svg", clean(&p.service), clean(&p.bucket)),
    }
}

/// A round step for about `count` ticks up to `max`: 1, 2 or 5 times a power of ten.
fn tick_step(max: f64, count: f64) -> f64 {
    let raw = (max / count).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * power)
}

/// The height of a line of the labels' text (font size 11).
const TEXT_LINE: f64 = 13.0;

/// An axis label with as many decimals as the step needs: `0`, `5000`, `2.5`.
fn tick_label(value: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    format!("{value:.decimals$}")
}

/// The chart of one proposal and its history.
pub fn svg(p: &Proposal, h: &History) -> Result<String, String> {
    let mut out = String::new();
    draw(&mut out, p, h).map_err(|e| format!("cannot draw the chart: {e}"))?;
    out.push('\n');
    Ok(out)
}

/// `#1f77b4` and the like, as plotters takes them.
const fn colour(rgb: u32) -> RGBColor {
    RGBColor((rgb >> 16) as u8, (rgb >> 8) as u8, rgb as u8)
}

const HISTORY: RGBColor = colour(0x1f77b4);
const FORECAST: RGBColor = colour(0xe08900);
const BAND: RGBColor = colour(0xf5a623);
const CURRENT: RGBColor = colour(0x555555);
const PROPOSED: RGBColor = colour(0xd62728);

/// Text of `px` pixels (plotters writes a font's size as `size / 1.24`).
fn text_style(px: f64, colour: RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    ("sans-serif", px * 1.24, FontStyle::Normal)
        .into_font()
        .color(&colour)
        .pos(Pos::new(h, v))
}

fn line(colour: RGBColor, width: u32) -> ShapeStyle {
    ShapeStyle::from(colour).stroke_width(width)
}

fn draw(out: &mut String, p: &Proposal, h: &History) -> Result<(), Box<dyn std::error::Error>> {
    let start = h.window.start;
    let end = h.window.end + WEEK;
    let forecast: Vec<(f64, f64, f64, f64)> = (0..7 * 24)
        .filter_map(|hour| {
            let value = h.forecast_hour(hour)?;
            let (low, high) = h.forecast.as_ref().ok()?.band(value);
            Some((
                (h.window.end + hour as i64 * HOUR + HOUR / 2) as f64,
                value,
                low,
                high,
            ))
        })
        .collect();
    let ymax = h
        .hourly_max
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .chain(forecast.iter().map(|f| f.3))
        .chain(p.current_limit_rps)
        .chain(p.proposed_limit_rps)
        .fold(0.0f64, f64::max)
        .max(1e-3)
        * 1.1;
    let step = tick_step(ymax, 5.0);
    let ymax = (ymax / step).ceil() * step;
    let (x0, x1) = (start as f64, end as f64);

    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .margin_left(LEFT)
        .margin_right(RIGHT)
        .margin_top(TOP)
        .margin_bottom(BOTTOM)
        .build_cartesian_2d(x0..x1, 0.0..ymax)?;
    let coords = chart.as_coord_spec().clone();
    let at = |t: f64, v: f64| coords.translate(&(t, v));
    let small = |colour, h, v| text_style(11.0, colour, h, v);

    let change = match (p.current_limit_rps, p.proposed_limit_rps) {
        (Some(c), Some(n)) => format!("{} → {}", rate(c), rate(n)),
        (None, Some(n)) => format!("new, {}", rate(n)),
        (Some(c), None) => rate(c),
        (None, None) => "no limit".to_owned(),
    };
    root.draw(&Text::new(
        format!(
            "{}/{} — {}: {} {change} requests/s",
            p.service,
            p.bucket,
            p.policy.name(),
            p.action.name()
        ),
        (LEFT as i32, 22),
        ("sans-serif", 14.0 * 1.24, FontStyle::Bold)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Bottom)),
    ))?;

    // Grid and axes: a line and a label every `step` requests/s, a line every day, heavier
    // and dated every week from the end of the history.
    let mut v = 0.0;
    while v <= ymax + step / 2.0 {
        chart.draw_series([PathElement::new(
            [(x0, v), (x1, v)],
            line(RGBColor(0xe5, 0xe5, 0xe5), 1),
        )])?;
        let (x, y) = at(x0, v);
        root.draw(&Text::new(
            tick_label(v, step),
            (x - 6, y),
            small(BLACK, HPos::Right, VPos::Center),
        ))?;
        v += step;
    }
    let mut day = start.div_euclid(DAY) * DAY + DAY;
    while day < end {
        let weekly = (day.div_euclid(DAY) - h.window.end.div_euclid(DAY)).rem_euclid(7) == 0;
        let grey = if weekly { 0xcc } else { 0xf2 };
        let t = day as f64;
        chart.draw_series([PathElement::new(
            [(t, 0.0), (t, ymax)],
            line(RGBColor(grey, grey, grey), 1),
        )])?;
        if weekly {
            let (x, y) = at(t, 0.0);
            root.draw(&Text::new(
                time::format_date(day),
                (x, y + 6),
                small(BLACK, HPos::Center, VPos::Top),
            ))?;
        }
        day += DAY;
    }
    let now = h.window.end as f64;
    chart.draw_series([DashedPathElement::new(
        [(now, 0.0), (now, ymax)],
        2,
        3,
        line(CURRENT, 1),
    )])?;
    let (x, y) = at(now, ymax);
    root.draw(&Text::new(
        time::format_minute(h.window.end),
        (x, y - 4),
        small(CURRENT, HPos::Center, VPos::Bottom),
    ))?;

    // The forecast band and its centre.
    if !forecast.is_empty() {
        let band = forecast
            .iter()
            .map(|f| (f.0, f.3))
            .chain(forecast.iter().rev().map(|f| (f.0, f.2)));
        chart.draw_series([Polygon::new(band.collect::<Vec<_>>(), BAND.mix(0.25))])?;
        chart.draw_series([PathElement::new(
            forecast.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>(),
            line(FORECAST, 1),
        )])?;
    }
    // The history: each hour's highest minute, broken at gaps.
    let hours = h.hourly_max.iter().enumerate().map(|(hour, value)| {
        (
            (start + hour as i64 * HOUR + HOUR / 2) as f64,
            value.is_finite().then_some(*value),
        )
    });
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for (t, value) in hours {
        match value {
            Some(v) => runs.last_mut().into_iter().for_each(|run| run.push((t, v))),
            None if runs.last().is_some_and(|run| !run.is_empty()) => runs.push(Vec::new()),
            None => {}
        }
    }
    chart.draw_series(
        runs.into_iter()
            .filter(|run| !run.is_empty())
            .map(|run| PathElement::new(run, line(HISTORY, 1))),
    )?;

    // The limits, labelled at the right; two labels closer than a line of text are pushed
    // apart (a limit of 100 and a proposal of 200 on an axis up to 25,000 are 1 px apart).
    let limits: Vec<(f64, &str, RGBColor)> = [
        (p.current_limit_rps, "current", CURRENT),
        (p.proposed_limit_rps, "proposed", PROPOSED),
    ]
    .into_iter()
    .filter_map(|(value, label, colour)| value.map(|v| (v, label, colour)))
    .collect();
    let mut label_y: Vec<i32> = limits.iter().map(|l| at(x1, l.0).1).collect();
    let gap = TEXT_LINE as i32;
    if let [a, b] = label_y[..]
        && (a - b).abs() < gap
    {
        let upper = (a + b) / 2 - gap / 2;
        // The higher limit's label goes above (y grows downwards); equal ones: current.
        label_y = if a <= b {
            vec![upper, upper + gap]
        } else {
            vec![upper + gap, upper]
        };
    }
    for ((v, label, colour), ly) in limits.iter().zip(&label_y) {
        let path = [(x0, *v), (x1, *v)];
        if *label == "current" {
            chart.draw_series([DashedPathElement::new(path, 6, 4, line(*colour, 2))])?;
        } else {
            chart.draw_series([PathElement::new(path, line(*colour, 2))])?;
        }
        root.draw(&Text::new(
            format!("{label} {}", rate(*v)),
            (at(x1, *v).0 + 6, *ly),
            small(*colour, HPos::Left, VPos::Center),
        ))?;
    }

    // Legend.
    for (i, (colour, text)) in [
        (HISTORY, "history: each hour's highest minute"),
        (FORECAST, "forecast, with its band (±2σ)"),
    ]
    .into_iter()
    .enumerate()
    {
        let (lx, ly) = (LEFT as i32 + i as i32 * 280, HEIGHT as i32 - 14);
        root.draw(&PathElement::new(
            [(lx, ly), (lx + 18, ly)],
            line(colour, 2),
        ))?;
        root.draw(&Text::new(
            text,
            (lx + 22, ly),
            small(BLACK, HPos::Left, VPos::Center),
        ))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Evidence, PlanAction};
    use crate::policy::PolicyKind;
    use crate::series::{MINUTE, Point, Window};

    #[test]
    fn tick_labels_have_the_decimals_of_their_step() {
        assert_eq!(tick_label(0.0, 5000.0), "0");
        assert_eq!(tick_label(25_000.0, 5000.0), "25000");
        assert_eq!(tick_label(2.5, 0.5), "2.5");
        assert_eq!(tick_label(0.04, 0.02), "0.04");
    }

    /// A limit of 100 and a proposal of 200 under a spike of 25,000: the lines are a pixel
    /// apart, their labels a line of text.
    #[test]
    fn close_limits_get_labels_a_line_apart() {
        let window = Window::ending(28 * DAY, 28 * DAY);
        let points: Vec<Point> = (1..=window.minutes() as i64)
            .map(|i| Point {
                at: window.start + i * MINUTE,
                rps: if i == 5000 { 25_000.0 } else { 3000.0 },
            })
            .collect();
        let h = History::analyze(window, &points, 0.999, &mut Vec::new());
        let p = Proposal {
            service: "a".into(),
            bucket: "b".into(),
            caller: None,
            procedure: None,
            region: None,
            current_limit_rps: Some(100.0),
            proposed_limit_rps: Some(200.0),
            policy: PolicyKind::Historical,
            action: PlanAction::Update,
            evidence: Evidence::default(),
        };
        let svg = svg(&p, &h).unwrap();
        let label_y = |label: &str| -> f64 {
            // plotters writes a text's content on a line of its own.
            let head = &svg[..svg.find(&format!(">\n{label} ")).unwrap()];
            let y = head.rsplit_once(" y=\"").unwrap().1;
            y[..y.find('"').unwrap()].parse().unwrap()
        };
        // The higher limit's label above (a smaller y), a line apart.
        assert!(
            label_y("current") - label_y("proposed") >= TEXT_LINE - 0.11,
            "{} vs {}",
            label_y("current"),
            label_y("proposed")
        );
        assert!(svg.contains(">\n0\n</text>"), "the axis starts at 0");
    }
}
