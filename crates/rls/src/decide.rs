//! One `ShouldRateLimit` call: the request checked, each descriptor decided by its most specific
//! descriptor bucket at its cost, and the answer in Envoy's terms.
//!
//! What envoyproxy/ratelimit does, Spillway does: an unknown domain or a descriptor that matches
//! no bucket is OK with no `current_limit`; a bucket that another matched bucket `replaces` is
//! neither decided nor counted; `hits_addend` 0 means 1; `overall_code` is OVER_LIMIT when any
//! descriptor is, and a shadow bucket over its limit answers OK. What it refuses, it refuses as
//! [`BadRequest`] (gRPC `INVALID_ARGUMENT`), never with a panic.

use std::time::Duration;

use spillway_client::{Client, DescriptorStatus, DescriptorStep, Rules};
use spillway_core::decision::BucketId;
use spillway_core::descriptor::{Answer, Entries, WithoutTier};
use spillway_core::limit::Limit;

use crate::pb;

/// The most descriptors one request may carry by default: an Envoy route sends one per
/// `rate_limits` entry that applies, a handful in practice.
pub const MAX_DESCRIPTORS: usize = 64;

/// The most entries one descriptor may carry by default: one per action of its `rate_limits`
/// entry, a few in practice.
pub const MAX_ENTRIES: usize = 32;

/// How the service answers beyond what Envoy requires.
#[derive(Debug, Clone, Copy)]
pub struct RlsOptions {
    /// Adds `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` to
    /// `response_headers_to_add`, from the descriptor with the least remaining, as
    /// envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED` does.
    pub response_headers: bool,
    /// A request with more descriptors is refused (`INVALID_ARGUMENT`) before any is decided:
    /// each costs a match and a decision, so 100,000 in one call would cost 0.12 s of CPU.
    pub max_descriptors: usize,
    /// A descriptor with more entries is refused likewise.
    pub max_entries: usize,
}

impl Default for RlsOptions {
    fn default() -> Self {
        RlsOptions {
            response_headers: false,
            max_descriptors: MAX_DESCRIPTORS,
            max_entries: MAX_ENTRIES,
        }
    }
}

/// A request the service cannot decide: the client's fault, answered `INVALID_ARGUMENT` with
/// this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    #[error(
        "the domain is empty: give the domain the descriptor buckets name (the rate_limit filter's `domain`)"
    )]
    EmptyDomain,
    #[error("the request has no descriptors: send at least one")]
    NoDescriptors,
    #[error("descriptors[{0}] has no entries: a descriptor needs at least one (key, value) entry")]
    EmptyDescriptor(usize),
    #[error("descriptors[{descriptor}].entries[{entry}] has an empty key")]
    EmptyKey { descriptor: usize, entry: usize },
    #[error(
        "descriptors[{0}] sets is_negative_hits (a refund of hits), which Spillway does not support"
    )]
    NegativeHits(usize),
    #[error(
        "the request has {count} descriptors, more than the {max} one request may carry (no Envoy route sends that many)"
    )]
    TooManyDescriptors { count: usize, max: usize },
    #[error(
        "descriptors[{descriptor}] has {count} entries, more than the {max} one descriptor may carry (no Envoy rate_limits entry has that many actions)"
    )]
    TooManyEntries {
        descriptor: usize,
        count: usize,
        max: usize,
    },
}

/// A request descriptor's entries as the matcher reads them, borrowed from the message.
struct Wire<'a>(&'a [pb::Entry]);

impl Entries for Wire<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn key(&self, index: usize) -> &str {
        &self.0[index].key
    }
    fn value(&self, index: usize) -> &str {
        &self.0[index].value
    }
}

/// Checks what Envoy's own validation would (a domain, at least one descriptor, entries with
/// keys), the caps of `options` (before anything is matched), and what Spillway does not do
/// (refunds).
fn check(request: &pb::RateLimitRequest, options: &RlsOptions) -> Result<(), BadRequest> {
    if request.domain.is_empty() {
        return Err(BadRequest::EmptyDomain);
    }
    if request.descriptors.is_empty() {
        return Err(BadRequest::NoDescriptors);
    }
    if request.descriptors.len() > options.max_descriptors {
        return Err(BadRequest::TooManyDescriptors {
            count: request.descriptors.len(),
            max: options.max_descriptors,
        });
    }
    for (d, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return Err(BadRequest::EmptyDescriptor(d));
        }
        if descriptor.entries.len() > options.max_entries {
            return Err(BadRequest::TooManyEntries {
                descriptor: d,
                count: descriptor.entries.len(),
                max: options.max_entries,
            });
        }
        if let Some(e) = descriptor.entries.iter().position(|e| e.key.is_empty()) {
            return Err(BadRequest::EmptyKey {
                descriptor: d,
                entry: e,
            });
        }
        if descriptor.is_negative_hits {
            return Err(BadRequest::NegativeHits(d));
        }
    }
    Ok(())
}

