//! One RLQS host as a host of the zone, sans-IO: the usage reports of its streams become the
//! offered load the host side of the loop reports ([`HostCore`]), and the instructions the zone
//! sends it become assignments Envoy enforces by itself.
//!
//! A host is one identity (a client certificate's SPIFFE id) or, without TLS, one connection
//! ([`crate::rlqs`]): every stream it opens feeds the same [`Instance`], whose one report per
//! interval sums them, so opening more streams never makes a client more hosts of its zone.
//! Each stream keeps its own domain and bucket ids, and is told about its own.
//!
//! What Envoy is told is [`crate::assign`]'s; the caps on bucket ids are [`crate::caps`]'s.
//!
//! Envoy enforces a `token_bucket` or a `blanket_rule` per bucket id; it cannot drop a fraction
//! of requests. So a drop-ratio bucket's ratio `r` becomes a token bucket at the rate the host
//! would admit, `(1 - r) x` the instance's offered rate: three instances offering 100/s against
//! a 150/s limit are told `r = 0.5` and each gets 50 tokens a second. `r = 0` is `ALLOW_ALL`,
//! `r = 1` is `DENY_ALL`. An adaptive token bucket's share becomes a token bucket at that share
//! of its limit. A bucket the control plane does not compute (a local algorithm) is a token
//! bucket at its own limit per instance, what a sidecar enforces for it; `unlimited` and `allow`
//! answers and shadow buckets are `ALLOW_ALL`, `over-limit` is `DENY_ALL`. A `store: redis`
//! bucket is exact only through Redis, which Envoy's RLQS filter does not call: over RLQS it is
//! `ALLOW_ALL` (use RLS, `ShouldRateLimit`, for those).
//!
//! Usage arrives in lumps (one report per `reporting_interval`, not aligned with the loop's),
//! so each report sets a rate, and the host's counters grow at that rate between reports: the
//! loop's intervals see a steady load, not a report in one and none in the next. A bucket id
//! that goes unreported for three of its own report periods (at least 3 s) counts no load.
//!
//! Before the zone has rules (an aggregator whose controller has not spoken yet) an instance
//! answers nothing, and Envoy applies its `no_assignment_behavior`.
//!
//! Envoy reads TTLs and fill intervals as whole seconds; an assignment lives for three report
//! intervals of the loop (3 s at 1 s) and every assignment is sent again each interval, so a
//! stream whose zone loses its controller lets its assignments lapse, as a host's instructions
//! expire; Envoy then applies its `expired_assignment_behavior`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use spillway_core::algo::{Kind, Ratio};
use spillway_core::clock::{Nanos, nanos};
use spillway_core::config::{self, Config, StateStore};
use spillway_core::counters::Snapshot;
use spillway_core::decision::{BucketId as RulesBucket, Mode};
use spillway_core::descriptor::{Answer, DescriptorMatcher, Entries};
use spillway_link::rules_handshake;
use spillway_loop::{BucketKey, DecodeRules, HostCore, HostId, HostStep, HostTime, LinkRules};
use spillway_proto::v1;

use crate::assign::bucket_id;
pub use crate::assign::{Actions, QuotaAction, bucket_action, response};
pub use crate::caps::{Caps, MAX_BUCKET_ID_BYTES, MAX_BUCKETS, QuotaScope};

/// A usage report Spillway cannot count: the client's fault, answered `INVALID_ARGUMENT`
/// (`RESOURCE_EXHAUSTED` for [`BadUsage::TooManyBuckets`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadUsage {
    #[error("the report's domain is empty: give the domain the descriptor buckets name")]
    EmptyDomain,
    #[error("the stream reported domain {first:?} first and now {now:?}: one stream, one domain")]
    DomainChanged { first: String, now: String },
    #[error("the report has no bucket_quota_usages")]
    NoUsage,
    #[error("bucket_quota_usages[{0}] has no bucket_id, or a bucket_id with no entries")]
    NoBucketId(usize),
    #[error("bucket_quota_usages[{0}].bucket_id has an empty key or value")]
    EmptyEntry(usize),
    #[error("bucket_quota_usages[{0}].time_elapsed is missing or not above zero")]
    NoTimeElapsed(usize),
    #[error(
        "bucket_quota_usages[{index}].bucket_id has {bytes} bytes of keys and values, more than the {MAX_BUCKET_ID_BYTES} a bucket id may have"
    )]
    BucketIdTooLong { index: usize, bytes: usize },
    #[error("{scope} holds {max} bucket ids already, the most it may; a new one was refused")]
    TooManyBuckets { scope: QuotaScope, max: usize },
}

