//! Shadow-first rollout: what `spillway configure apply` does with a plan,
//! decided here without I/O.
//!
//! A new bucket is created in `shadow`: it drops nothing and counts what it would have dropped.
//! Its validation window starts when its rule last changed (`updated_at`), so the state is the
//! rule in the rules store and survives any restart. Once the window (`--validate-for`) is over,
//! the bucket is promoted to `enforce` when the share of its offered requests it would have
//! dropped is at most `--max-virtual-drop`, and held with the reason otherwise. A bucket of the
//! configurator's still in shadow whose proposal moves gets the new limit in place (still in
//! shadow) and a new window. The configurator's buckets are those whose rules its own user
//! created; an operator's shadow bucket is never promoted by it.
//!
//! A changed limit of a bucket in force is set as the rule's `candidate` (`{limit, since}`): the
//! proxies try it in shadow beside the limit in force and count `candidate_dropped`, and its
//! window starts at `since`. It is validated the same way and, once it passes, promoted in one
//! rules change (the candidate becomes the limit); a candidate whose proposal moves is retuned
//! with a new `since`, and one whose bucket's proposal is to keep the limit in force is
//! withdrawn. Every candidate is the configurator's to validate, whoever set it.
//!
//! Worked example: `--validate-for 24h --max-virtual-drop 0.001`, a shadow bucket created at
//! 10:00 that saw 1,000,000 requests by 10:00 the next day and would have dropped 800 of them
//! (0.08%): promoted. Had it dropped 2,000 (0.2%): held, "would have dropped 0.20% of 1000000
//! requests (at most 0.10%)".

use std::num::NonZeroU64;
use std::time::Duration;

use spillway_core::limit::Limit;

use crate::plan::{PlanAction, Proposal};
pub use crate::series::Trial;

/// The start of a window that is not counted: the change is still on its way to the proxies
/// (the store's notification, the controller's next interval), and the slot of history the
/// change fell in holds counts of the limit before it. Half the window when that is shorter.
pub const SETTLE_MS: i64 = 3000;

/// A limit on trial in shadow, as the rules service has it: one of the configurator's buckets
/// still in shadow, or a bucket's `candidate`.
#[derive(Debug, Clone, PartialEq)]
pub struct ShadowRule {
    pub id: String,
    pub version: i64,
    pub service: String,
    pub bucket: String,
    /// The limit on trial: the shadow bucket's, or the candidate's.
    pub limit_rps: f64,
    /// When the trial began, Unix milliseconds: the start of its window (a shadow bucket's
    /// rule's last change, a candidate's `since`).
    pub since_ms: i64,
    pub trial: Trial,
    /// A candidate's limits of single regions (`region_limits`, as rates), by region.
    pub regions: Vec<(String, f64)>,
}

/// What a validation window saw of a shadow bucket: offered requests and those it would have
/// dropped. `None` when the source cannot say.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Seen {
    pub offered: f64,
    pub would_drop: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RolloutSettings {
    pub validate_for_ms: i64,
    pub max_virtual_drop: f64,
    /// Promote what is due (`apply --promote`, and `run`); otherwise say it is due.
    pub promote: bool,
}