/// The cost of one descriptor: its own `hits_addend` when it has one, else the request's; 0
/// means 1, as Envoy and envoyproxy/ratelimit read an unset field. A cost larger than any limit
/// is over it (the client's algorithms saturate), never an overflow.
fn cost(request: &pb::RateLimitRequest, descriptor: &pb::RateLimitDescriptor) -> u64 {
    let hits = descriptor
        .hits_addend
        .as_ref()
        .map_or(u64::from(request.hits_addend), |h| h.value);
    hits.max(1)
}

/// The units a descriptor settles when its bucket is a token budget that Envoy charges at the
/// end of the response (`cost: { response: hits_addend }`): its own `hits_addend`, which only
/// Envoy's `apply_on_stream_done` rate limit sets in that configuration (Envoy AI Gateway's
/// request-time descriptor has none, Envoy Gateway's `request: { number: 0 }` sends 0). A
/// descriptor without one, or with 0, is the admission at the request.
fn settlement(descriptor: &pb::RateLimitDescriptor) -> Option<u64> {
    descriptor
        .hits_addend
        .as_ref()
        .map(|h| h.value)
        .filter(|&used| used > 0)
}

/// Decides `request` with `client`'s rules, at `client`'s time, and counts every decision in the
/// buckets' metrics (`spillway_requests_total`) as the HTTP path does.
pub async fn decide(
    client: &Client,
    request: &pb::RateLimitRequest,
    options: &RlsOptions,
) -> Result<pb::RateLimitResponse, BadRequest> {
    check(request, options)?;
    let rules = client.rules();
    let now = client.now();
    let domain = request.domain.as_str();
    let mut buckets: Vec<Option<BucketId>> = request
        .descriptors
        .iter()
        .map(|d| rules.descriptor_bucket(domain, &WithoutTier(&Wire(&d.entries))))
        .collect();
    // envoyproxy/ratelimit's `replaces`: a bucket that another of this request's buckets
    // replaces is not decided, and its descriptor is answered as one that matched nothing.
    let replaced: Vec<BucketId> = buckets
        .iter()
        .flatten()
        .flat_map(|&id| rules.replaces(id).iter().copied())
        .collect();
    if !replaced.is_empty() {
        for bucket in &mut buckets {
            if bucket.is_some_and(|id| replaced.contains(&id)) {
                *bucket = None;
            }
        }
    }
    let mut statuses = Vec::with_capacity(request.descriptors.len());
    for (descriptor, bucket) in request.descriptors.iter().zip(buckets) {
        let status = match bucket {
            None => DescriptorStatus::UNMATCHED,
            Some(id) => {
                let wire = Wire(&descriptor.entries);
                let entries = WithoutTier(&wire);
                // The tier Envoy put in the descriptor (its `request_headers` action with
                // `descriptor_key: criticality`), trusted as the rules' identity says.
                let tier = rules.identity().criticality_of(entries.tier());
                let step = match settlement(descriptor) {
                    // Envoy's call at the end of the response: charge what it used.
                    Some(used) if rules.settled_by_envoy(id) => {
                        rules.settle_descriptor(now, id, &entries, used)
                    }
                    _ => rules.decide_descriptor_tier(
                        now,
                        id,
                        &entries,
                        cost(request, descriptor),
                        tier,
                    ),
                };
                match step {
                    DescriptorStep::Done(status) => status,
                    DescriptorStep::Redis(check) => rules.finish_descriptor(check).await,
                }
            }
        };
        statuses.push(status);
    }
    Ok(response(&rules, &statuses, options))
}

/// The answer for `statuses`, one per request descriptor in request order.
fn response(
    rules: &Rules,
    statuses: &[DescriptorStatus],
    options: &RlsOptions,
) -> pb::RateLimitResponse {
    let over = statuses.iter().any(DescriptorStatus::is_over_limit);
    let statuses: Vec<pb::DescriptorStatus> = statuses.iter().map(|s| status(rules, s)).collect();
    let response_headers_to_add = if options.response_headers {
        headers(&statuses)
    } else {
        Vec::new()
    };
    pb::RateLimitResponse {
        overall_code: if over {
            pb::Code::OverLimit
        } else {
            pb::Code::Ok
        } as i32,
        statuses,
        response_headers_to_add,
        ..Default::default()
    }
}