/// How a rules bucket is decided over RLQS.
#[derive(Debug, Clone, Copy)]
enum Plan {
    /// By the control plane: the host core's bucket at this position.
    Control(usize),
    /// The same assignment whatever the load.
    Fixed(QuotaAction),
}

/// What the last instruction said of a control-plane bucket.
#[derive(Debug, Clone, Copy)]
struct Steer {
    kind: Kind,
    limit_rps: f64,
    /// A drop ratio and when it expires on the limiters' clock.
    ratio: Option<(Ratio, Nanos)>,
    /// An adaptive share of the limit and when it expires.
    share: Option<(Ratio, Nanos)>,
}

/// One bucket id Envoy reported (its entries are its key in [`Stream::ids`]).
#[derive(Debug)]
struct Subscribed {
    /// The rules bucket that decides it (its position in the rules), if any.
    bucket: Option<usize>,
    allowed_rps: f64,
    denied_rps: f64,
    /// When it was last reported, and after when its rates no longer count.
    stale_at: Nanos,
    sent: Option<QuotaAction>,
    /// Its bucket left the rules: it is told [`QuotaAction::Abandon`] once, then forgotten.
    abandoned: bool,
}

/// One stream of a host: its domain and its bucket ids, by their entries in key order.
#[derive(Debug, Default)]
struct Stream {
    domain: Option<String>,
    ids: BTreeMap<Vec<(String, String)>, Subscribed>,
}

/// One RLQS host (all the streams of one identity or connection), as a host of the zone.
#[derive(Debug)]
pub struct Instance {
    core: HostCore,
    own: Config,
    plans: Vec<Plan>,
    matcher: DescriptorMatcher,
    steer: Vec<Steer>,
    /// Per host-core bucket: allowed and denied requests counted so far (fractions kept).
    counted: Vec<(f64, f64)>,
    counted_at: Nanos,
    streams: BTreeMap<u64, Stream>,
    /// Bucket ids held by all its streams.
    held: usize,
    caps: Caps,
}

/// A bucket id's entries in key order, as a descriptor's (a protobuf map has no order).
struct Sorted<'a>(&'a [(String, String)]);

impl Entries for Sorted<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn key(&self, index: usize) -> &str {
        &self.0[index].0
    }
    fn value(&self, index: usize) -> &str {
        &self.0[index].1
    }
}

/// Rules with no services: what an instance runs until the zone has rules.
fn no_rules() -> Config {
    config::load_str("version: 1\nservices: {}\n", "rlqs").expect("an empty file is valid")
}

impl Instance {
    /// Envoy instance `id`, running `rules` (the zone's, when it has them) from `now`.
    pub fn new(id: HostId, rules: Option<&v1::Rules>, now: HostTime) -> Self {
        Self::with_caps(id, rules, now, Caps::default())
    }

    /// [`Instance::new`] whose bucket ids count against `caps`.
    pub fn with_caps(id: HostId, rules: Option<&v1::Rules>, now: HostTime, caps: Caps) -> Self {
        let own = no_rules();
        let (version, config) = match rules.map(|r| (r.version, Self::config_of(&own, r))) {
            Some((version, Ok(config))) => (version, config),
            Some((version, Err(err))) => {
                tracing::error!(
                    version,
                    "RLQS: the zone's rules do not run here, starting without: {err}"
                );
                (0, own.clone())
            }
            None => (0, own.clone()),
        };
        let core = HostCore::new(id, &config, version);
        let mut instance = Self {
            core,
            own,
            plans: Vec::new(),
            matcher: DescriptorMatcher::compile([]),
            steer: Vec::new(),
            counted: Vec::new(),
            counted_at: now.clock,
            streams: BTreeMap::new(),
            held: 0,
            caps,
        };
        instance.run(&config, &Self::redis_buckets(rules), HashMap::new());
        instance.core.start(now, &instance.snapshot());
        instance
    }

