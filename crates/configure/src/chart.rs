//! One SVG per bucket: the history (each hour's highest minute), the forecast band of next
//! week, and the current and proposed limits. Hand-written SVG: a few hundred lines of text
//! that any browser shows, with no drawing library or font on the machine.

use std::fmt::Write as _;

use crate::history::History;
use crate::plan::Proposal;
use crate::report::rate;
use crate::series::{DAY, HOUR, WEEK};
use crate::time;

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;

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

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
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
pub fn svg(p: &Proposal, h: &History) -> String {
    let start = h.window.start;
    let end = h.window.end + WEEK;
    let forecast: Vec<(i64, f64, f64, f64)> = (0..7 * 24)
        .filter_map(|hour| {
            let value = h.forecast_hour(hour)?;
            let (low, high) = h.forecast.as_ref().ok()?.band(value);
            Some((
                h.window.end + hour as i64 * HOUR + HOUR / 2,
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
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |t: i64| LEFT + (t - start) as f64 / (end - start) as f64 * plot_w;
    let y = |v: f64| TOP + plot_h - v / ymax * plot_h;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let change = match (p.current_limit_rps, p.proposed_limit_rps) {
        (Some(c), Some(n)) => format!("{} → {}", rate(c), rate(n)),
        (None, Some(n)) => format!("new, {}", rate(n)),
        (Some(c), None) => rate(c),
        (None, None) => "no limit".to_owned(),
    };
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{}/{} — {}: {} {} requests/s</text>"#,
        escape(&p.service),
        escape(&p.bucket),
        p.policy.name(),
        p.action.name(),
        escape(&change)
    );
    // Grid and axes.
    let mut v = 0.0;
    while v <= ymax + step / 2.0 {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            y(v) + 4.0,
            tick_label(v, step),
            y = y(v)
        );
        v += step;
    }
    let mut day = start.div_euclid(DAY) * DAY + DAY;
    while day < end {
        let weekly = (day.div_euclid(DAY) - h.window.end.div_euclid(DAY)).rem_euclid(7) == 0;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{:.1}" stroke="{}"/>"##,
            TOP + plot_h,
            if weekly { "#cccccc" } else { "#f2f2f2" },
            x = x(day)
        );
        if weekly {
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                x(day),
                TOP + plot_h + 16.0,
                time::format_date(day)
            );
        }
        day += DAY;
    }
    let _ = writeln!(
        s,
        r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{:.1}" stroke="#555" stroke-dasharray="2,3"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
        TOP + plot_h,
        TOP - 4.0,
        time::format_minute(h.window.end),
        x = x(h.window.end)
    );
    // The forecast band and its centre.
    if !forecast.is_empty() {
        let mut d = String::new();
        for (i, (t, _, _, high)) in forecast.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                x(*t),
                y(*high)
            );
        }
        for (t, _, low, _) in forecast.iter().rev() {
            let _ = write!(d, "L{:.1},{:.1} ", x(*t), y(*low));
        }
        let _ = writeln!(
            s,
            r##"<path d="{d}Z" fill="#f5a623" fill-opacity="0.25" stroke="none"/>"##
        );
        let mut d = String::new();
        for (i, (t, mid, _, _)) in forecast.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1} ",
                if i == 0 { "M" } else { "L" },
                x(*t),
                y(*mid)
            );
        }
        let _ = writeln!(
            s,
            r##"<path d="{d}" fill="none" stroke="#e08900" stroke-width="1.2"/>"##
        );
    }
    // The history: each hour's highest minute, broken at gaps.
    let mut d = String::new();
    let mut pen_down = false;
    for (hour, value) in h.hourly_max.iter().enumerate() {
        if !value.is_finite() {
            pen_down = false;
            continue;
        }
        let t = start + hour as i64 * HOUR + HOUR / 2;
        let _ = write!(
            d,
            "{}{:.1},{:.1} ",
            if pen_down { "L" } else { "M" },
            x(t),
            y(*value)
        );
        pen_down = true;
    }
    let _ = writeln!(
        s,
        r##"<path d="{d}" fill="none" stroke="#1f77b4" stroke-width="1"/>"##
    );
    // The limits, labelled at the right; two labels closer than a line of text are pushed
    // apart (a limit of 100 and a proposal of 200 on an axis up to 25,000 are 1 px apart).
    let limits: Vec<(f64, &str, &str, &str)> = [
        (p.current_limit_rps, "current", "#555555", "6,4"),
        (p.proposed_limit_rps, "proposed", "#d62728", ""),
    ]
    .into_iter()
    .filter_map(|(value, label, colour, dash)| value.map(|v| (v, label, colour, dash)))
    .collect();
    let mut label_y: Vec<f64> = limits.iter().map(|l| y(l.0) + 4.0).collect();
    if let [a, b] = label_y[..]
        && (a - b).abs() < TEXT_LINE
    {
        let mid = (a + b) / 2.0;
        let (upper, lower) = (mid - TEXT_LINE / 2.0, mid + TEXT_LINE / 2.0);
        // The higher limit's label goes above (SVG's y grows downwards); equal ones: current.
        label_y = if a <= b {
            vec![upper, lower]
        } else {
            vec![lower, upper]
        };
    }
    for ((v, label, colour, dash), ly) in limits.iter().zip(&label_y) {
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="1.5" stroke-dasharray="{dash}"/><text x="{:.1}" y="{ly:.1}" fill="{colour}">{label} {}</text>"#,
            LEFT + plot_w,
            LEFT + plot_w + 6.0,
            rate(*v),
            y = y(*v)
        );
    }
    // Legend.
    let legend = [
        ("#1f77b4", "history: each hour's highest minute"),
        ("#e08900", "forecast, with its band (±2σ)"),
    ];
    for (i, (colour, text)) in legend.iter().enumerate() {
        let ly = HEIGHT - 10.0;
        let lx = LEFT + i as f64 * 280.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/><text x="{:.1}" y="{ly}">{text}</text>"#,
            lx + 18.0,
            ly - 4.0,
            ly - 4.0,
            lx + 22.0
        );
    }
    s.push_str("</svg>\n");
    s
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
        let svg = svg(&p, &h);
        let label_y = |label: &str| -> f64 {
            let head = &svg[..svg.find(&format!(">{label} ")).unwrap()];
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
        assert!(svg.contains(">0</text>"), "the axis starts at 0");
    }
}