/// One descriptor's status: no `current_limit` (and no reset) for a descriptor that matched
/// nothing, an `unlimited` or an `allow` bucket; an `over-limit` bucket reports 0 requests per
/// unit, as envoyproxy/ratelimit's `requests_per_unit: 0` does.
fn status(rules: &Rules, s: &DescriptorStatus) -> pb::DescriptorStatus {
    let current_limit = s.limit.map(|limit| {
        let (requests_per_unit, unit) = envoy_unit(limit);
        pb::RateLimit {
            name: s
                .bucket
                .and_then(|id| rules.bucket(id))
                .map(|b| b.name().to_owned())
                .unwrap_or_default(),
            requests_per_unit: if s.answer == Answer::OverLimit {
                0
            } else {
                requests_per_unit
            },
            unit: unit as i32,
        }
    });
    pb::DescriptorStatus {
        code: if s.is_over_limit() {
            pb::Code::OverLimit
        } else {
            pb::Code::Ok
        } as i32,
        duration_until_reset: current_limit.as_ref().map(|_| duration(s.reset)),
        current_limit,
        limit_remaining: u32::try_from(s.remaining).unwrap_or(u32::MAX),
        quota: None,
    }
}

fn duration(d: Duration) -> pb::Duration {
    pb::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (whole seconds) of the limited
/// descriptor with the least remaining (the first of equals), as envoyproxy/ratelimit writes
/// them; none when no descriptor has a limit.
fn headers(statuses: &[pb::DescriptorStatus]) -> Vec<pb::HeaderValue> {
    let least = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| s.limit_remaining);
    let Some(least) = least else {
        return Vec::new();
    };
    let header = |key: &str, value: String| pb::HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    };
    let limit = least
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = least.duration_until_reset.as_ref().map_or(0, |d| d.seconds);
    vec![
        header("RateLimit-Limit", limit.to_string()),
        header("RateLimit-Remaining", least.limit_remaining.to_string()),
        header("RateLimit-Reset", reset.to_string()),
    ]
}

/// Envoy's units with their lengths in seconds (envoyproxy/ratelimit's: a month is 30 days, a
/// year 365).
const UNITS: [(pb::Unit, u64); 7] = [
    (pb::Unit::Second, 1),
    (pb::Unit::Minute, 60),
    (pb::Unit::Hour, 3_600),
    (pb::Unit::Day, 86_400),
    (pb::Unit::Week, 604_800),
    (pb::Unit::Month, 2_592_000),
    (pb::Unit::Year, 31_536_000),
];