    /// The rules of `message` as this instance runs them: a `store: redis` bucket counts here
    /// as a local one of the same shape, so that descriptors match exactly as they would by RLS,
    /// and its plan is `ALLOW_ALL` ([`Instance::run`]).
    fn config_of(own: &Config, message: &v1::Rules) -> Result<Config, String> {
        let mut rules = LinkRules::decode(message).map_err(|e| e.to_string())?;
        for (_, service) in &mut rules.services.0 {
            for bucket in &mut service.buckets {
                if bucket.store == Some(StateStore::Redis) {
                    bucket.store = Some(StateStore::Local);
                    bucket.batch = None;
                }
            }
        }
        let config = rules
            .with_own(own, &format!("rules version {}", message.version))
            .map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// Which rules buckets were `store: redis` in `message` (they were made local to run).
    fn redis_buckets(message: Option<&v1::Rules>) -> Vec<(String, String)> {
        let Some(rules) = message.and_then(|m| LinkRules::decode(m).ok()) else {
            return Vec::new();
        };
        rules
            .services
            .0
            .iter()
            .flat_map(|(name, s)| {
                s.buckets
                    .iter()
                    .filter(|b| b.store == Some(StateStore::Redis))
                    .map(move |b| (name.clone(), b.name.clone()))
            })
            .collect()
    }

    /// Runs `config` (`redis`: its buckets that were `store: redis`): the plans, the matcher,
    /// the control-plane buckets' steering and counts (kept, by bucket, from `old`). Every
    /// bucket id is matched again: one whose bucket is gone is abandoned.
    fn run(
        &mut self,
        config: &Config,
        redis: &[(String, String)],
        mut old: HashMap<BucketKey, (Steer, (f64, f64))>,
    ) {
        let keys: Vec<BucketKey> = self.core.buckets().cloned().collect();
        let mut plans = Vec::new();
        for (service, bucket) in config.buckets() {
            let was_redis = redis
                .iter()
                .any(|(s, b)| *s == service.name && *b == bucket.name);
            let answer = bucket
                .descriptor
                .as_ref()
                .map_or(Answer::Limit, |d| d.answer);
            let position = keys
                .iter()
                .position(|k| k.service == service.name && k.bucket == bucket.name);
            let plan = match (answer, position) {
                (Answer::Unlimited | Answer::Allow, _) => Plan::Fixed(QuotaAction::Allow),
                (Answer::OverLimit, _) => Plan::Fixed(QuotaAction::Deny),
                _ if bucket.mode == Mode::Shadow || was_redis => Plan::Fixed(QuotaAction::Allow),
                (Answer::Limit, Some(p)) => Plan::Control(p),
                (Answer::Limit, None) => Plan::Fixed(QuotaAction::of_limit(bucket.limit)),
            };
            plans.push(plan);
        }
        self.steer.clear();
        self.counted.clear();
        for key in &keys {
            let (_, bucket) = config
                .buckets()
                .find(|(s, b)| s.name == key.service && b.name == key.bucket)
                .expect("the host core's buckets are the rules'");
            let (kept, counted) = old
                .remove(key)
                .filter(|(s, _)| s.kind == bucket.algorithm)
                .map_or((None, (0.0, 0.0)), |(s, c)| (Some(s), c));
            self.steer.push(Steer {
                kind: bucket.algorithm,
                limit_rps: bucket.limit.per_second(),
                ratio: kept.and_then(|s| s.ratio),
                share: kept.and_then(|s| s.share),
            });
            self.counted.push(counted);
        }
        self.plans = plans;
        self.matcher =
            DescriptorMatcher::compile(config.buckets().enumerate().filter_map(|(i, (_, b))| {
                let id = RulesBucket(u32::try_from(i).ok()?);
                b.descriptor.as_ref().map(|d| (id, d))
            }));
        for stream in self.streams.values_mut() {
            let Some(domain) = stream.domain.as_deref() else {
                continue;
            };
            for (entries, s) in &mut stream.ids {
                let bucket = self
                    .matcher
                    .find(domain, &Sorted(entries))
                    .map(|id| id.index());
                s.abandoned = s.bucket.is_some() && bucket.is_none();
                s.bucket = bucket;
            }
        }
    }

    /// Each control-plane bucket's steering and counts, by bucket, for [`Instance::run`].
    fn keep(&self) -> HashMap<BucketKey, (Steer, (f64, f64))> {
        self.core
            .buckets()
            .cloned()
            .zip(self.steer.iter().copied().zip(self.counted.iter().copied()))
            .collect()
    }

    /// Counts what every bucket id's rates add from the last call to `now`.
    fn integrate(&mut self, now: Nanos) {
        let dt = now.saturating_sub(self.counted_at) as f64 / 1e9;
        self.counted_at = now;
        for s in self.streams.values().flat_map(|stream| stream.ids.values()) {
            let Some(Plan::Control(p)) = s.bucket.and_then(|b| self.plans.get(b).copied()) else {
                continue;
            };
            if now >= s.stale_at {
                continue;
            }
            let c = &mut self.counted[p];
            c.0 += s.allowed_rps * dt;
            c.1 += s.denied_rps * dt;
        }
    }

    /// The host core's counters, in its buckets' order.
    fn snapshot(&self) -> Vec<Snapshot> {
        self.counted
            .iter()
            .map(|&(allowed, denied)| Snapshot {
                allowed: allowed as u64,
                dropped: denied as u64,
                ..Snapshot::default()
            })
            .collect()
    }

    /// When [`Instance::on_deadline`] is due, Unix milliseconds.
    pub fn deadline(&self) -> u64 {
        self.core.deadline()
    }

    /// The report interval in force.
    pub fn interval(&self) -> Duration {
        self.core.interval().duration()
    }

    /// The deadline passed: the report for the zone, if one is due, with every assignment
    /// again (so none lapses while the zone is healthy).
    pub fn on_deadline(&mut self, now: HostTime) -> (Option<v1::Report>, Actions) {
        self.integrate(now.clock);
        let report = self.core.on_deadline(now, &self.snapshot());
        let actions = match report {
            Some(_) => self.assignments(now.clock, true),
            None => Actions::new(),
        };
        (report, actions)
    }

    /// Stream `stream` of this host opened.
    pub fn open_stream(&mut self, stream: u64) {
        self.streams.entry(stream).or_default();
    }

    /// Stream `stream` ended: its bucket ids are forgotten (and given back to the caps); the
    /// host's load from them counts no more.
    pub fn close_stream(&mut self, now: HostTime, stream: u64) {
        self.integrate(now.clock);
        if let Some(gone) = self.streams.remove(&stream) {
            self.held -= gone.ids.len();
            self.caps.give(gone.ids.len());
        }
    }

    /// Streams open.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// A usage report on stream `stream`: counts it and answers the bucket ids whose assignment
    /// changed (a new bucket id always gets one).
    pub fn on_usage(
        &mut self,
        stream: u64,
        now: HostTime,
        reports: &RateLimitQuotaUsageReports,
    ) -> Result<Vec<BucketAction>, BadUsage> {
        if reports.domain.is_empty() {
            return Err(BadUsage::EmptyDomain);
        }
        let domain = &mut self.streams.entry(stream).or_default().domain;
        match domain {
            Some(first) if *first != reports.domain => {
                return Err(BadUsage::DomainChanged {
                    first: first.clone(),
                    now: reports.domain.clone(),
                });
            }
            Some(_) => {}
            None => *domain = Some(reports.domain.clone()),
        }
        if reports.bucket_quota_usages.is_empty() {
            return Err(BadUsage::NoUsage);
        }
        let mut parsed = Vec::with_capacity(reports.bucket_quota_usages.len());
        for (i, usage) in reports.bucket_quota_usages.iter().enumerate() {
            let Some(id) = usage.bucket_id.as_ref().filter(|id| !id.bucket.is_empty()) else {
                return Err(BadUsage::NoBucketId(i));
            };
            if id.bucket.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
                return Err(BadUsage::EmptyEntry(i));
            }
            let bytes: usize = id.bucket.iter().map(|(k, v)| k.len() + v.len()).sum();
            if bytes > MAX_BUCKET_ID_BYTES {
                return Err(BadUsage::BucketIdTooLong { index: i, bytes });
            }
            let elapsed = usage
                .time_elapsed
                .as_ref()
                .map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
                .filter(|&s| s > 0.0)
                .ok_or(BadUsage::NoTimeElapsed(i))?;
            let mut entries: Vec<(String, String)> = id
                .bucket
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            entries.sort();
            parsed.push((entries, elapsed, usage));
        }
        // Count up to now at the old rates before the new ones apply.
        self.integrate(now.clock);
        let ids = &mut self.streams.get_mut(&stream).expect("entered above").ids;
        for (entries, elapsed, usage) in parsed {
            if !ids.contains_key(&entries) {
                let full = if ids.len() >= self.caps.per_stream {
                    Some((QuotaScope::Stream, self.caps.per_stream))
                } else if self.held >= self.caps.per_host {
                    Some((QuotaScope::Host, self.caps.per_host))
                } else if !self.caps.take() {
                    Some((QuotaScope::Aggregator, self.caps.total))
                } else {
                    None
                };
                if let Some((scope, max)) = full {
                    return Err(BadUsage::TooManyBuckets { scope, max });
                }
                self.held += 1;
                let bucket = self
                    .matcher
                    .find(&reports.domain, &Sorted(&entries))
                    .map(|b| b.index());
                ids.insert(
                    entries.clone(),
                    Subscribed {
                        bucket,
                        allowed_rps: 0.0,
                        denied_rps: 0.0,
                        stale_at: 0,
                        sent: None,
                        abandoned: false,
                    },
                );
            }
            let s = ids.get_mut(&entries).expect("inserted above");
            s.allowed_rps = usage.num_requests_allowed as f64 / elapsed;
            s.denied_rps = usage.num_requests_denied as f64 / elapsed;
            s.stale_at = now.clock.saturating_add(nanos(
                Duration::from_secs_f64(elapsed * 3.0).max(Duration::from_secs(3)),
            ));
        }
        Ok(self
            .assignments(now.clock, false)
            .remove(&stream)
            .unwrap_or_default())
    }

