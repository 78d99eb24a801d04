//! The checks of the file's smaller sections: `proxy:`, `concurrency:`, `identity:`,
//! `control.plausibility`, and the bound on how many buckets a file may have.

use super::*;

/// Upgrade protocols that carry HTTP requests: inside their tunnel every request would pass the
/// limiter undecided, so `proxy.upgrades` may not name them.
pub(super) const REQUEST_CARRYING_UPGRADES: [&str; 3] = ["h2c", "h2", "http"];

/// A `proxy:` section: `upgrades` are tokens, none of them a protocol that carries requests.
pub(crate) fn proxy(
    file: crate::config::ProxyFile,
    positions: &Positions,
) -> Result<ProxySettings, Located> {
    let check = Checker { positions };
    let Some(upgrades) = file.upgrades else {
        return Ok(ProxySettings::default());
    };
    let mut allowed = Vec::with_capacity(upgrades.len());
    for (i, token) in upgrades.into_iter().enumerate() {
        let path = format!("proxy.upgrades[{i}]");
        let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if token.is_empty() || !token.bytes().all(is_tchar) {
            return Err(check.at_value(
                &path,
                format!("{token:?} is not a protocol name: write it as an `upgrade` field names it, like websocket"),
            ));
        }
        let lower = token.to_ascii_lowercase();
        if REQUEST_CARRYING_UPGRADES.contains(&lower.as_str()) {
            return Err(check.at_value(
                &path,
                format!("{token} cannot be an allowed upgrade: its connection carries HTTP requests, which would pass the limiter undecided; remove it (HTTP/2 clients speak to the proxy directly, and each of their requests is decided)"),
            ));
        }
        if !allowed.contains(&lower) {
            allowed.push(lower);
        }
    }
    Ok(ProxySettings { upgrades: allowed })
}

/// A `concurrency:` section: `fixed` takes `limit` and nothing else, the adaptive algorithms
/// `min_limit <= initial_limit <= max_limit` and no `limit`; no limit is 0.
pub(crate) fn concurrency(
    file: crate::config::ConcurrencyFile,
    positions: &Positions,
) -> Result<crate::concurrency::ConcurrencySettings, Located> {
    use crate::concurrency::{
        AlgorithmName, ConcurrencySettings, DEFAULT_INITIAL_LIMIT, DEFAULT_MAX_LIMIT,
        DEFAULT_MIN_LIMIT, LIMIT_CEILING,
    };
    let check = Checker { positions };
    let algorithm = AlgorithmName::from(file.algorithm);
    for (key, value) in [
        ("limit", file.limit),
        ("min_limit", file.min_limit),
        ("max_limit", file.max_limit),
        ("initial_limit", file.initial_limit),
    ] {
        let path = format!("concurrency.{key}");
        match value {
            Some(0) => {
                return Err(check.at_value(
                    &path,
                    format!("{key} 0 admits no request at all; the least is 1 in flight"),
                ));
            }
            Some(n) if n > LIMIT_CEILING => {
                return Err(check.at_value(
                    &path,
                    format!("{key} {n} is more than {LIMIT_CEILING} requests in flight; leave the section out for no limit"),
                ));
            }
            _ => {}
        }
    }
    if algorithm == AlgorithmName::Fixed {
        let Some(limit) = file.limit else {
            return Err(check.at_key(
                "concurrency",
                "algorithm fixed needs `limit`, the requests in flight to the upstream at most, like `limit: 100`; or pick gradient or vegas, which find it",
            ));
        };
        for (key, value) in [
            ("min_limit", file.min_limit),
            ("max_limit", file.max_limit),
            ("initial_limit", file.initial_limit),
        ] {
            if value.is_some() {
                return Err(check.at_key(
                    &format!("concurrency.{key}"),
                    format!("a fixed limit does not move, so it takes no {key}; write only `limit`, or pick gradient or vegas"),
                ));
            }
        }
        return Ok(ConcurrencySettings::fixed(limit));
    }
    if file.limit.is_some() {
        return Err(check.at_key(
            "concurrency.limit",
            format!("`limit` is for algorithm fixed; {algorithm} moves its limit between min_limit and max_limit, starting at initial_limit"),
        ));
    }
    let min = file.min_limit.unwrap_or(DEFAULT_MIN_LIMIT);
    let max = file.max_limit.unwrap_or(DEFAULT_MAX_LIMIT.max(min));
    if min > max {
        let at = if file.max_limit.is_some() {
            "concurrency.max_limit"
        } else {
            "concurrency.min_limit"
        };
        return Err(check.at_value(
            at,
            format!("min_limit ({min}) is above max_limit ({max}); the limit moves between them, so min_limit <= max_limit"),
        ));
    }
    let initial = match file.initial_limit {
        Some(n) if !(min..=max).contains(&n) => {
            return Err(check.at_value(
                "concurrency.initial_limit",
                format!("initial_limit {n} is outside [{min}, {max}] (min_limit, max_limit); start the limit between them"),
            ));
        }
        Some(n) => n,
        None => DEFAULT_INITIAL_LIMIT.clamp(min, max),
    };
    Ok(ConcurrencySettings {
        algorithm,
        min_limit: min,
        max_limit: max,
        initial_limit: initial,
    })
}

