//! What Envoy is told for each bucket id: an assignment ([`QuotaAction`]: allow all, deny all, a
//! token bucket, or abandon) in Envoy's RLQS messages. Envoy reads TTLs and fill intervals as
//! whole seconds, so every token bucket is one in whole seconds.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse,
    rate_limit_quota_response::{
        BucketAction,
        bucket_action::{self, AbandonAction, QuotaAssignmentAction},
    },
};
use envoy_types::pb::envoy::r#type::v3::{
    RateLimitStrategy, TokenBucket,
    rate_limit_strategy::{BlanketRule, Strategy},
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use spillway_core::limit::Limit;

/// The longest fill interval of a token bucket for a rate under one a second.
const MAX_FILL_SECS: u32 = 60;

/// What Envoy is told for one bucket id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaAction {
    /// `blanket_rule: ALLOW_ALL`.
    Allow,
    /// `blanket_rule: DENY_ALL`.
    Deny,
    /// `token_bucket`: `per_fill` tokens every `fill_secs` seconds, holding at most `per_fill`.
    Tokens { per_fill: u32, fill_secs: u32 },
    /// `abandon_action`: the bucket is gone from the rules.
    Abandon,
}

impl QuotaAction {
    /// The token bucket that admits `rps` requests a second, in whole seconds.
    pub fn tokens(rps: f64) -> QuotaAction {
        if rps.is_nan() || rps <= 0.0 {
            return QuotaAction::Deny;
        }
        if rps >= 1.0 {
            let per_fill = rps.round().min(f64::from(u32::MAX)) as u32;
            return QuotaAction::Tokens {
                per_fill,
                fill_secs: 1,
            };
        }
        let fill_secs = (1.0 / rps).ceil().min(f64::from(MAX_FILL_SECS)) as u32;
        QuotaAction::Tokens {
            per_fill: 1,
            fill_secs,
        }
    }

    /// The token bucket of a limit: `count` tokens per `period` when the period is whole
    /// seconds (`1000/h` is 1000 tokens every 3600 s), else the limit's rate per second.
    pub(crate) fn of_limit(limit: Limit) -> QuotaAction {
        let period = limit.period;
        if period.subsec_nanos() == 0
            && let Ok(fill_secs) = u32::try_from(period.as_secs())
            && fill_secs > 0
            && let Ok(per_fill) = u32::try_from(limit.count.get())
        {
            return QuotaAction::Tokens {
                per_fill,
                fill_secs,
            };
        }
        QuotaAction::tokens(limit.per_second())
    }

    /// The tokens a second this action admits (`None`: everything).
    pub fn rate(self) -> Option<f64> {
        match self {
            QuotaAction::Allow | QuotaAction::Abandon => None,
            QuotaAction::Deny => Some(0.0),
            QuotaAction::Tokens {
                per_fill,
                fill_secs,
            } => Some(f64::from(per_fill) / f64::from(fill_secs)),
        }
    }
}

/// Assignments to send, by stream.
pub type Actions = BTreeMap<u64, Vec<BucketAction>>;

/// The `BucketId` of `entries`, as Envoy sent it (a map; kept as sorted entries here).
pub(crate) fn bucket_id(entries: &[(String, String)]) -> BucketId {
    BucketId {
        bucket: entries.iter().cloned().collect(),
    }
}

/// `action` for bucket id `id`, in Envoy's message.
pub fn bucket_action(id: BucketId, action: QuotaAction, ttl: Duration) -> BucketAction {
    let strategy = |strategy| QuotaAssignmentAction {
        assignment_time_to_live: Some(PbDuration {
            seconds: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        rate_limit_strategy: Some(RateLimitStrategy {
            strategy: Some(strategy),
        }),
    };
    let action = match action {
        QuotaAction::Allow => bucket_action::BucketAction::QuotaAssignmentAction(strategy(
            Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        )),
        QuotaAction::Deny => bucket_action::BucketAction::QuotaAssignmentAction(strategy(
            Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        )),
        QuotaAction::Tokens {
            per_fill,
            fill_secs,
        } => bucket_action::BucketAction::QuotaAssignmentAction(strategy(Strategy::TokenBucket(
            TokenBucket {
                max_tokens: per_fill,
                tokens_per_fill: Some(UInt32Value { value: per_fill }),
                fill_interval: Some(PbDuration {
                    seconds: i64::from(fill_secs),
                    nanos: 0,
                }),
            },
        ))),
        QuotaAction::Abandon => bucket_action::BucketAction::AbandonAction(AbandonAction {}),
    };
    BucketAction {
        bucket_id: Some(id),
        bucket_action: Some(action),
    }
}

/// A response of `actions`, or `None` when there is nothing to say (Envoy requires at least one
/// action per response).
pub fn response(actions: Vec<BucketAction>) -> Option<RateLimitQuotaResponse> {
    (!actions.is_empty()).then_some(RateLimitQuotaResponse {
        bucket_action: actions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_buckets_are_in_whole_seconds() {
        assert_eq!(
            QuotaAction::tokens(50.4),
            QuotaAction::Tokens {
                per_fill: 50,
                fill_secs: 1
            }
        );
        assert_eq!(
            QuotaAction::tokens(0.25),
            QuotaAction::Tokens {
                per_fill: 1,
                fill_secs: 4
            }
        );
        assert_eq!(
            QuotaAction::tokens(0.001),
            QuotaAction::Tokens {
                per_fill: 1,
                fill_secs: 60
            }
        );
        assert_eq!(QuotaAction::tokens(0.0), QuotaAction::Deny);
        assert_eq!(QuotaAction::tokens(f64::NAN), QuotaAction::Deny);
        let per_hour = Limit::parse("1000/h").unwrap();
        assert_eq!(
            QuotaAction::of_limit(per_hour),
            QuotaAction::Tokens {
                per_fill: 1000,
                fill_secs: 3600
            }
        );
        let per_100ms = Limit::parse("5 per 100ms").unwrap();
        assert_eq!(
            QuotaAction::of_limit(per_100ms),
            QuotaAction::Tokens {
                per_fill: 50,
                fill_secs: 1
            }
        );
    }
}