    /// Instructions from the zone: the rules they carry (when new) and each bucket's ratio or
    /// share; answers the bucket ids whose assignment changed.
    pub fn on_instructions(&mut self, now: HostTime, instructions: v1::Instructions) -> Actions {
        let steps = self.core.on_instructions(now, instructions);
        self.apply(now, steps);
        self.assignments(now.clock, false)
    }

    fn apply(&mut self, now: HostTime, steps: Vec<HostStep>) {
        for step in steps {
            match step {
                HostStep::Rules { version, rules } => {
                    let more = match Self::config_of(&self.own, &rules) {
                        Ok(config) => {
                            self.integrate(now.clock);
                            let old = self.keep();
                            let more = rules_handshake(
                                &mut self.core,
                                now,
                                version,
                                Ok::<_, String>(&config),
                                "RLQS: ",
                            );
                            self.run(&config, &Self::redis_buckets(Some(&rules)), old);
                            more
                        }
                        Err(err) => rules_handshake(
                            &mut self.core,
                            now,
                            version,
                            Err::<&Config, _>(err),
                            "RLQS: ",
                        ),
                    };
                    self.apply(now, more);
                }
                // An Envoy instance has no tiers: its share follows the bucket's ratio.
                HostStep::DropRatio {
                    bucket, ratio, ttl, ..
                } => {
                    if let Some(s) = self.steer.get_mut(bucket) {
                        s.ratio = Some((ratio, now.clock.saturating_add(nanos(ttl))));
                    }
                }
                HostStep::Share { bucket, share } => {
                    if let Some(s) = self.steer.get_mut(bucket) {
                        let ttl = 3 * self.core.interval().duration();
                        s.share = Some((share, now.clock.saturating_add(nanos(ttl))));
                    }
                }
                HostStep::ShareExpired { bucket } => {
                    if let Some(s) = self.steer.get_mut(bucket) {
                        s.share = None;
                    }
                }
                // The surge guard needs a count every 50 ms; Envoy reports once a second or
                // less, so between instructions the instruction's own ratio holds.
                HostStep::Surge { .. } => {}
            }
        }
    }

