//! The checks of one bucket: its limits, store, algorithm and scope, its candidate, its
//! `region_limits` and its `batch`.

use super::matching::{check_descriptor, check_match};
use super::*;

/// A bucket, and its candidate's twin when it has a candidate.
pub(super) fn check_bucket(
    check: &Checker<'_>,
    path: &str,
    bucket: BucketFile,
    has_redis: bool,
) -> Result<(Bucket, Option<Bucket>), Located> {
    if !is_name(&bucket.name) {
        return Err(check.at_value(
            &child(path, "name"),
            format!(
                "bucket name \"{}\": use letters, digits, '.', '_' and '-', starting with a letter or digit (it becomes a metric label and a response header)",
                bucket.name
            ),
        ));
    }
    let match_spec = check_match(check, &child(path, "match"), &bucket.match_)?;
    let descriptor = bucket
        .match_
        .descriptor
        .as_ref()
        .map(|d| check_descriptor(check, &child(&child(path, "match"), "descriptor"), d))
        .transpose()?;
    let algorithm = bucket.algorithm;
    let written = |key: &str| check.positions.contains(&child(path, key));
    let algorithm_name = if written("algorithm") {
        format!("algorithm {algorithm}")
    } else {
        format!("algorithm {algorithm} (the default)")
    };
    if bucket.burst.is_some() && !algorithm.takes_burst() {
        return Err(check.at_key(
            &child(path, "burst"),
            format!(
                "{algorithm_name} has no burst; burst applies to token-bucket, leaky-bucket and gcra"
            ),
        ));
    }
    if let Some(window) = bucket.burst_window {
        if algorithm != Algorithm::AdaptiveTokenBucket {
            return Err(check.at_key(
                &child(path, "burst_window"),
                format!(
                    "{algorithm_name} has no burst_window; it applies to adaptive-token-bucket"
                ),
            ));
        }
        if window > MAX_BURST_WINDOW {
            return Err(check.at_value(
                &child(path, "burst_window"),
                format!(
                    "burst_window {} is too long; unused tokens are kept for at most 20s",
                    format_duration(window)
                ),
            ));
        }
    }
    let store = bucket.store.unwrap_or(algorithm.default_store());
    if !algorithm.stores().contains(&store) {
        let advice = match algorithm {
            Algorithm::DropRatio | Algorithm::AdaptiveTokenBucket => {
                "it needs store: control-plane (or leave store out); for an exact count in Redis or in the proxy, pick an algorithm like token-bucket or sliding-window-log"
            }
            _ => {
                "it counts exactly, in the proxy (store: local) or in Redis (store: redis); for a limit computed by the control plane, use algorithm drop-ratio"
            }
        };
        return Err(check.at_value(
            &child(path, "store"),
            format!("store {store} does not fit {algorithm_name}: {advice}"),
        ));
    }
    if store == StateStore::ControlPlane {
        check_one_limit(
            check,
            path,
            (&match_spec, descriptor.as_ref()),
            matches!(bucket.cost, Cost::Response(_)),
            &algorithm_name,
        )?;
    }
    if store == StateStore::Redis && !has_redis {
        return Err(check.at_value(
            &child(path, "store"),
            "store: redis needs a top-level `redis` section, like `redis: { url: redis://127.0.0.1:6379 }`",
        ));
    }
    if let Some(batch) = bucket.batch {
        check_batch(check, path, &bucket, batch, store, &algorithm_name)?;
    }
    // The rules the control plane sends down write every default out (`cost: 1`), so only a
    // cost other than the default is refused.
    let settled_by_envoy = matches!(&bucket.cost, Cost::Response(c) if c.response == HITS_ADDEND);
    if descriptor.is_some()
        && written("cost")
        && bucket.cost != Cost::default()
        && !settled_by_envoy
    {
        return Err(check.at_key(
            &child(path, "cost"),
            "a descriptor bucket's cost is the hits_addend of Envoy's request (1 when it sends none); leave `cost` out, or write `cost: { response: hits_addend }` for a token budget that Envoy charges when the response ends",
        ));
    }
    if settled_by_envoy && descriptor.is_none() {
        return Err(check.at_value(
            &child(&child(path, "cost"), "response"),
            "response hits_addend is Envoy's call at the end of a response, for descriptor buckets (`match: { descriptor: ... }`); an HTTP bucket reads the response itself: use header:NAME, trailer:NAME, json:PATH or sse:PATH",
        ));
    }
    if let Cost::Header(cost) = &bucket.cost
        && !is_header_name(&cost.header)
    {
        return Err(check.at_value(
            &child(&child(path, "cost"), "header"),
            format!(
                "\"{}\" is not a valid header name; use letters, digits and '-', like x-cost",
                cost.header
            ),
        ));
    }
    if let Cost::Response(cost) = &bucket.cost {
        check_response_cost(check, path, &bucket, cost, store, &algorithm_name)?;
        if store == StateStore::Redis && descriptor.as_ref().is_some_and(|d| d.is_per_value()) {
            return Err(check.at_key(
                &child(path, "cost"),
                "a cost the response reports in store: redis is kept for one shared bucket; an entry without an exact value makes one per value, so give every entry its value or use store: local",
            ));
        }
    }
    let region_limits = check_region_limits(
        check,
        &child(path, "region_limits"),
        (bucket.scope, store),
        bucket.region_limits.as_ref(),
    )?;
    let candidate = bucket
        .candidate
        .as_ref()
        .map(|c| {
            check_candidate(
                check,
                &child(path, "candidate"),
                &bucket,
                (descriptor.is_some(), store),
                c,
            )
        })
        .transpose()?;
    let cost = match bucket.cost {
        Cost::Header(mut cost) => {
            cost.header.make_ascii_lowercase();
            Cost::Header(cost)
        }
        Cost::Response(mut cost) => {
            // Names of headers and trailers match in lower case; a path keeps its case.
            if let Some((kind @ ("header" | "trailer"), name)) = cost.response.split_once(':') {
                cost.response = format!("{kind}:{}", name.to_ascii_lowercase());
            }
            Cost::Response(cost)
        }
        fixed => fixed,
    };
    let checked = Bucket {
        name: bucket.name,
        match_spec,
        descriptor,
        limit: bucket.limit,
        burst: algorithm
            .takes_burst()
            .then(|| bucket.burst.unwrap_or(bucket.limit.count)),
        burst_window: (algorithm == Algorithm::AdaptiveTokenBucket)
            .then(|| bucket.burst_window.unwrap_or(DEFAULT_BURST_WINDOW)),
        scope: bucket.scope,
        mode: bucket.mode,
        algorithm,
        store,
        cost,
        on_store_failure: bucket
            .on_store_failure
            .unwrap_or(default_failure_policy(store)),
        batch: bucket.batch,
        candidate: candidate.clone(),
        region_limits,
    };
    let twin = candidate
        .as_ref()
        .map(|c| checked.candidate_twin(c, bucket.burst));
    Ok((checked, twin))
}

