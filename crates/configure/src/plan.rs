//! A plan: the series of a source, one at a time, with the current limits and the settings,
//! become one proposal per bucket, each with the evidence it rests on. Nothing is changed.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::current::{CurrentLimits, pair_bucket_name};
use crate::history::History;
use crate::policy::{self, Input, PolicyKind, Suggestion};
pub use crate::policy::{Clamp, Evidence};
use crate::series::{HistorySource, Point, SeriesKey, SeriesTarget, SourceError, Window};
use crate::settings::Settings;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlanAction {
    /// A new bucket.
    Create,
    /// A bucket whose limit changes.
    Update,
    /// Nothing changes; `evidence.reason` says why when there was nothing to rest a limit on.
    Keep,
}

impl PlanAction {
    pub fn name(self) -> &'static str {
        match self {
            PlanAction::Create => "create",
            PlanAction::Update => "update",
            PlanAction::Keep => "keep",
        }
    }
}

/// One bucket's proposal (the plan's JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Proposal {
    pub service: String,
    pub bucket: String,
    /// The pair a new bucket would match (`--query` by caller and procedure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub procedure: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub current_limit_rps: Option<f64>,
    pub proposed_limit_rps: Option<f64>,
    pub policy: PolicyKind,
    pub action: PlanAction,
    pub evidence: Evidence,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The source and its hint of what to check.
    #[error("{0} returned no series over the lookback: {1}")]
    Empty(String, &'static str),
}

/// The plan and what was noticed on the way.
#[derive(Debug, Clone)]
pub struct Plan {
    pub window: Window,
    /// Series read from the source.
    pub series: usize,
    pub proposals: Vec<Proposal>,
    pub warnings: Vec<String>,
}

/// Plans every series of `source` over `window`: reads one series at a time (its points and
/// one working buffer are all the history held), calls `each` with every proposal that has a
/// history (to chart it while it is at hand), then adds the buckets in force or in the quota
/// file that no series was about.
pub fn plan(
    source: &mut dyn HistorySource,
    window: Window,
    settings: &Settings,
    current: &CurrentLimits,
    mut each: impl FnMut(&Proposal, &History),
) -> Result<Plan, PlanError> {
    let mut points: Vec<Point> = Vec::with_capacity(window.minutes());
    let mut scratch: Vec<f64> = Vec::with_capacity(window.minutes());
    let mut proposals = Vec::new();
    let mut warnings = Vec::new();
    // Bucket names per service, taken by buckets in force or by proposals so far.
    let mut taken: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for b in &current.buckets {
        taken
            .entry(b.service.clone())
            .or_default()
            .insert(b.bucket.clone());
    }
    let mut proposed: BTreeSet<(String, String, Option<String>)> = BTreeSet::new();
    let mut series = 0;
    while let Some(key) = source.next_series(window, &mut points)? {
        series += 1;
        if !points.is_sorted_by_key(|p| p.at) {
            points.sort_by_key(|p| p.at);
        }
        points.dedup_by_key(|p| p.at);
        let (bucket, in_force, pair) = match &key.target {
            SeriesTarget::Bucket(bucket) => {
                (bucket.clone(), current.get(&key.service, bucket), None)
            }
            SeriesTarget::Pair { caller, procedure } => {
                match current.find_pair(&key.service, caller, procedure) {
                    Some(b) => (b.bucket.clone(), Some(b), None),
                    None => {
                        let names = taken.entry(key.service.clone()).or_default();
                        let name = unique(names, pair_bucket_name(caller, procedure));
                        names.insert(name.clone());
                        (name, None, Some((caller.clone(), procedure.clone())))
                    }
                }
            }
        };
        if !proposed.insert((key.service.clone(), bucket.clone(), key.region.clone())) {
            warnings.push(format!(
                "{key}: a second series for {}/{bucket}; only the first is planned",
                key.service
            ));
            continue;
        }
        let params = settings.params(&key.service);
        let history = History::analyze(window, &points, params.quantile, &mut scratch);
        // A region's series is about the bucket's limit in that region (`--per-region`).
        let current_rps = in_force.map(|b| match &key.region {
            Some(region) => b.limit_in(region),
            None => b.limit_rps,
        });
        let mut proposal = propose(&key, &bucket, current_rps, Some(&history), settings);
        if let Some(kind) = in_force.and_then(|b| b.per_subject.as_ref()) {
            keep_per_subject(&mut proposal, kind);
        }
        if let Some((caller, procedure)) = pair {
            proposal.caller = Some(caller);
            proposal.procedure = Some(procedure);
        }
        each(&proposal, &history);
        proposals.push(proposal);
    }
    if series == 0 && settings.defaults.policy != PolicyKind::Fixed {
        return Err(PlanError::Empty(source.describe(), source.when_empty()));
    }
    // A bucket planned per region (`--per-region`) has its proposals.
    let by_region = |proposed: &BTreeSet<(String, String, Option<String>)>, s: &str, n: &str| {
        proposed
            .iter()
            .any(|(ps, pn, r)| r.is_some() && ps == s && pn == n)
    };
    for b in &current.buckets {
        if !by_region(&proposed, &b.service, &b.bucket)
            && proposed.insert((b.service.clone(), b.bucket.clone(), None))
        {
            let key = SeriesKey::bucket(&b.service, &b.bucket);
            let mut proposal = propose(&key, &b.bucket, Some(b.limit_rps), None, settings);
            if let Some(kind) = &b.per_subject {
                keep_per_subject(&mut proposal, kind);
            }
            proposals.push(proposal);
        }
    }
    if let Some(quotas) = &settings.quotas {
        for q in &quotas.quotas {
            if settings.params(&q.service).policy == PolicyKind::Fixed
                && !by_region(&proposed, &q.service, &q.bucket)
                && proposed.insert((q.service.clone(), q.bucket.clone(), None))
            {
                let key = SeriesKey::bucket(&q.service, &q.bucket);
                proposals.push(propose(&key, &q.bucket, None, None, settings));
            }
        }
    }
    Ok(Plan {
        window,
        series,
        proposals,
        warnings,
    })
}