    /// What bucket id `s` is told at `now`.
    fn action(&self, s: &Subscribed, now: Nanos) -> QuotaAction {
        if s.abandoned {
            return QuotaAction::Abandon;
        }
        let Some(bucket) = s.bucket else {
            // Unmatched: OK, as an RLS descriptor that matches no bucket.
            return QuotaAction::Allow;
        };
        match self.plans.get(bucket) {
            None => QuotaAction::Allow,
            Some(Plan::Fixed(action)) => *action,
            Some(Plan::Control(p)) => {
                let steer = self.steer[*p];
                let live = |v: Option<(Ratio, Nanos)>| v.filter(|&(_, until)| now < until);
                match steer.kind {
                    Kind::AdaptiveTokenBucket => {
                        let share = live(steer.share).map_or(1.0, |(s, _)| s.as_f64());
                        QuotaAction::tokens(steer.limit_rps * share)
                    }
                    _ => {
                        let ratio = live(steer.ratio).map_or(0.0, |(r, _)| r.as_f64());
                        let offered = if now < s.stale_at {
                            s.allowed_rps + s.denied_rps
                        } else {
                            0.0
                        };
                        if ratio <= 0.0 || offered <= 0.0 {
                            QuotaAction::Allow
                        } else if ratio >= 1.0 {
                            QuotaAction::Deny
                        } else {
                            QuotaAction::tokens((1.0 - ratio) * offered)
                        }
                    }
                }
            }
        }
    }