/// A bucket of the control plane holds one limit (or one token budget) for its whole scope:
/// the controller computes one drop ratio or one share of the limit per bucket, and every proxy
/// keeps one limiter for it. So neither a subject of `"*"` nor a descriptor entry without an
/// exact value, which each ask for a limit per value, fits it.
fn check_one_limit(
    check: &Checker<'_>,
    path: &str,
    (spec, descriptor): (&MatchSpec, Option<&DescriptorSpec>),
    budget: bool,
    algorithm_name: &str,
) -> Result<(), Located> {
    let limit = if budget { "budget" } else { "limit" };
    let fix = if budget {
        "algorithm token-bucket or gcra"
    } else {
        "an algorithm that counts, like token-bucket or sliding-window-log,"
    };
    let at_match = child(path, "match");
    if let Some(subject) = &spec.subject
        && subject.value == SubjectValue::Each
    {
        let key = subject.kind.key();
        return Err(check.at_value(
            &child(&at_match, key),
            format!(
                "`{key}: \"*\"` asks for a {limit} per {key}, but {algorithm_name} is held by the control plane as one {limit} for the bucket's whole scope, which every {key} would share; for one per {key}, use {fix} in store: local (or store: redis, one count across proxies), or leave `{key}` out for one shared {limit}"
            ),
        ));
    }
    if let Some(descriptor) = descriptor
        && let Some(at) = descriptor
            .entries
            .iter()
            .position(|e| e.value.is_per_value())
    {
        let entry = &descriptor.entries[at];
        let entry_path = item(&child(&child(&at_match, "descriptor"), "entries"), at);
        let (where_, what) = match &entry.value {
            EntryValue::Any => (child(&entry_path, "key"), "without a value"),
            _ => (child(&entry_path, "value"), "with a prefix"),
        };
        return Err(check.at_value(
            &where_,
            format!(
                "the entry `{}` {what} asks for a {limit} per value, but {algorithm_name} is held by the control plane as one {limit} for the bucket's whole scope, which every value would share; for one per value, use {fix} in store: local (or store: redis, one count across proxies), or give the entry its exact value",
                entry.key
            ),
        ));
    }
    Ok(())
}

