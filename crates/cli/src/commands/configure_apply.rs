//! `spillway configure apply`: a plan rolled out shadow-first through the rules API as a `service`
//! user. Wiring only: what to do is `spillway_configure::rollout`'s decision.

use crate::duration::duration;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use serde_json::{Value, json};
use spillway_configure::CurrentLimits;
use spillway_configure::rollout::{
    self, RolloutSettings, RolloutStep, Seen, ShadowRule, Trial, limit_of, limit_text,
};
use spillway_configure::time::{format_duration_ms, parse_millis};
use spillway_core::config::{Algorithm, BucketFile, CandidateFile, Cost, MatchFile, Mode, Scope};
use spillway_core::limit::Limit;
use spillway_core::rule::{Rule, RuleBody};
use spillway_core::time::format_millis;
use spillway_rules::client::{RulesClient, RulesResponse};

use super::configure::{Output, PlanArgs, Planned, client, failure, planned, usage};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub plan: PlanArgs,
    /// How long a new bucket runs in shadow before it may be promoted to enforce.
    #[arg(long, default_value = "24h", value_parser = duration)]
    pub validate_for: Duration,
    /// The share of its offered requests a shadow bucket may have dropped over its window and
    /// still be promoted (0.001 is 0.1%).
    #[arg(long, value_name = "R", default_value_t = 0.001)]
    pub max_virtual_drop: f64,
    /// Promote the shadow buckets whose validation is over and passed (once); without it they
    /// are reported as due.
    #[arg(long)]
    pub promote: bool,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The rules of `GET /v1/rules`, and of them the limits on trial: the shadow buckets this user
/// created and every rule's candidate.
fn shadows_of(rules: &[Rule], me: &str) -> Result<Vec<(ShadowRule, Rule)>, String> {
    let mut out = Vec::new();
    for rule in rules.iter().filter(|rule| !rule.is_override()) {
        let bucket = &rule.bucket;
        let (trial, limit, since_ms, regions) = match &bucket.candidate {
            Some(candidate) => (
                Trial::Candidate,
                &candidate.limit,
                parse_millis(&candidate.since).map_err(|e| {
                    format!(
                        "rule {}/{}: candidate.since: {e}",
                        rule.service, bucket.name
                    )
                })?,
                candidate
                    .region_limits
                    .iter()
                    .flatten()
                    .map(|(region, limit)| (region.clone(), limit.per_second()))
                    .collect(),
            ),
            None if rule.created_by == me && bucket.mode == Mode::Shadow => {
                (Trial::Shadow, &bucket.limit, rule.updated_at, Vec::new())
            }
            None => continue,
        };
        out.push((
            ShadowRule {
                id: rule.id.clone(),
                version: rule.version,
                service: rule.service.clone(),
                bucket: bucket.name.clone(),
                limit_rps: limit.per_second(),
                since_ms,
                trial,
                regions,
            },
            rule.clone(),
        ));
    }
    Ok(out)
}

/// A new bucket of `limit_rps` in shadow, of one (caller, procedure) pair or of all the
/// service's requests; the rest as a configuration file's bucket leaves it by default.
fn new_bucket(name: &str, limit_rps: f64, pair: Option<&(String, String)>) -> BucketFile {
    BucketFile {
        name: name.to_owned(),
        match_: MatchFile {
            caller: pair.map(|(caller, _)| caller.clone()),
            procedure: pair.map(|(_, procedure)| procedure.clone()),
            ..MatchFile::default()
        },
        limit: limit_of(limit_rps),
        burst: None,
        burst_window: None,
        scope: Scope::default(),
        mode: Mode::Shadow,
        algorithm: Algorithm::default(),
        store: None,
        cost: Cost::default(),
        on_store_failure: None,
        batch: None,
        region_limits: None,
        candidate: None,
    }
}

/// One line of the report.
struct Done {
    action: &'static str,
    service: String,
    bucket: String,
    limit_rps: Option<f64>,
    detail: String,
}