    /// The assignments to send, by stream: every bucket id's with `all`, else those that changed.
    fn assignments(&mut self, now: Nanos, all: bool) -> Actions {
        // Before the zone's first rules nothing is known of any bucket id: Envoy applies its
        // own `no_assignment_behavior` until they come (within an interval of the link).
        if self.core.rules_version() == 0 {
            return Actions::new();
        }
        let ttl = self.ttl();
        let mut out = Actions::new();
        let mut streams = std::mem::take(&mut self.streams);
        let mut forgotten = 0;
        for (&n, stream) in &mut streams {
            let mut actions = Vec::new();
            for (entries, s) in &mut stream.ids {
                let action = self.action(s, now);
                if all || s.sent != Some(action) {
                    s.sent = Some(action);
                    actions.push(bucket_action(bucket_id(entries), action, ttl));
                }
            }
            // An abandoned bucket id is forgotten: Envoy drops it and reports it again as new.
            let before = stream.ids.len();
            stream.ids.retain(|_, s| !s.abandoned);
            forgotten += before - stream.ids.len();
            if !actions.is_empty() {
                out.insert(n, actions);
            }
        }
        self.streams = streams;
        self.held -= forgotten;
        self.caps.give(forgotten);
        out
    }

    /// An assignment's time to live: three report intervals, in whole seconds.
    fn ttl(&self) -> Duration {
        let secs = (3 * self.core.interval().ms()).div_ceil(1000).max(2);
        Duration::from_secs(secs)
    }

    /// Bucket ids held by all its streams.
    pub fn buckets(&self) -> usize {
        self.held
    }
}