/// A candidate is tried beside an enforcing HTTP bucket: a shadow bucket's limit changes in
/// place, and a descriptor has one bucket.
pub(super) fn check_candidate(
    check: &Checker<'_>,
    path: &str,
    bucket: &BucketFile,
    (is_descriptor, store): (bool, StateStore),
    candidate: &crate::config::model::CandidateFile,
) -> Result<Candidate, Located> {
    if bucket.mode == Mode::Shadow {
        return Err(check.at_key(
            path,
            "a shadow bucket drops nothing, so its limit can change in place; a candidate is tried beside a bucket that enforces",
        ));
    }
    if is_descriptor {
        return Err(check.at_key(
            path,
            "a descriptor bucket cannot take a candidate: Envoy's descriptor has one bucket; change its limit instead",
        ));
    }
    let since_ms = crate::time::parse_millis(&candidate.since).map_err(|e| {
        check.at_value(
            &child(path, "since"),
            format!("since: {e}; write when the trial began, like 2026-12-03T07:00:00Z"),
        )
    })?;
    let region_limits = check_region_limits(
        check,
        &child(path, "region_limits"),
        (bucket.scope, store),
        candidate.region_limits.as_ref(),
    )?;
    Ok(Candidate {
        limit: candidate.limit,
        since_ms,
        region_limits,
    })
}

/// `region_limits` only on a `scope: region` bucket that each region's controller counts (a
/// global or zone limit is one for every region, and a proxy's own count has no region),
/// keyed by region names.
pub(super) fn check_region_limits(
    check: &Checker<'_>,
    path: &str,
    (scope, store): (Scope, StateStore),
    limits: Option<&std::collections::BTreeMap<String, Limit>>,
) -> Result<Vec<(String, Limit)>, Located> {
    let Some(limits) = limits else {
        return Ok(Vec::new());
    };
    if store != StateStore::ControlPlane {
        return Err(check.at_key(
            path,
            format!(
                "region_limits are enforced by each region's controller, for a bucket of store: control-plane (drop-ratio, adaptive-token-bucket); a store: {store} bucket counts one limit, so leave region_limits out"
            ),
        ));
    }
    if scope != Scope::Region {
        return Err(check.at_key(
            path,
            format!(
                "region_limits are limits of single regions, for a bucket of scope: region; a {scope} bucket has one limit, so write scope: region or leave region_limits out"
            ),
        ));
    }
    for region in limits.keys() {
        if !is_name(region) {
            return Err(check.at_key(
                &child(path, region),
                format!(
                    "region \"{region}\": name a region as the controllers' --region does, with letters, digits, '.', '_' and '-'"
                ),
            ));
        }
    }
    Ok(limits.iter().map(|(r, l)| (r.clone(), *l)).collect())
}

