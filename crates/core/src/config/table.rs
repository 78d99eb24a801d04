//! The compiled buckets as a plain-text table, as `spillway check` prints them.

use super::validate::{Bucket, Config};
use crate::descriptor::{Answer, DescriptorSpec};
use crate::pattern::MatchSpec;

const HEADERS: [&str; 11] = [
    "SERVICE",
    "BUCKET",
    "MATCH",
    "LIMIT",
    "BURST",
    "SCOPE",
    "MODE",
    "ALGORITHM",
    "STORE",
    "COST",
    "ON FAILURE",
];

/// `caller=api-gateway procedure=/search user=*`; `*` when the bucket matches every request.
pub fn describe_match(spec: &MatchSpec) -> String {
    let mut parts = Vec::new();
    if let Some(caller) = &spec.caller {
        parts.push(format!("caller={caller}"));
    }
    if let Some(procedure) = &spec.procedure {
        parts.push(format!("procedure={procedure}"));
    }
    if let Some(subject) = &spec.subject {
        parts.push(format!("{}={}", subject.kind, subject.value.as_str()));
    }
    if parts.is_empty() {
        "*".to_owned()
    } else {
        parts.join(" ")
    }
}

/// `descriptor edge: remote_address=10.1.* answer=allow replaces=per-ip`: the domain and entries,
/// then how the bucket answers and what it replaces when they are not the defaults.
fn describe_descriptor(descriptor: &DescriptorSpec) -> String {
    let mut text = format!("descriptor {descriptor}");
    if descriptor.answer != Answer::Limit {
        text.push_str(" answer=");
        text.push_str(descriptor.answer.name());
    }
    if !descriptor.replaces.is_empty() {
        text.push_str(" replaces=");
        text.push_str(&descriptor.replaces.join(","));
    }
    text
}

fn row(service: &str, bucket: &Bucket) -> [String; 11] {
    let descriptor = bucket.descriptor.as_ref();
    // An `unlimited` or `allow` descriptor bucket answers without its limit.
    let limitless =
        descriptor.is_some_and(|d| matches!(d.answer, Answer::Unlimited | Answer::Allow));
    [
        service.to_owned(),
        match super::candidate_of(&bucket.name) {
            Some(parent) => format!("{parent} (candidate)"),
            None => bucket.name.clone(),
        },
        match descriptor {
            Some(d) => describe_descriptor(d),
            None => describe_match(&bucket.match_spec),
        },
        if limitless {
            "-".to_owned()
        } else {
            bucket.limit.to_string()
        },
        bucket.burst.map_or("-".to_owned(), |b| b.to_string()),
        bucket.scope.to_string(),
        bucket.mode.to_string(),
        bucket.algorithm.to_string(),
        match bucket.batch {
            Some(n) => format!("{} (batch {n})", bucket.store),
            None => bucket.store.to_string(),
        },
        // Envoy's request carries a descriptor's cost; a token budget's, its call at the end.
        match (descriptor, &bucket.cost) {
            (Some(_), super::Cost::Response(_)) => "hits_addend at the response's end".to_owned(),
            (Some(_), _) => "hits_addend".to_owned(),
            (None, cost) => cost.to_string(),
        },
        bucket.on_store_failure.to_string(),
    ]
}

/// One line per bucket in file order under a header, columns padded to their widest cell, and
/// a last line counting services and buckets.
pub fn render_table(config: &Config) -> String {
    let rows: Vec<[String; 11]> = config
        .buckets()
        .map(|(service, bucket)| row(&service.name, bucket))
        .collect();
    let candidates = config.buckets().filter(|(_, b)| b.is_candidate()).count();
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            let pad = widths[i].saturating_sub(cell.chars().count());
            text.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut HEADERS.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    let services = config.services.len();
    let buckets = rows.len() - candidates;
    out.push_str(&format!(
        "{} bucket{} in {} service{}{}\n",
        buckets,
        if buckets == 1 { "" } else { "s" },
        services,
        if services == 1 { "" } else { "s" },
        match candidates {
            0 => String::new(),
            1 => ", one with a candidate limit on trial".to_owned(),
            n => format!(", {n} with a candidate limit on trial"),
        }
    ));
    out
}