fn unique(taken: &BTreeSet<String>, name: String) -> String {
    if !taken.contains(&name) {
        return name;
    }
    (2..)
        .map(|n| format!("{name}-{n}"))
        .find(|candidate| !taken.contains(candidate))
        .unwrap_or(name)
}

/// A limit per subject value is kept by the policies that read history; a quota of `fixed`
/// is the per-subject limit itself, and stands.
fn keep_per_subject(proposal: &mut Proposal, kind: &str) {
    if proposal.policy == PolicyKind::Fixed {
        return;
    }
    proposal.proposed_limit_rps = proposal.current_limit_rps;
    proposal.action = PlanAction::Keep;
    proposal.evidence.clamp = None;
    proposal.evidence.reason = Some(format!(
        "a limit per {kind}: the history is the bucket's total over every {kind}, so it says \
         nothing about one {kind}'s limit"
    ));
}

/// One bucket's proposal from its history (`None`: no series is about it).
fn propose(
    key: &SeriesKey,
    bucket: &str,
    current: Option<f64>,
    history: Option<&History>,
    settings: &Settings,
) -> Proposal {
    let params = settings.params(&key.service);
    let mut evidence = Evidence::default();
    if let Some(history) = history {
        policy::describe_history(history, &mut evidence);
    }
    let input = Input {
        service: &key.service,
        bucket,
        history,
        current,
        params,
        quotas: settings.quotas.as_ref(),
        capacity: settings.capacity.as_ref(),
        min_coverage: settings.min_coverage,
    };
    let suggestion = params.policy.policy().suggest(&input, &mut evidence);
    let proposed = policy::finish(&suggestion, current, params, &mut evidence);
    let action = match (&suggestion, current, proposed) {
        (Suggestion::Keep { .. }, _, _) | (_, _, None) => PlanAction::Keep,
        (_, None, Some(_)) => PlanAction::Create,
        (_, Some(cur), Some(new)) if (new - cur).abs() <= 1e-9 * cur => PlanAction::Keep,
        _ => PlanAction::Update,
    };
    Proposal {
        service: key.service.clone(),
        bucket: bucket.to_owned(),
        caller: None,
        procedure: None,
        region: key.region.clone(),
        current_limit_rps: current,
        proposed_limit_rps: proposed,
        policy: params.policy,
        action,
        evidence,
    }
}