impl Drop for Instance {
    /// Its bucket ids leave the aggregator's total with it.
    fn drop(&mut self) {
        self.caps.give(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action;
    use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;
    use spillway_loop::{RulesMessage, RulesSnapshot};
    use std::sync::atomic::Ordering;

    const RULES: &str = "version: 1\ncontrol:\n  report_interval: 500ms\nservices:\n  edge:\n    buckets:\n      - name: checkout\n        match: { descriptor: { domain: edge, entries: [ {key: route, value: checkout} ] } }\n        limit: 150/s\n      - name: search\n        match: { descriptor: { domain: edge, entries: [ {key: route, value: search} ] } }\n        limit: 40/s\n        algorithm: fixed-window\n";

    /// The tests' Unix time at their time 0, in milliseconds.
    const BASE_MS: u64 = 1_700_000_000_000;

    fn at(ms: u64) -> HostTime {
        HostTime {
            clock: ms * 1_000_000,
            unix_ns: (BASE_MS + ms) * 1_000_000,
        }
    }

    fn id() -> HostId {
        HostId {
            host_id: "envoy-1".into(),
            region: "r1".into(),
            zone: "z1".into(),
        }
    }

    #[test]
    fn the_zones_rules_run_at_once() {
        let message = RulesSnapshot::parse(3, RULES, "rules.yaml")
            .unwrap()
            .message();
        let own = no_rules();
        Instance::config_of(&own, &message).unwrap();
        let instance = Instance::new(id(), Some(&message), at(0));
        assert_eq!(instance.core.rules_version(), 3);
        assert_eq!(instance.plans.len(), 2);
    }

    fn usage(routes: &[String], allowed: u64, denied: u64) -> RateLimitQuotaUsageReports {
        use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
        RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: routes
                .iter()
                .map(|r| BucketQuotaUsage {
                    bucket_id: Some(BucketId {
                        bucket: [("route".to_owned(), r.clone())].into(),
                    }),
                    time_elapsed: Some(PbDuration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    num_requests_allowed: allowed,
                    num_requests_denied: denied,
                })
                .collect(),
        }
    }

    fn instruction(ratio: f64) -> v1::Instructions {
        v1::Instructions {
            from_rates_now: false,
            epoch: 0,
            issued_at_ms: 0,
            ttl_ms: 3_000,
            interval_ms: 500,
            sequence: 1,
            provisional: false,
            buckets: vec![v1::BucketInstruction {
                service: "edge".into(),
                bucket: "checkout".into(),
                drop_ratio: Ratio::from_f64(ratio).raw(),
                share: None,
                scope_offered_rps: 300.0,
                scope_hosts: 3,
                tier_drop_ratio: Vec::new(),
                id: 0,
            }],
            rules_version: 3,
            rules: None,
        }
    }

    /// Stream 1's actions.
    fn of(mut actions: Actions) -> Vec<BucketAction> {
        actions.remove(&1).unwrap_or_default()
    }

    fn told(actions: &[BucketAction]) -> Vec<(String, Option<f64>)> {
        actions
            .iter()
            .map(|a| {
                let route = a.bucket_id.as_ref().unwrap().bucket["route"].clone();
                let rate = match a.bucket_action.as_ref().unwrap() {
                    bucket_action::BucketAction::QuotaAssignmentAction(q) => {
                        match q
                            .rate_limit_strategy
                            .as_ref()
                            .unwrap()
                            .strategy
                            .as_ref()
                            .unwrap()
                        {
                            Strategy::BlanketRule(0) => None,
                            Strategy::BlanketRule(_) => Some(0.0),
                            Strategy::TokenBucket(t) => Some(
                                f64::from(t.tokens_per_fill.unwrap().value)
                                    / t.fill_interval.unwrap().seconds as f64,
                            ),
                            other => panic!("{other:?}"),
                        }
                    }
                    bucket_action::BucketAction::AbandonAction(_) => Some(-1.0),
                };
                (route, rate)
            })
            .collect()
    }

    #[test]
    fn a_drop_ratio_becomes_the_share_of_the_offered_rate_the_instance_may_admit() {
        let message = RulesSnapshot::parse(3, RULES, "rules.yaml")
            .unwrap()
            .message();
        let mut instance = Instance::new(id(), Some(&message), at(0));
        let routes = [
            "checkout".to_owned(),
            "search".to_owned(),
            "other".to_owned(),
        ];
        // New bucket ids are answered at once: no instruction yet, so the drop-ratio bucket is
        // ALLOW_ALL; the local fixed window its own 40/s; the unmatched one ALLOW_ALL.
        let first = instance
            .on_usage(1, at(1_000), &usage(&routes, 100, 0))
            .unwrap();
        assert_eq!(
            told(&first),
            [
                ("checkout".to_owned(), None),
                ("other".to_owned(), None),
                ("search".to_owned(), Some(40.0))
            ]
        );
        // Unchanged assignments are not sent again on a usage report.
        assert!(
            instance
                .on_usage(1, at(1_500), &usage(&routes, 100, 0))
                .unwrap()
                .is_empty()
        );
        // r = 1/2 of an instance offering 100/s: 50 tokens a second.
        let half = of(instance.on_instructions(at(1_600), instruction(0.5)));
        assert_eq!(told(&half), [("checkout".to_owned(), Some(50.0))]);
        // Envoy enforces it: 50 allowed, 50 denied, still 100/s offered, nothing changes.
        assert!(
            instance
                .on_usage(1, at(2_600), &usage(&routes, 50, 50))
                .unwrap()
                .is_empty()
        );
        // The extremes are blanket rules.
        assert_eq!(
            told(&of(instance.on_instructions(at(2_700), instruction(1.0)))),
            [("checkout".to_owned(), Some(0.0))]
        );
        assert_eq!(
            told(&of(instance.on_instructions(at(2_800), instruction(0.0)))),
            [("checkout".to_owned(), None)]
        );
        // The instance's counts follow its rates between reports: a whole interval of 500 ms
        // at 100/s counts 50 offered, whenever the usage reports came.
        let mut reports = Vec::new();
        while reports.len() < 3 {
            let due = at(instance.deadline() - BASE_MS);
            if let (Some(report), _) = instance.on_deadline(due) {
                reports.push(report);
            }
        }
        let offered = &reports[2].buckets[0];
        assert_eq!((offered.bucket.as_str(), offered.offered), ("checkout", 50));
        assert_eq!(offered.allowed, 25);
    }

    #[test]
    fn an_instruction_expires_into_allow_all() {
        let message = RulesSnapshot::parse(3, RULES, "rules.yaml")
            .unwrap()
            .message();
        let mut instance = Instance::new(id(), Some(&message), at(0));
        let routes = ["checkout".to_owned()];
        instance
            .on_usage(1, at(100), &usage(&routes, 100, 0))
            .unwrap();
        instance.on_instructions(at(200), instruction(0.5));
        // Past the instruction's 3 s TTL with no new one, the next report finds it lapsed.
        let later = instance
            .on_usage(1, at(3_300), &usage(&routes, 50, 50))
            .unwrap();
        assert_eq!(told(&later), [("checkout".to_owned(), None)]);
    }

    #[test]
    fn a_stream_holds_a_bounded_number_of_bucket_ids() {
        let message = RulesSnapshot::parse(3, RULES, "rules.yaml")
            .unwrap()
            .message();
        let mut instance = Instance::new(id(), Some(&message), at(0));
        let routes: Vec<String> = (0..MAX_BUCKETS).map(|i| format!("r{i}")).collect();
        instance
            .on_usage(1, at(100), &usage(&routes, 1, 0))
            .unwrap();
        assert_eq!(instance.buckets(), MAX_BUCKETS);
        let one_more = instance.on_usage(1, at(200), &usage(&["new".to_owned()], 1, 0));
        assert_eq!(
            one_more,
            Err(BadUsage::TooManyBuckets {
                scope: QuotaScope::Stream,
                max: MAX_BUCKETS
            })
        );
        assert_eq!(instance.buckets(), MAX_BUCKETS);
    }

    #[test]
    fn the_streams_of_one_host_report_once_as_one_host() {
        let message = RulesSnapshot::parse(3, RULES, "rules.yaml")
            .unwrap()
            .message();
        let mut instance = Instance::new(id(), Some(&message), at(0));
        let routes = ["checkout".to_owned()];
        // 40 streams of one host, each reporting 100/s for the same bucket id.
        for n in 1..=40 {
            instance.open_stream(n);
            instance
                .on_usage(n, at(10), &usage(&routes, 100, 0))
                .unwrap();
        }
        let mut reports = Vec::new();
        while reports.len() < 3 {
            let due = at(instance.deadline() - BASE_MS);
            if let (Some(report), actions) = instance.on_deadline(due) {
                reports.push(report);
                // Every stream is told its assignments again.
                if reports.len() > 1 {
                    assert_eq!(actions.len(), 40);
                }
            }
        }
        // One report for the host: 40 x 100/s over a 500 ms interval, one host.
        let offered = &reports[2].buckets[0];
        assert_eq!(offered.offered, 2_000);
        // Told r = 1/2, each stream admits half its own 100/s.
        let half = instance.on_instructions(at(2_000), instruction(0.5));
        assert_eq!(half.len(), 40);
        assert!(
            half.values()
                .all(|a| told(a) == [("checkout".to_owned(), Some(50.0))])
        );
        // Closed streams count no more.
        for n in 2..=40 {
            instance.close_stream(at(2_000), n);
        }
        assert_eq!((instance.streams(), instance.buckets()), (1, 1));
    }

    #[test]
    fn bucket_ids_are_capped_per_host_and_per_aggregator_and_given_back() {
        let message = RulesSnapshot::parse(3, RULES, "rules.yaml")
            .unwrap()
            .message();
        let caps = Caps::new(3, 5);
        let mut a = Instance::with_caps(id(), Some(&message), at(0), caps.clone());
        let mut b = Instance::with_caps(id(), Some(&message), at(0), caps.clone());
        let routes = |from: usize, n: usize| -> Vec<String> {
            (from..from + n).map(|i| format!("r{i}")).collect()
        };
        a.on_usage(1, at(1), &usage(&routes(0, 2), 1, 0)).unwrap();
        // The host's third bucket id on another stream is its last.
        a.on_usage(2, at(1), &usage(&routes(2, 1), 1, 0)).unwrap();
        let host = a.on_usage(2, at(1), &usage(&routes(3, 1), 1, 0));
        assert_eq!(
            host,
            Err(BadUsage::TooManyBuckets {
                scope: QuotaScope::Host,
                max: 3
            })
        );
        // Two left of the aggregator's five.
        b.on_usage(1, at(1), &usage(&routes(10, 2), 1, 0)).unwrap();
        let total = b.on_usage(1, at(1), &usage(&routes(12, 1), 1, 0));
        assert_eq!(
            total,
            Err(BadUsage::TooManyBuckets {
                scope: QuotaScope::Aggregator,
                max: 5
            })
        );
        assert_eq!(caps.held.load(Ordering::Relaxed), 5);
        // A closed stream and a dropped host give theirs back.
        a.close_stream(at(2), 1);
        assert_eq!(caps.held.load(Ordering::Relaxed), 3);
        drop(b);
        assert_eq!(caps.held.load(Ordering::Relaxed), 1);
        // A bucket id's size is capped too.
        let long = "x".repeat(MAX_BUCKET_ID_BYTES);
        assert_eq!(
            a.on_usage(2, at(3), &usage(&[long], 1, 0)),
            Err(BadUsage::BucketIdTooLong {
                index: 0,
                bytes: MAX_BUCKET_ID_BYTES + 5
            })
        );
    }
}