/// One step of a rollout, in the order the plan gave the buckets.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutStep {
    /// A new bucket, created in shadow at `limit_rps`; `pair` is the (caller, procedure) it
    /// matches, when it comes from a pair's series (else it takes the whole service).
    Create {
        service: String,
        bucket: String,
        limit_rps: f64,
        pair: Option<(String, String)>,
    },
    /// A bucket in force gets its proposal as a `candidate`, tried in shadow from now.
    Candidate {
        service: String,
        bucket: String,
        limit_rps: f64,
    },
    /// A region-scoped bucket in force gets its regions' proposals (`--per-region`) as a
    /// candidate's `region_limits`, beside the rule's own limit, tried in shadow from now.
    RegionCandidate {
        service: String,
        bucket: String,
        regions: Vec<(String, f64)>,
    },
    /// A limit on trial gets its new proposal (and a candidate its regions'), and a new window.
    Retune {
        rule: ShadowRule,
        limit_rps: f64,
        regions: Vec<(String, f64)>,
    },
    /// A candidate whose bucket's proposal is the limit in force again is taken off its rule.
    Withdraw { rule: ShadowRule },
    /// A shadow bucket still in its window.
    Validating { rule: ShadowRule, left_ms: i64 },
    /// A shadow bucket whose window is over and that stayed under the bound.
    Promote { rule: ShadowRule, share: f64 },
    /// Promotable, but `--promote` was not given.
    Due { rule: ShadowRule, share: f64 },
    /// A shadow bucket whose window is over but that may not be promoted, and why.
    Hold { rule: ShadowRule, reason: String },
    /// A proposal that `apply` does not carry out, and why.
    Skip {
        service: String,
        bucket: String,
        reason: String,
    },
}

impl RolloutStep {
    /// The word of the table and of `spillway_configurator_proposals_total{action}`.
    pub fn action(&self) -> &'static str {
        match self {
            RolloutStep::Create { .. } => "create",
            RolloutStep::Candidate { .. } | RolloutStep::RegionCandidate { .. } => "candidate",
            RolloutStep::Retune { .. } => "retune",
            RolloutStep::Withdraw { .. } => "withdraw",
            RolloutStep::Validating { .. } => "validating",
            RolloutStep::Promote { .. } => "promote",
            RolloutStep::Due { .. } => "due",
            RolloutStep::Hold { .. } => "hold",
            RolloutStep::Skip { .. } => "skip",
        }
    }
}