/// `batch` takes a Redis token bucket's tokens ahead and spends them later, which only fits a
/// store shared through Redis and an algorithm whose state is a count of tokens.
pub(super) fn check_batch(
    check: &Checker<'_>,
    path: &str,
    bucket: &BucketFile,
    batch: u64,
    store: StateStore,
    algorithm_name: &str,
) -> Result<(), Located> {
    let at = child(path, "batch");
    if store != StateStore::Redis {
        let written = if check.positions.contains(&child(path, "store")) {
            format!("store {store}")
        } else {
            format!("store {store} (the default)")
        };
        return Err(check.at_key(
            &at,
            format!(
                "batch applies to store: redis, where it cuts Redis calls; this bucket has {written}, which makes no Redis calls to batch"
            ),
        ));
    }
    if bucket.algorithm != Algorithm::TokenBucket {
        return Err(check.at_key(
            &at,
            format!(
                "{algorithm_name} cannot batch; batch takes tokens ahead and spends them later, which only algorithm token-bucket allows (a log or a window count is exact only in Redis)"
            ),
        ));
    }
    let capacity = bucket.burst.unwrap_or(bucket.limit.count).get();
    if batch > capacity {
        let held = if bucket.burst.is_some() {
            format!("its burst of {capacity}")
        } else {
            format!("{capacity} (its burst, which defaults to the limit's count)")
        };
        return Err(check.at_value(
            &at,
            format!(
                "batch {batch} is more than the bucket holds, {held}: one proxy would take the whole bucket at once; use a batch of at most {capacity}, or leave batch out"
            ),
        ));
    }
    Ok(())
}

/// A cost the response reports: a source that parses, weights only for a body's object and an
/// algorithm that can go into debt, or a drop-ratio bucket of the control plane, which holds one
/// budget for its scope from the tokens every host reports (one per value of a subject only in
/// the local and Redis stores). An estimate above what the bucket holds loads, with a warning
/// (`warnings::budgets`): it reserves the whole bucket.
fn check_response_cost(
    check: &Checker<'_>,
    path: &str,
    bucket: &BucketFile,
    cost: &CostResponse,
    store: StateStore,
    algorithm_name: &str,
) -> Result<(), Located> {
    let at = child(path, "cost");
    let source = ResponseSource::parse(&cost.response)
        .map_err(|message| check.at_value(&child(&at, "response"), message))?;
    if !matches!(
        bucket.algorithm,
        Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::DropRatio
    ) {
        return Err(check.at_key(
            &at,
            format!(
                "a cost the response reports needs a meter that can go into debt; {algorithm_name} cannot, use algorithm token-bucket or gcra (or drop-ratio, for a budget the control plane holds)"
            ),
        ));
    }
    if source == ResponseSource::HitsAddend {
        let extra = [
            ("request", cost.request.is_some()),
            ("weights", cost.weights.is_some()),
            ("default", cost.default.is_some()),
        ];
        if let Some((key, _)) = extra.iter().find(|(_, set)| *set) {
            return Err(check.at_key(
                &child(&at, key),
                format!(
                    "Envoy's call at the end of the response carries the whole cost in hits_addend, and its call at the request is admitted while the bucket is not in debt; leave `{key}` out"
                ),
            ));
        }
    }
    if let Some(weights) = &cost.weights {
        if !source.reads_body() {
            return Err(check.at_key(
                &child(&at, "weights"),
                format!(
                    "weights sum the fields of an object in the body; {} carries one number, so leave weights out or use json:PATH or sse:PATH",
                    cost.response
                ),
            ));
        }
        if weights.is_empty() || weights.values().all(|w| *w == 0) {
            return Err(check.at_value(
                &child(&at, "weights"),
                "weights weigh nothing; name the fields to count, like { input_tokens: 1, output_tokens: 4 }",
            ));
        }
    }
    if store == StateStore::Redis && bucket.batch.is_some() {
        return Err(check.at_key(
            &child(path, "batch"),
            "batch leases tokens before requests spend them; a cost the response reports is debited after, so leave batch out",
        ));
    }
    Ok(())
}
