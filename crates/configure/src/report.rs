//! A plan for people (a table) and for programs (the plan's JSON).

use serde_json::json;

use crate::plan::{Plan, Proposal};
use crate::time;

/// `1240`, `12.5`, `0.0167`: three significant digits, no exponent.
pub fn rate(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else if value >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.4}")
    }
}

/// The evidence in one line: what the proposal rests on, and what moved it.
pub fn evidence_line(p: &Proposal) -> String {
    let e = &p.evidence;
    let mut parts = Vec::new();
    if let (Some(peak), Some(at)) = (e.peak_rps, &e.peak_at) {
        parts.push(format!("peak {} at {at}", rate(peak)));
    }
    if let (Some(q), Some(v)) = (e.quantile, e.quantile_rps) {
        parts.push(format!("q{q} {}", rate(v)));
    }
    if let (Some(f), Some(day)) = (e.forecast_peak_rps, &e.forecast_peak_day) {
        let trend = e
            .forecast_trend_per_week
            .map_or(String::new(), |t| format!(", trend {:+.1}%/wk", t * 100.0));
        parts.push(format!("forecast {} on {day}{trend}", rate(f)));
    }
    if let (Some(m), Some(day)) = (e.capacity_multiplier, &e.capacity_day) {
        let base = e
            .base_rps
            .map_or(String::new(), |b| format!(": {}", rate(b)));
        parts.push(format!("planned capacity x{m} on {day}{base}"));
    }
    if let Some(h) = e.headroom {
        let auto = if e.headroom_basis.is_some() {
            " (auto)"
        } else {
            ""
        };
        parts.push(format!("+{:.0}% headroom{auto}", h * 100.0));
    }
    if let Some(q) = e.quota_rps {
        parts.push(format!("quota {}", rate(q)));
    }
    if let Some(clamp) = e.clamp {
        let from = e
            .unclamped_rps
            .map_or(String::new(), |v| format!(" from {}", rate(v)));
        parts.push(format!("clamp {}{from}", clamp.name()));
    }
    if let Some(reason) = &e.reason {
        parts.push(reason.clone());
    }
    parts.join("; ")
}

/// The table of `configure plan`: one line per proposal.
pub fn table(plan: &Plan) -> String {
    let headers = [
        "SERVICE", "BUCKET", "CURRENT", "PROPOSED", "ACTION", "POLICY", "EVIDENCE",
    ];
    let rows: Vec<[String; 7]> = plan
        .proposals
        .iter()
        .map(|p| {
            let bucket = match &p.region {
                Some(region) => format!("{} ({region})", p.bucket),
                None => p.bucket.clone(),
            };
            [
                p.service.clone(),
                bucket,
                p.current_limit_rps.map_or("-".to_owned(), rate),
                p.proposed_limit_rps.map_or("-".to_owned(), rate),
                p.action.name().to_owned(),
                p.policy.name().to_owned(),
                evidence_line(p),
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row.iter()).take(6) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = format!(
        "lookback {} .. {} (rates in requests/s)\n",
        time::format_minute(plan.window.start),
        time::format_minute(plan.window.end)
    );
    let line = |cells: [&str; 7], out: &mut String| {
        for (i, cell) in cells.iter().enumerate().take(6) {
            let pad = widths[i] - cell.chars().count();
            // Numbers right-aligned, names left.
            if i == 2 || i == 3 {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            }
            out.push_str("  ");
        }
        out.push_str(cells[6]);
        out.push('\n');
    };
    line(headers, &mut out);
    for row in &rows {
        line(std::array::from_fn(|i| row[i].as_str()), &mut out);
    }
    let count = |name: &str| {
        plan.proposals
            .iter()
            .filter(|p| p.action.name() == name)
            .count()
    };
    out.push_str(&format!(
        "{} series; {} to create, {} to update, {} to keep\n",
        plan.series,
        count("create"),
        count("update"),
        count("keep")
    ));
    out
}

/// The plan's `{"proposals": [...]}`, with the lookback beside them.
pub fn json(plan: &Plan) -> serde_json::Value {
    json!({
        "lookback": {
            "from": time::format_minute(plan.window.start),
            "until": time::format_minute(plan.window.end),
        },
        "proposals": plan.proposals,
    })
}