/// The steps for `proposals` given the configurator's shadow buckets, the time, up to when the
/// source has its history (`written_ms`; `None`: complete) and what each bucket's window saw
/// (`seen(rule, from_ms, until_ms)`, from [`SETTLE_MS`] into it to its end).
pub fn steps(
    proposals: &[Proposal],
    shadows: &[ShadowRule],
    settings: RolloutSettings,
    now_ms: i64,
    written_ms: Option<i64>,
    mut seen: impl FnMut(&ShadowRule, i64, i64) -> Option<Seen>,
) -> Vec<RolloutStep> {
    let mut out = Vec::new();
    let shadow_of = |service: &str, bucket: &str| {
        shadows
            .iter()
            .find(|r| r.service == service && r.bucket == bucket)
    };
    // A region's proposals (`--per-region`) are one bucket's, taken together below.
    let (regional, proposals): (Vec<&Proposal>, Vec<&Proposal>) =
        proposals.iter().partition(|p| p.region.is_some());
    let mut handled: Vec<&ShadowRule> = Vec::new();
    let mut groups: Vec<((&str, &str), Vec<&Proposal>)> = Vec::new();
    for p in regional {
        match groups
            .iter_mut()
            .find(|((s, b), _)| *s == p.service && *b == p.bucket)
        {
            Some((_, group)) => group.push(p),
            None => groups.push(((&p.service, &p.bucket), vec![p])),
        }
    }
    for ((service, bucket), group) in groups {
        let changed = group.iter().any(|p| p.action == PlanAction::Update);
        let regions: Vec<(String, f64)> = group
            .iter()
            .filter_map(|p| {
                let rps = p.proposed_limit_rps.or(p.current_limit_rps)?;
                Some((p.region.clone()?, rps))
            })
            .collect();
        match shadow_of(service, bucket) {
            None if changed => out.push(RolloutStep::RegionCandidate {
                service: service.to_owned(),
                bucket: bucket.to_owned(),
                regions,
            }),
            None => {}
            Some(rule) if rule.trial == Trial::Candidate && !changed => {
                handled.push(rule);
                out.push(RolloutStep::Withdraw { rule: rule.clone() });
            }
            Some(rule)
                if rule.trial == Trial::Candidate && !same_regions(&rule.regions, &regions) =>
            {
                handled.push(rule);
                out.push(RolloutStep::Retune {
                    rule: rule.clone(),
                    limit_rps: rule.limit_rps,
                    regions,
                });
            }
            Some(_) => {}
        }
    }
    let shadows: Vec<&ShadowRule> = shadows
        .iter()
        .filter(|r| !handled.iter().any(|h| std::ptr::eq(*h, *r)))
        .collect();
    for &p in &proposals {
        if shadow_of(&p.service, &p.bucket).is_some() {
            continue;
        }
        match (p.action, p.proposed_limit_rps) {
            (PlanAction::Create, Some(limit_rps)) => out.push(RolloutStep::Create {
                service: p.service.clone(),
                bucket: p.bucket.clone(),
                limit_rps,
                pair: p.caller.clone().zip(p.procedure.clone()),
            }),
            (PlanAction::Update, Some(limit_rps)) => out.push(RolloutStep::Candidate {
                service: p.service.clone(),
                bucket: p.bucket.clone(),
                limit_rps,
            }),
            _ => {}
        }
    }
    for rule in shadows {
        let proposal = proposals
            .iter()
            .find(|p| p.service == rule.service && p.bucket == rule.bucket);
        if rule.trial == Trial::Candidate && proposal.is_some_and(|p| p.action == PlanAction::Keep)
        {
            out.push(RolloutStep::Withdraw { rule: rule.clone() });
            continue;
        }
        if let Some(limit_rps) = proposal
            .filter(|p| p.action == PlanAction::Update)
            .and_then(|p| p.proposed_limit_rps)
            .filter(|&l| l > 0.0 && (l - rule.limit_rps).abs() > 1e-9 * rule.limit_rps.max(1.0))
        {
            out.push(RolloutStep::Retune {
                rule: (*rule).clone(),
                limit_rps,
                regions: rule.regions.clone(),
            });
            continue;
        }
        let end_ms = rule.since_ms + settings.validate_for_ms;
        // Over when the clock and the history have both passed its end.
        let left_ms = (end_ms - now_ms).max(end_ms - written_ms.unwrap_or(now_ms));
        if left_ms > 0 {
            out.push(RolloutStep::Validating {
                rule: rule.clone(),
                left_ms,
            });
            continue;
        }
        let hold = |reason: String| RolloutStep::Hold {
            rule: rule.clone(),
            reason,
        };
        let settle = SETTLE_MS.min(settings.validate_for_ms / 2);
        let step = match seen(rule, rule.since_ms + settle, end_ms) {
            None => {
                hold("the history source cannot say what this bucket would have dropped".into())
            }
            Some(s) if s.offered.is_nan() || s.offered <= 0.0 => hold(format!(
                "no traffic in its validation window of {}: nothing to validate against",
                crate::time::format_duration_ms(settings.validate_for_ms)
            )),
            Some(s) => {
                let share = (s.would_drop / s.offered).clamp(0.0, 1.0);
                if share > settings.max_virtual_drop {
                    hold(format!(
                        "would have dropped {:.2}% of {:.0} requests (at most {:.2}%)",
                        share * 100.0,
                        s.offered,
                        settings.max_virtual_drop * 100.0
                    ))
                } else if settings.promote {
                    RolloutStep::Promote {
                        rule: rule.clone(),
                        share,
                    }
                } else {
                    RolloutStep::Due {
                        rule: rule.clone(),
                        share,
                    }
                }
            }
        };
        out.push(step);
    }
    out
}

/// Whether two sets of region limits say the same (rates within a billionth).
fn same_regions(a: &[(String, f64)], b: &[(String, f64)]) -> bool {
    a.len() == b.len()
        && b.iter().all(|(region, rps)| {
            a.iter()
                .any(|(r, l)| r == region && (l - rps).abs() <= 1e-9 * rps.max(1.0))
        })
}

/// A rate as a limit of the configuration file: whole requests per second, minute, hour or day
/// (the shortest period that makes the count whole), or else per hour rounded up, never zero.
/// 38.8/s is `2328/min`, 0.0124/s `44.64/h`, rounded up to `45/h`.
pub fn limit_text(rps: f64) -> String {
    limit_of(rps).to_string()
}