pub fn apply(args: &ApplyArgs) -> ExitCode {
    match apply_once(args, args.promote) {
        Ok(run) if run.failed > 0 => failure(format!(
            "{} of {} steps could not be taken",
            run.failed,
            run.actions.len()
        )),
        Ok(_) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// What one run did: each step's action, and how many steps the rules service refused.
pub(super) struct RunDone {
    pub actions: Vec<&'static str>,
    pub failed: usize,
    /// How long until the first shadow bucket's validation window is over, if one is open.
    pub next_due: Option<Duration>,
}

/// Plans and rolls out once, printing the steps; `Err` when it could not run at all.
pub(super) fn apply_once(args: &ApplyArgs, promote: bool) -> Result<RunDone, ExitCode> {
    let Some(server) = args.plan.server.as_deref() else {
        return Err(usage(
            "apply changes the rules through the rules API: give --server URL and a service \
             user's --token (not -c FILE)",
        ));
    };
    if !(0.0..=1.0).contains(&args.max_virtual_drop) {
        return Err(usage(format!(
            "--max-virtual-drop {}: write a share from 0 to 1, like 0.001 for 0.1%",
            args.max_virtual_drop
        )));
    }
    if args.validate_for.is_zero() {
        return Err(usage("--validate-for: give a duration like 24h or 30s"));
    }
    let client = client(&args.plan)?;
    let me = match client.get("/v1/whoami").and_then(RulesResponse::ok) {
        Ok(answer) => answer.body,
        Err(err) => return Err(failure(format!("{server}: who the token is: {err}"))),
    };
    let name = me["name"].as_str().unwrap_or_default().to_owned();
    if me["role"] != "service" {
        return Err(usage(format!(
            "the token is {name}'s, a{} {} user: apply changes rules as a service user, with \
             its own budget in the audit log (spillway rules admin create NAME --role service)",
            if me["role"] == "admin" { "n" } else { "" },
            me["role"].as_str().unwrap_or("unknown")
        )));
    }
    let rules = match client.rules(None) {
        Ok(rules) => rules,
        Err(err) => return Err(failure(format!("the current limits: {err}"))),
    };
    let shadows = shadows_of(&rules, &name).map_err(|err| failure(format!("{server}: {err}")))?;
    let Planned {
        plan,
        mut source,
        began,
        ..
    } = planned(&args.plan, || Ok(CurrentLimits::from_rules(&rules)))?;
    for warning in &plan.warnings {
        eprintln!("warning: {warning}");
    }
    let settings = RolloutSettings {
        validate_for_ms: i64::try_from(args.validate_for.as_millis()).unwrap_or(i64::MAX),
        max_virtual_drop: args.max_virtual_drop,
        promote,
    };
    let rules_only: Vec<ShadowRule> = shadows.iter().map(|(r, _)| r.clone()).collect();
    let now = now_ms();
    let written = match source.written_until() {
        Ok(written) => written.map(|w| w.min(now)),
        Err(err) => return Err(failure(format!("{}: {err}", source.describe()))),
    };
    let mut source_error = None;
    let steps = rollout::steps(
        &plan.proposals,
        &rules_only,
        settings,
        now,
        written,
        |rule, from_ms, until_ms| match source.seen(
            &rule.service,
            &rule.bucket,
            rule.trial,
            from_ms,
            until_ms,
        ) {
            Ok(seen) => seen.map(|(offered, would_drop)| Seen {
                offered,
                would_drop,
            }),
            Err(err) => {
                source_error.get_or_insert(err.to_string());
                None
            }
        },
    );
    if let Some(err) = source_error {
        return Err(failure(format!("{}: {err}", source.describe())));
    }
    let window = format_duration_ms(settings.validate_for_ms);
    let mut failed = 0;
    let mut done = Vec::new();
    for step in &steps {
        let result = carry_out(&client, step, &rules, &shadows, &window, now);
        let (detail, ok) = match result {
            Ok(detail) => (detail, true),
            Err(err) => (format!("not applied: {err}"), false),
        };
        if !ok {
            failed += 1;
            eprintln!("spillway configure apply: {detail}");
        }
        let (service, bucket, limit_rps) = match step {
            RolloutStep::Create {
                service,
                bucket,
                limit_rps,
                ..
            }
            | RolloutStep::Candidate {
                service,
                bucket,
                limit_rps,
            } => (service.clone(), bucket.clone(), Some(*limit_rps)),
            RolloutStep::Skip {
                service, bucket, ..
            } => (service.clone(), bucket.clone(), None),
            RolloutStep::RegionCandidate {
                service, bucket, ..
            } => (service.clone(), bucket.clone(), None),
            RolloutStep::Retune {
                rule, limit_rps, ..
            } => (rule.service.clone(), rule.bucket.clone(), Some(*limit_rps)),
            RolloutStep::Validating { rule, .. }
            | RolloutStep::Withdraw { rule }
            | RolloutStep::Promote { rule, .. }
            | RolloutStep::Due { rule, .. }
            | RolloutStep::Hold { rule, .. } => (
                rule.service.clone(),
                rule.bucket.clone(),
                Some(rule.limit_rps),
            ),
        };
        done.push(Done {
            action: step.action(),
            service,
            bucket,
            limit_rps,
            detail,
        });
    }
    let text = match args.plan.output {
        Output::Table => table(&done),
        Output::Json => {
            let steps: Vec<Value> = done
                .iter()
                .map(|d| {
                    json!({"action": d.action, "service": d.service, "bucket": d.bucket,
                           "limit_rps": d.limit_rps, "detail": d.detail})
                })
                .collect();
            serde_json::to_string_pretty(&json!({ "steps": steps })).unwrap_or_default() + "\n"
        }
    };
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }
    eprintln!(
        "planned {} series from {} and took {} steps as {name} in {:.1}s",
        plan.series,
        source.describe(),
        done.len(),
        began.elapsed().as_secs_f64()
    );
    let next_due = steps
        .iter()
        .filter_map(|step| match step {
            RolloutStep::Validating { left_ms, .. } => u64::try_from(*left_ms).ok(),
            _ => None,
        })
        .min()
        .map(Duration::from_millis);
    Ok(RunDone {
        actions: done.iter().map(|d| d.action).collect(),
        failed,
        next_due,
    })
}

/// Does what `step` says through the rules API; what happened, in words.
fn carry_out(
    client: &RulesClient,
    step: &RolloutStep,
    rules: &[Rule],
    shadows: &[(ShadowRule, Rule)],
    window: &str,
    now_ms: i64,
) -> Result<String, String> {
    let rule_of = |rule: &ShadowRule| {
        shadows
            .iter()
            .find(|(r, _)| r.id == rule.id)
            .map(|(_, found)| found)
            .ok_or_else(|| {
                format!(
                    "{}/{}: no such rule in the rules service",
                    rule.service, rule.bucket
                )
            })
    };
    // `body` in place of the rule `original` (as GET /v1/rules gave it), if it is unchanged.
    let put = |original: &Rule, body: RuleBody| {
        client
            .replace_rule(&original.id, original.version, &body)
            .map(drop)
            .map_err(|e| format!("{}/{}: {e}", original.service, original.bucket.name))
    };
    let candidate = |limit: Limit, regions: &[(String, f64)]| CandidateFile {
        limit,
        since: format_millis(now_ms),
        region_limits: (!regions.is_empty()).then(|| region_limits(regions)),
    };
    match step {
        RolloutStep::Create {
            service,
            bucket,
            limit_rps,
            pair,
        } => {
            let body = RuleBody {
                service: service.clone(),
                bucket: new_bucket(bucket, *limit_rps, pair.as_ref()),
                ttl: None,
                reason: Some(format!(
                    "spillway configure apply: a new bucket, in shadow for {window} before it enforces"
                )),
            };
            client
                .create_rule(&body)
                .map_err(|e| format!("{service}/{bucket}: {e}"))?;
            Ok(format!(
                "created in shadow at {}; validated for {window}",
                limit_text(*limit_rps)
            ))
        }
        RolloutStep::RegionCandidate {
            service,
            bucket,
            regions,
        } => {
            let found = in_force(rules, service, bucket)?;
            let mut body = found.to_body(Some(format!(
                "spillway configure apply --per-region: {} tried as a candidate for {window} before it replaces the regions' limits",
                describe_regions(regions)
            )));
            body.bucket.candidate = Some(candidate(found.bucket.limit, regions));
            put(found, body)?;
            Ok(format!(
                "a candidate of its regions' limits ({}): tried in shadow for {window}, the limits in force enforced meanwhile",
                describe_regions(regions)
            ))
        }
        RolloutStep::Candidate {
            service,
            bucket,
            limit_rps,
        } => {
            let found = in_force(rules, service, bucket)?;
            let current = found.bucket.limit;
            let mut body = found.to_body(Some(format!(
                "spillway configure apply: {} tried as a candidate beside {current} for {window} before it replaces it",
                limit_text(*limit_rps)
            )));
            body.bucket.candidate = Some(candidate(limit_of(*limit_rps), &[]));
            put(found, body)?;
            Ok(format!(
                "a candidate beside {current}: tried in shadow for {window}, {current} enforced meanwhile"
            ))
        }
        RolloutStep::Retune {
            rule,
            limit_rps,
            regions,
        } if rule.trial == Trial::Candidate => {
            let original = rule_of(rule)?;
            let mut body = original.to_body(Some(format!(
                "spillway configure apply: the proposal moved from {}; the candidate is tried for {window} again",
                limit_text(rule.limit_rps)
            )));
            // A candidate of the regions' limits keeps its base limit; the others are the
            // proposal itself.
            let limit = match (regions.is_empty(), &body.bucket.candidate) {
                (false, Some(trying)) => trying.limit,
                _ => limit_of(*limit_rps),
            };
            body.bucket.candidate = Some(candidate(limit, regions));
            put(original, body)?;
            Ok(format!(
                "the candidate is now {} (was {}); tried for {window} again",
                limit_text(*limit_rps),
                limit_text(rule.limit_rps)
            ))
        }
        RolloutStep::Withdraw { rule } => {
            let original = rule_of(rule)?;
            let mut body = original.to_body(Some(format!(
                "spillway configure apply: the candidate {} is withdrawn, the proposal is the limit in force",
                limit_text(rule.limit_rps)
            )));
            body.bucket.candidate = None;
            put(original, body)?;
            Ok(format!(
                "candidate {} withdrawn: the limit in force is what is proposed",
                limit_text(rule.limit_rps)
            ))
        }
        RolloutStep::Promote { rule, share } if rule.trial == Trial::Candidate => {
            let original = rule_of(rule)?;
            let before = original.bucket.limit;
            let mut body = original.to_body(Some(format!(
                "spillway configure apply: the candidate was tried for {window} and would have dropped {:.3}%; it replaces {before} (promoted)",
                share * 100.0
            )));
            if let Some(promoted) = body.bucket.candidate.take() {
                body.bucket.limit = promoted.limit;
                if promoted.region_limits.is_some() {
                    body.bucket.region_limits = promoted.region_limits;
                }
            }
            put(original, body)?;
            let promoted = if rule.regions.is_empty() {
                format!("{} replaces {before}", limit_text(rule.limit_rps))
            } else {
                format!(
                    "the regions' limits are {}",
                    describe_regions(&rule.regions)
                )
            };
            Ok(format!(
                "promoted: {promoted}; it would have dropped {:.3}% over {window}",
                share * 100.0
            ))
        }
        RolloutStep::Retune {
            rule, limit_rps, ..
        } => {
            let original = rule_of(rule)?;
            let mut body = original.to_body(Some(format!(
                "spillway configure apply: the proposal moved from {}; still in shadow, validated for {window} again",
                limit_text(rule.limit_rps)
            )));
            body.bucket.limit = limit_of(*limit_rps);
            put(original, body)?;
            Ok(format!(
                "still in shadow, its limit now {} (was {}); validated for {window} again",
                limit_text(*limit_rps),
                limit_text(rule.limit_rps)
            ))
        }
        RolloutStep::Promote { rule, share } => {
            let original = rule_of(rule)?;
            let mut body = original.to_body(Some(format!(
                "spillway configure apply: validated for {window}, would have dropped {:.3}% (promoted)",
                share * 100.0
            )));
            body.bucket.mode = Mode::Enforce;
            put(original, body)?;
            Ok(format!(
                "promoted to enforce: would have dropped {:.3}% over {window}",
                share * 100.0
            ))
        }
        RolloutStep::Due { share, .. } => Ok(format!(
            "validated (would have dropped {:.3}% over {window}): promote with --promote",
            share * 100.0
        )),
        RolloutStep::Validating { left_ms, rule } => Ok(format!(
            "{}, {} of its validation left",
            match rule.trial {
                Trial::Shadow => "in shadow",
                Trial::Candidate => "a candidate",
            },
            format_duration_ms(((*left_ms + 999) / 1000) * 1000)
        )),
        RolloutStep::Hold { reason, rule } => Ok(format!(
            "held {}: {reason}",
            match rule.trial {
                Trial::Shadow => "in shadow",
                Trial::Candidate => "as a candidate",
            }
        )),
        RolloutStep::Skip { reason, .. } => Ok(reason.clone()),
    }
}

/// The rule in force (not an override) of `service/bucket` in `GET /v1/rules`.
fn in_force<'a>(rules: &'a [Rule], service: &str, bucket: &str) -> Result<&'a Rule, String> {
    rules
        .iter()
        .find(|r| r.service == service && r.bucket.name == bucket && !r.is_override())
        .ok_or_else(|| format!("{service}/{bucket}: no such rule in the rules service"))
}

/// `{"eu": "60/s", ...}`: a candidate's `region_limits`.
fn region_limits(regions: &[(String, f64)]) -> BTreeMap<String, Limit> {
    regions
        .iter()
        .map(|(region, rps)| (region.clone(), limit_of(*rps)))
        .collect()
}

/// `eu 60/s, us 100/s`.
fn describe_regions(regions: &[(String, f64)]) -> String {
    regions
        .iter()
        .map(|(r, rps)| format!("{r} {}", limit_text(*rps)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn table(done: &[Done]) -> String {
    let rows: Vec<[String; 5]> = done
        .iter()
        .map(|d| {
            [
                d.action.to_owned(),
                d.service.clone(),
                d.bucket.clone(),
                d.limit_rps.map_or("-".to_owned(), limit_text),
                d.detail.clone(),
            ]
        })
        .collect();
    let head = ["ACTION", "SERVICE", "BUCKET", "LIMIT", "DETAIL"].map(str::to_owned);
    let mut widths = head.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&head).chain(&rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    let held = done.iter().filter(|d| d.action == "hold").count();
    out.push_str(&format!("{} steps; {held} held\n", done.len()));
    out
}