/// `control.plausibility`: a multiple under 2 would count a proxy at no more than the median one
/// of its zone, so half of an honest zone could never be counted whole; no proxy serves 0
/// requests a second.
/// Refuses more than [`MAX_BUCKETS`](crate::config::MAX_BUCKETS) buckets, at the first one over.
pub(super) fn check_bucket_count(check: &Checker<'_>, services: &Services) -> Result<(), Located> {
    let mut seen = 0;
    for (name, service) in &services.0 {
        let count = service.buckets.len();
        if seen + count > crate::config::MAX_BUCKETS {
            let index = crate::config::MAX_BUCKETS - seen;
            let path = item(&child(&child("services", name), "buckets"), index);
            return Err(check.at_value(
                &path,
                format!(
                    "bucket {} of the configuration is over the limit of {} buckets; one bucket \
                     with a subject of \"*\" (`user: \"*\"`) gives every distinct value a quota \
                     of its own",
                    crate::config::MAX_BUCKETS + 1,
                    crate::config::MAX_BUCKETS
                ),
            ));
        }
        seen += count;
    }
    Ok(())
}

pub(super) fn check_plausibility(check: &Checker<'_>, control: &Control) -> Result<(), Located> {
    let p = &control.plausibility;
    if p.peer_multiple < MIN_PEER_MULTIPLE {
        return Err(check.at_value(
            "control.plausibility.peer_multiple",
            format!(
                "peer_multiple {} is too small: any proxy busier than the median one of its zone would be counted short once it offers more than the limit; use {MIN_PEER_MULTIPLE} or more (the default is 4)",
                p.peer_multiple
            ),
        ));
    }
    if p.max_host_rps == 0 {
        return Err(check.at_value(
            "control.plausibility.max_host_rps",
            "max_host_rps 0 would count every proxy's load as nothing; give the most requests per second one proxy can serve (the default is 1000000)",
        ));
    }
    Ok(())
}

pub(super) fn check_identity(
    check: &Checker<'_>,
    identity: &IdentitySources,
) -> Result<(), Located> {
    let defaults = IdentitySources::default();
    let keys: [(&str, &Sources, &Sources); 7] = [
        ("caller", &identity.caller, &defaults.caller),
        ("procedure", &identity.procedure, &defaults.procedure),
        ("user", &identity.user, &defaults.user),
        ("org", &identity.org, &defaults.org),
        ("api_key", &identity.api_key, &defaults.api_key),
        ("ip", &identity.ip, &defaults.ip),
        ("criticality", &identity.criticality, &defaults.criticality),
    ];
    for (key, sources, default) in keys {
        for source in &sources.0 {
            let misplaced = match source {
                Source::Path => key != "procedure",
                Source::Peer => key != "ip",
                Source::Header(_) => false,
            };
            if misplaced {
                let fits = if *source == Source::Path {
                    "procedure"
                } else {
                    "ip"
                };
                return Err(check.at_value(
                    &child("identity", key),
                    format!(
                        "`{source}` only fits `{fits}`; read {key} from a header instead, like {default} (the default)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `identity.list_headers`: header names, in lower case, once each; not `x-forwarded-for`,
/// whose list is counted from the right past the trusted hops.
pub(super) fn list_headers(check: &Checker<'_>, names: &[String]) -> Result<Vec<String>, Located> {
    let mut lists = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let path = format!("identity.list_headers[{i}]");
        let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(check.at_value(
                &path,
                format!("{name:?} is not a header name; write the name alone, like x-groups"),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if lower == "x-forwarded-for" {
            return Err(check.at_value(
                &path,
                "x-forwarded-for is always a list, counted from the right past `xff_trusted_hops`; leave it out",
            ));
        }
        if !lists.contains(&lower) {
            lists.push(lower);
        }
    }
    Ok(lists)
}