/// A Spillway limit as Envoy's `requests_per_unit` and `unit`. Envoy has only whole units, so a
/// limit over another period is told as the same rate over the shortest unit that is a whole
/// number of its periods (`100 per 30s` is 200 a MINUTE, `5 per 250ms` 20 a SECOND, `10 per 45s`
/// 800 an HOUR); a period that divides no unit is told over the shortest unit at least as long,
/// rounded down (`7 per 11s` is 38 a MINUTE). Counts past `u32::MAX` are told as `u32::MAX`.
pub fn envoy_unit(limit: Limit) -> (u32, pb::Unit) {
    const NANOS: u128 = 1_000_000_000;
    let period = limit.period.as_nanos().max(1);
    let count = u128::from(limit.count.get());
    let told = |n: u128| u32::try_from(n).unwrap_or(u32::MAX);
    if let Some(&(unit, secs)) = UNITS
        .iter()
        .find(|(_, secs)| (u128::from(*secs) * NANOS).is_multiple_of(period))
    {
        return (told(count * (u128::from(secs) * NANOS / period)), unit);
    }
    let (unit, secs) = UNITS
        .iter()
        .copied()
        .find(|(_, secs)| u128::from(*secs) * NANOS >= period)
        .unwrap_or(UNITS[UNITS.len() - 1]);
    (told(count * u128::from(secs) * NANOS / period), unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::request;
    use std::num::NonZeroU64;

    fn limit(count: u64, period: Duration) -> Limit {
        Limit::new(NonZeroU64::new(count).unwrap(), period)
    }

    #[test]
    fn limits_are_told_in_envoys_units() {
        let s = Duration::from_secs;
        assert_eq!(envoy_unit(limit(5, s(1))), (5, pb::Unit::Second));
        assert_eq!(envoy_unit(limit(300, s(60))), (300, pb::Unit::Minute));
        assert_eq!(envoy_unit(limit(1000, s(3600))), (1000, pb::Unit::Hour));
        assert_eq!(envoy_unit(limit(7, s(86_400))), (7, pb::Unit::Day));
        assert_eq!(envoy_unit(limit(7, s(604_800))), (7, pb::Unit::Week));
        assert_eq!(envoy_unit(limit(7, s(2_592_000))), (7, pb::Unit::Month));
        assert_eq!(envoy_unit(limit(7, s(31_536_000))), (7, pb::Unit::Year));
        // Other periods: the same rate over the shortest unit that holds a whole number of them.
        assert_eq!(envoy_unit(limit(100, s(30))), (200, pb::Unit::Minute));
        assert_eq!(
            envoy_unit(limit(5, Duration::from_millis(250))),
            (20, pb::Unit::Second)
        );
        assert_eq!(envoy_unit(limit(10, s(45))), (800, pb::Unit::Hour));
        assert_eq!(envoy_unit(limit(3, s(2 * 86_400))), (45, pb::Unit::Month));
        // 11 s divides no unit: 7 per 11 s is 38.2 a minute, told as 38.
        assert_eq!(envoy_unit(limit(7, s(11))), (38, pb::Unit::Minute));
        // Past 32 bits, the largest count Envoy can be told.
        assert_eq!(
            envoy_unit(limit(u64::MAX, s(1))),
            (u32::MAX, pb::Unit::Second)
        );
        assert_eq!(
            envoy_unit(limit(1 << 31, Duration::from_millis(1))),
            (u32::MAX, pb::Unit::Second)
        );
    }

    fn check_default(request: &pb::RateLimitRequest) -> Result<(), BadRequest> {
        check(request, &RlsOptions::default())
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        assert_eq!(
            check_default(&request("", &[&[("k", "v")]])),
            Err(BadRequest::EmptyDomain)
        );
        assert_eq!(
            check_default(&request("d", &[])),
            Err(BadRequest::NoDescriptors)
        );
        assert_eq!(
            check_default(&request("d", &[&[("k", "v")], &[]])),
            Err(BadRequest::EmptyDescriptor(1))
        );
        assert_eq!(
            check_default(&request("d", &[&[("k", "v"), ("", "v")]])),
            Err(BadRequest::EmptyKey {
                descriptor: 0,
                entry: 1
            })
        );
        let mut refund = request("d", &[&[("k", "v")]]);
        refund.descriptors[0].is_negative_hits = true;
        assert_eq!(check_default(&refund), Err(BadRequest::NegativeHits(0)));
        // An empty value is a value.
        assert_eq!(check_default(&request("d", &[&[("k", "")]])), Ok(()));
        assert_eq!(
            BadRequest::EmptyKey {
                descriptor: 2,
                entry: 0
            }
            .to_string(),
            "descriptors[2].entries[0] has an empty key"
        );
    }

    #[test]
    fn hits_addend_zero_is_one_and_a_descriptors_own_wins() {
        let mut r = request("d", &[&[("k", "v")], &[("k", "w")]]);
        assert_eq!(cost(&r, &r.descriptors[0]), 1);
        r.hits_addend = 7;
        r.descriptors[1].hits_addend = Some(pb::UInt64Value { value: u64::MAX });
        assert_eq!(cost(&r, &r.descriptors[0]), 7);
        assert_eq!(cost(&r, &r.descriptors[1]), u64::MAX);
        r.descriptors[1].hits_addend = Some(pb::UInt64Value { value: 0 });
        assert_eq!(cost(&r, &r.descriptors[1]), 1);
    }

    #[test]
    fn descriptors_and_entries_beyond_the_caps_are_refused_before_matching() {
        let options = RlsOptions {
            max_descriptors: 2,
            max_entries: 3,
            ..RlsOptions::default()
        };
        let two: &[(&str, &str)] = &[("a", "1"), ("b", "2")];
        assert_eq!(check(&request("d", &[two, two]), &options), Ok(()));
        assert_eq!(
            check(&request("d", &[two, two, two]), &options),
            Err(BadRequest::TooManyDescriptors { count: 3, max: 2 })
        );
        let four: &[(&str, &str)] = &[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")];
        assert_eq!(
            check(&request("d", &[two, four]), &options),
            Err(BadRequest::TooManyEntries {
                descriptor: 1,
                count: 4,
                max: 3
            })
        );
        let defaults = RlsOptions::default();
        assert_eq!((defaults.max_descriptors, defaults.max_entries), (64, 32));
    }
}