/// [`limit_text`]'s limit: per second, minute, hour or day, whichever counts `rps` in whole
/// requests first; else per hour, rounded up.
pub fn limit_of(rps: f64) -> Limit {
    let whole = |count: f64| NonZeroU64::new(count as u64).unwrap_or(NonZeroU64::MIN);
    for seconds in [1, 60, 3600, 86_400] {
        let count = rps * seconds as f64;
        if count >= 1.0 && (count - count.round()).abs() <= 1e-6 * count {
            return Limit {
                count: whole(count.round()),
                period: Duration::from_secs(seconds),
            };
        }
    }
    Limit {
        count: whole((rps * 3600.0).ceil()),
        period: Duration::from_secs(3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Evidence;
    use crate::policy::PolicyKind;

    fn proposal(bucket: &str, action: PlanAction, limit: Option<f64>) -> Proposal {
        Proposal {
            service: "api".into(),
            bucket: bucket.into(),
            caller: None,
            procedure: None,
            region: None,
            current_limit_rps: None,
            proposed_limit_rps: limit,
            policy: PolicyKind::Fixed,
            action,
            evidence: Evidence::default(),
        }
    }

    fn shadow(bucket: &str, limit: f64, since_ms: i64) -> ShadowRule {
        ShadowRule {
            id: format!("id-{bucket}"),
            version: 3,
            service: "api".into(),
            bucket: bucket.into(),
            limit_rps: limit,
            since_ms,
            trial: Trial::Shadow,
            regions: Vec::new(),
        }
    }

    fn candidate(bucket: &str, limit: f64, since_ms: i64) -> ShadowRule {
        ShadowRule {
            trial: Trial::Candidate,
            ..shadow(bucket, limit, since_ms)
        }
    }

    const SETTINGS: RolloutSettings = RolloutSettings {
        validate_for_ms: 86_400_000,
        max_virtual_drop: 0.001,
        promote: true,
    };

    #[test]
    fn the_worked_example_promotes_at_0_08_percent_and_holds_at_0_2_percent() {
        let rules = [shadow("a", 10.0, 0), shadow("b", 10.0, 0)];
        let steps = steps(&[], &rules, SETTINGS, 86_400_000, None, |rule, _, _| {
            Some(Seen {
                offered: 1_000_000.0,
                would_drop: if rule.bucket == "a" { 800.0 } else { 2000.0 },
            })
        });
        assert!(
            matches!(&steps[0], RolloutStep::Promote { share, .. } if (*share - 0.0008).abs() < 1e-12)
        );
        match &steps[1] {
            RolloutStep::Hold { reason, .. } => assert_eq!(
                reason,
                "would have dropped 0.20% of 1000000 requests (at most 0.10%)"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn new_buckets_are_created_in_shadow_and_changes_in_force_become_candidates() {
        let proposals = [
            proposal("new", PlanAction::Create, Some(5.0)),
            proposal("nothing", PlanAction::Create, None),
            proposal("in-force", PlanAction::Update, Some(7.0)),
            proposal("kept", PlanAction::Keep, Some(7.0)),
        ];
        let steps = steps(&proposals, &[], SETTINGS, 0, None, |_, _, _| None);
        assert_eq!(steps.len(), 2);
        assert!(
            matches!(&steps[0], RolloutStep::Create { bucket, limit_rps, .. } if bucket == "new" && *limit_rps == 5.0)
        );
        assert!(
            matches!(&steps[1], RolloutStep::Candidate { bucket, limit_rps, .. } if bucket == "in-force" && *limit_rps == 7.0)
        );
    }

    #[test]
    fn a_candidate_validates_on_its_own_drops_and_is_promoted_retuned_or_withdrawn() {
        let rules = [candidate("a", 8.0, 1_000)];
        let mut asked = Vec::new();
        let promoted = steps(&[], &rules, SETTINGS, 86_401_000, None, |rule, _, _| {
            asked.push(rule.trial);
            Some(Seen {
                offered: 1_000_000.0,
                would_drop: 500.0,
            })
        });
        assert_eq!(asked, vec![Trial::Candidate]);
        assert!(
            matches!(&promoted[0], RolloutStep::Promote { rule, .. } if rule.trial == Trial::Candidate)
        );
        let held = steps(&[], &rules, SETTINGS, 86_401_000, None, |_, _, _| {
            Some(Seen {
                offered: 1_000_000.0,
                would_drop: 5000.0,
            })
        });
        assert!(matches!(&held[0], RolloutStep::Hold { .. }));
        // Its proposal moved: the candidate gets it and a new window; nothing else is set.
        let moved = [proposal("a", PlanAction::Update, Some(6.0))];
        let retuned = steps(&moved, &rules, SETTINGS, 5_000, None, |_, _, _| None);
        assert_eq!(retuned.len(), 1, "{retuned:?}");
        assert!(matches!(&retuned[0], RolloutStep::Retune { limit_rps, .. } if *limit_rps == 6.0));
        // The limit in force is right again: the candidate goes.
        let kept = [proposal("a", PlanAction::Keep, Some(10.0))];
        let withdrawn = steps(&kept, &rules, SETTINGS, 5_000, None, |_, _, _| None);
        assert!(matches!(&withdrawn[..], [RolloutStep::Withdraw { rule }] if rule.bucket == "a"));
        // A shadow bucket whose proposal is kept goes on validating.
        let shadows = [shadow("a", 8.0, 1_000)];
        let validating = steps(&kept, &shadows, SETTINGS, 5_000, None, |_, _, _| None);
        assert!(matches!(&validating[..], [RolloutStep::Validating { .. }]));
    }

    fn regional(
        bucket: &str,
        region: &str,
        action: PlanAction,
        current: f64,
        limit: f64,
    ) -> Proposal {
        Proposal {
            region: Some(region.into()),
            current_limit_rps: Some(current),
            ..proposal(bucket, action, Some(limit))
        }
    }

    #[test]
    fn a_regions_proposals_are_one_candidate_retuned_withdrawn_or_validated_together() {
        let proposals = [
            regional("r", "eu", PlanAction::Update, 100.0, 60.0),
            regional("r", "us", PlanAction::Keep, 100.0, 100.0),
        ];
        let steps_now = steps(&proposals, &[], SETTINGS, 0, None, |_, _, _| None);
        match &steps_now[..] {
            [
                RolloutStep::RegionCandidate {
                    bucket, regions, ..
                },
            ] => {
                assert_eq!(bucket, "r");
                assert_eq!(
                    regions,
                    &vec![("eu".to_owned(), 60.0), ("us".to_owned(), 100.0)]
                );
            }
            other => panic!("{other:?}"),
        }
        let mut rule = candidate("r", 100.0, 1_000);
        rule.regions = vec![("eu".into(), 60.0), ("us".into(), 100.0)];
        let rules = [rule];
        // The same proposals: validated, then promoted as one.
        let later = steps(&proposals, &rules, SETTINGS, 86_401_000, None, |_, _, _| {
            Some(Seen {
                offered: 1000.0,
                would_drop: 0.0,
            })
        });
        assert!(
            matches!(&later[..], [RolloutStep::Promote { .. }]),
            "{later:?}"
        );
        // A region's proposal moved: retuned, the rule's own limit kept.
        let moved = [
            regional("r", "eu", PlanAction::Update, 100.0, 70.0),
            regional("r", "us", PlanAction::Keep, 100.0, 100.0),
        ];
        let retuned = steps(&moved, &rules, SETTINGS, 5_000, None, |_, _, _| None);
        match &retuned[..] {
            [
                RolloutStep::Retune {
                    limit_rps, regions, ..
                },
            ] => {
                assert_eq!(*limit_rps, 100.0);
                assert_eq!(regions[0], ("eu".to_owned(), 70.0));
            }
            other => panic!("{other:?}"),
        }
        // Every region keeps its limit in force: withdrawn.
        let kept = [
            regional("r", "eu", PlanAction::Keep, 100.0, 100.0),
            regional("r", "us", PlanAction::Keep, 100.0, 100.0),
        ];
        let withdrawn = steps(&kept, &rules, SETTINGS, 5_000, None, |_, _, _| None);
        assert!(
            matches!(&withdrawn[..], [RolloutStep::Withdraw { .. }]),
            "{withdrawn:?}"
        );
        assert!(steps(&kept, &[], SETTINGS, 0, None, |_, _, _| None).is_empty());
    }

    #[test]
    fn a_shadow_bucket_validates_then_is_due_without_promote_and_retunes_when_its_proposal_moves() {
        let rules = [shadow("a", 10.0, 1_000)];
        let seen = |_: &ShadowRule, _, _| {
            Some(Seen {
                offered: 100.0,
                would_drop: 0.0,
            })
        };
        let early = steps(&[], &rules, SETTINGS, 2_000, None, seen);
        assert!(
            matches!(&early[0], RolloutStep::Validating { left_ms, .. } if *left_ms == 86_399_000)
        );
        let due = RolloutSettings {
            promote: false,
            ..SETTINGS
        };
        let later = steps(&[], &rules, due, 86_401_000, None, seen);
        assert!(matches!(&later[0], RolloutStep::Due { .. }));
        let moved = [proposal("a", PlanAction::Update, Some(20.0))];
        let retuned = steps(&moved, &rules, SETTINGS, 86_401_000, None, seen);
        assert!(matches!(&retuned[0], RolloutStep::Retune { limit_rps, .. } if *limit_rps == 20.0));
        assert_eq!(retuned.len(), 1, "no create or skip besides");
    }

    #[test]
    fn no_traffic_or_a_source_that_cannot_say_holds() {
        let rules = [shadow("a", 10.0, 0)];
        let quiet = steps(&[], &rules, SETTINGS, 86_400_000, None, |_, _, _| {
            Some(Seen::default())
        });
        assert!(
            matches!(&quiet[0], RolloutStep::Hold { reason, .. } if reason.contains("no traffic"))
        );
        let blind = steps(&[], &rules, SETTINGS, 86_400_000, None, |_, _, _| None);
        assert!(
            matches!(&blind[0], RolloutStep::Hold { reason, .. } if reason.contains("cannot say"))
        );
    }

    #[test]
    fn a_window_is_counted_from_when_the_change_has_reached_the_proxies() {
        let rules = [shadow("a", 10.0, 50_000)];
        let mut asked = Vec::new();
        steps(&[], &rules, SETTINGS, 86_460_000, None, |_, from, until| {
            asked.push((from, until));
            None
        });
        assert_eq!(asked, vec![(53_000, 86_450_000)], "its end, not the clock");
        let short = RolloutSettings {
            validate_for_ms: 4000,
            ..SETTINGS
        };
        asked.clear();
        steps(&[], &rules, short, 60_000, None, |_, from, _| {
            asked.push((from, 0));
            None
        });
        assert_eq!(asked, vec![(52_000, 0)], "half a short window");
        // The clock is past its end but the history is not: still validating, until it is.
        let lagging = steps(
            &[],
            &rules,
            SETTINGS,
            86_460_000,
            Some(86_440_000),
            |_, _, _| panic!("not asked before the history is there"),
        );
        assert!(
            matches!(&lagging[0], RolloutStep::Validating { left_ms, .. } if *left_ms == 10_000)
        );
    }

    #[test]
    fn limits_are_written_as_whole_counts_and_never_zero() {
        assert_eq!(limit_text(5.0), "5/s");
        assert_eq!(limit_text(38.8), "2328/min");
        assert_eq!(limit_text(1.25), "75/min");
        assert_eq!(limit_text(0.0124), "45/h");
        assert_eq!(limit_text(1.0 / 60.0), "1/min");
        assert_eq!(limit_text(1e-9), "1/h");
    }
}
