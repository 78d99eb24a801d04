//! The compiled rule snapshot: the configuration, its matcher and one limiter per bucket,
//! immutable once built and swapped whole on a reload.

use std::cell::RefCell;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderName;
use spillway_core::algo::{AdaptiveTokenBucket, DropRatio, Limiter, Rate};
use spillway_core::clock::Nanos;
use spillway_core::config::{self, Algorithm, Bucket, Config, Cost, FailurePolicy, StateStore};
use spillway_core::counters::{BucketCounters, Outcome};
use spillway_core::criticality::Criticality;
use spillway_core::decision::{BucketId, Decision, Mode, Verdict};
use spillway_core::descriptor::DescriptorMatcher;
use spillway_core::limit::Limit;
use spillway_core::matcher::{Matcher, Matches};
use spillway_core::pattern::{RequestAttrs, SubjectValue};

use crate::budget::{BudgetCharge, BudgetCharges, ResponseCost, SettledIn};
use crate::error::ClientError;
use crate::identity::{Headers, IdentityExtractor};
use crate::state::{BucketState, BudgetCounters, Limiters, SubjectDebts};
use crate::store::{ExactBucket, ExactStore, RedisKey};
use crate::subjects::SubjectMap;

/// How a request's cost is found.
#[derive(Debug, Clone)]
enum CompiledCost {
    Fixed(u64),
    Header(HeaderName, u64),
    /// Reported by the response; the request reserves the estimate.
    Response(Arc<ResponseCost>),
}

/// One bucket of the snapshot.
#[derive(Debug)]
pub struct CompiledBucket {
    service: Arc<str>,
    bucket: Bucket,
    mode: Mode,
    /// A candidate's twin: counted, but never part of the request's decision.
    trial: bool,
    cost: CompiledCost,
    /// The limit as the algorithms read it.
    pub(crate) rate: Rate,
    /// The descriptor buckets this one replaces (envoyproxy/ratelimit's `replaces`).
    pub(crate) replaces: Box<[BucketId]>,
    pub(crate) state: Arc<BucketState>,
    pub(crate) counters: Arc<BucketCounters>,
}

impl CompiledBucket {
    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn name(&self) -> &str {
        &self.bucket.name
    }

    /// The bucket as configured.
    pub fn config(&self) -> &Bucket {
        &self.bucket
    }

    pub fn limit(&self) -> Limit {
        self.bucket.limit
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn algorithm(&self) -> Algorithm {
        self.bucket.algorithm
    }

    fn cost<H: Headers + ?Sized>(&self, headers: &H) -> u64 {
        match &self.cost {
            CompiledCost::Fixed(n) => *n,
            CompiledCost::Header(name, default) => headers
                .header(name)
                .and_then(|v| v.trim().parse::<NonZeroU64>().ok())
                .map_or(*default, NonZeroU64::get),
            CompiledCost::Response(cost) => cost.estimate.max(1),
        }
    }

    /// The bucket's response cost, when the response reports it (a token budget).
    pub fn response_cost(&self) -> Option<&ResponseCost> {
        match &self.cost {
            CompiledCost::Response(cost) => Some(cost),
            _ => None,
        }
    }

    /// A token budget's settled costs (zero for other buckets).
    pub fn budget(&self) -> &BudgetCounters {
        &self.state.budget
    }

    fn verdict(&self, now: Nanos, attrs: &RequestAttrs<'_>, cost: u64) -> Verdict {
        match &self.state.limiters {
            Limiters::Shared(limiter) => limiter.decide_tier(now, cost, attrs.criticality),
            Limiters::PerSubject(kind, map) => match attrs.subject(*kind) {
                Some(value) => map.decide(value, now, cost),
                // The matcher only returns a `*` bucket for requests that carry the subject.
                None => Verdict::Allow,
            },
            // Decided by `Rules::finish`; `decide_with` never asks a Redis bucket for a verdict.
            Limiters::Exact(_) => Verdict::Allow,
            // Only Envoy's descriptors reach these (`Rules::decide_descriptor`).
            Limiters::PerValue(_) => Verdict::Allow,
        }
    }

    /// The bucket's `on_store_failure`.
    pub fn on_store_failure(&self) -> FailurePolicy {
        self.bucket.on_store_failure
    }

    /// Counts `verdict` of a request of `tier` and turns it into this bucket's decision (always
    /// `Allow` for a candidate's twin, whose drops are only counted).
    pub(crate) fn record_tier(
        &self,
        id: BucketId,
        verdict: Verdict,
        tier: Criticality,
    ) -> Decision {
        self.record_tier_n(id, verdict, tier, (1, false))
    }

    /// [`CompiledBucket::record_tier`] counting `n` (nothing when 0): a budget of the control
    /// plane counts in tokens (`tokens`: `n` is one request's cost, counted with its square),
    /// a request it forwards only when its response settles.
    fn record_tier_n(
        &self,
        id: BucketId,
        verdict: Verdict,
        tier: Criticality,
        (n, tokens): (u64, bool),
    ) -> Decision {
        let outcome = Outcome::of(verdict, self.mode);
        match (n, tokens) {
            (0, _) => {}
            (_, false) => self.counters.record_tier(tier, outcome, n),
            (_, true) => self.counters.record_cost_tier(tier, outcome, n),
        }
        if self.trial {
            return Decision::Allow;
        }
        verdict.into_decision(id, self.mode)
    }

    /// Subjects held, for per-subject buckets.
    pub fn subjects(&self) -> Option<usize> {
        match &self.state.limiters {
            Limiters::PerSubject(_, map) | Limiters::PerValue(map) => Some(map.len()),
            _ => None,
        }
    }

    /// How long a subject of a per-subject bucket stays idle before it is evicted.
    pub fn subject_idle(&self) -> Option<std::time::Duration> {
        match &self.state.limiters {
            Limiters::PerSubject(_, map) | Limiters::PerValue(map) => {
                Some(std::time::Duration::from_nanos(map.idle_ns()))
            }
            _ => None,
        }
    }

    /// Subjects admitted without a limiter because the bucket's map was full.
    pub fn subject_overflow(&self) -> u64 {
        match &self.state.limiters {
            Limiters::PerSubject(_, map) | Limiters::PerValue(map) => map.overflow(),
            _ => 0,
        }
    }
}

/// The immutable compiled rules. Share it by `Arc`; decide from any number of threads.
#[derive(Debug)]
pub struct Rules {
    version: u64,
    config: Arc<Config>,
    identity: IdentityExtractor,
    matcher: Matcher,
    /// The descriptor buckets, by domain.
    pub(crate) descriptors: DescriptorMatcher,
    pub(crate) buckets: Box<[CompiledBucket]>,
    /// The Redis of `store: redis` buckets, kept across reloads that leave `redis` unchanged so
    /// its connection and circuit breaker survive them. Always `None` without the `redis` feature.
    pub(crate) store: Option<Arc<ExactStore>>,
}

/// A decision that is complete, or that still needs Redis for its `store: redis` buckets.
///
/// The same with and without the `redis` feature, so callers match it without a `cfg`; without
/// the feature, rules with `store: redis` buckets never load and `Redis` is never produced.
#[derive(Debug)]
pub enum Step {
    /// Every bucket the request matched was decided in memory.
    Done(Decision),
    /// The request matched `store: redis` buckets: finish it with [`Rules::finish`].
    Redis(RedisChecks),
}

/// The `store: redis` buckets a request still has to pass, and what the in-memory ones said.
#[derive(Debug)]
pub struct RedisChecks {
    local: Decision,
    checks: Vec<Check>,
    /// The request's tier, which each bucket counts it in.
    tier: Criticality,
}

#[derive(Debug)]
struct Check {
    id: BucketId,
    /// The key of a per-subject bucket, which holds the request's subject value; `None` for a
    /// bucket with one key, which the bucket keeps.
    key: Option<RedisKey>,
    cost: u64,
}

thread_local! {
    // Reused by every decision of this thread, so matching allocates only until the buffer has
    // grown to the largest match set once.
    static MATCHES: RefCell<Matches> = RefCell::new(Matches::new());
}

fn same_definition(a: &Bucket, b: &Bucket) -> bool {
    a.match_spec == b.match_spec
        && a.limit == b.limit
        && a.burst == b.burst
        && a.burst_window == b.burst_window
        && a.algorithm == b.algorithm
        && a.store == b.store
        && a.batch == b.batch
        && a.descriptor == b.descriptor
}

impl Rules {
    /// Compiles `config` as version `version`, reusing the state and counters of `previous`'s
    /// buckets whose definition did not change.
    pub(crate) fn compile(
        config: Config,
        version: u64,
        previous: Option<&Rules>,
        max_subjects: usize,
    ) -> Result<Self, ClientError> {
        let store = ExactStore::for_config(&config, previous.and_then(|p| p.store.as_ref()))?;
        let mut buckets = Vec::new();
        for service in &config.services {
            let service_name: Arc<str> = service.name.as_str().into();
            let start = buckets.len();
            for bucket in &service.buckets {
                let old = previous.and_then(|p| p.find(&service.name, &bucket.name));
                let state = match old {
                    Some(old) if same_definition(&old.bucket, bucket) => old.state.clone(),
                    _ => {
                        let limiters = build(&service.name, bucket, max_subjects)?;
                        // A per-subject token budget in Redis keeps which subjects are in debt.
                        let subject_debts = (matches!(bucket.cost, Cost::Response(_))
                            && matches!(&limiters, Limiters::Exact(e) if e.subject().is_some()))
                        .then(|| Box::new(SubjectDebts::new()));
                        Arc::new(BucketState {
                            limiters,
                            instruction_expires: AtomicU64::new(0),
                            budget: BudgetCounters::default(),
                            owed_until: AtomicU64::new(0),
                            subject_debts,
                        })
                    }
                };
                let counters = old.map_or_else(Default::default, |old| old.counters.clone());
                let rate = bucket.limit.rate().map_err(|source| ClientError::Bucket {
                    service: service.name.clone(),
                    bucket: bucket.name.clone(),
                    source,
                })?;
                // Validation made every name a descriptor bucket of this service.
                let replaces = bucket
                    .descriptor
                    .iter()
                    .flat_map(|d| d.replaces.iter())
                    .filter_map(|name| {
                        service
                            .buckets
                            .iter()
                            .position(|b| *b.name == **name)
                            .map(|at| BucketId(u32::try_from(start + at).unwrap_or(u32::MAX)))
                    })
                    .collect();
                buckets.push(CompiledBucket {
                    service: service_name.clone(),
                    bucket: bucket.clone(),
                    mode: bucket.mode,
                    trial: bucket.is_candidate(),
                    cost: match &bucket.cost {
                        Cost::Fixed(n) => CompiledCost::Fixed(n.get()),
                        Cost::Header(h) => match HeaderName::from_bytes(h.header.as_bytes()) {
                            Ok(name) => CompiledCost::Header(name, h.default.get()),
                            Err(_) => CompiledCost::Fixed(h.default.get()),
                        },
                        Cost::Response(r) => match ResponseCost::compile(
                            service_name.clone(),
                            &bucket.name,
                            bucket.limit,
                            bucket.holds(),
                            r,
                            (bucket.store == StateStore::ControlPlane
                                && bucket.algorithm == Algorithm::DropRatio)
                                .then(|| counters.clone()),
                            SettledIn {
                                state: state.clone(),
                                store: store.clone(),
                            },
                        ) {
                            Some(cost) => CompiledCost::Response(Arc::new(cost)),
                            None => CompiledCost::Fixed(r.fallback()),
                        },
                    },
                    rate,
                    replaces,
                    state,
                    counters,
                });
            }
        }
        let matcher = Matcher::compile_some(buckets.iter().map(|b| {
            b.bucket
                .descriptor
                .is_none()
                .then_some(&b.bucket.match_spec)
        }));
        let descriptors =
            DescriptorMatcher::compile(buckets.iter().enumerate().filter_map(|(i, b)| {
                let id = BucketId(u32::try_from(i).ok()?);
                b.bucket.descriptor.as_ref().map(|d| (id, d))
            }));
        Ok(Self {
            version,
            identity: IdentityExtractor::new(&config.identity),
            config: Arc::new(config),
            matcher,
            descriptors,
            buckets: buckets.into(),
            store,
        })
    }

    /// Counts up by one with every successful load.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The configuration, shared: the same `Arc` for as long as these rules are in force.
    pub fn shared_config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn identity(&self) -> &IdentityExtractor {
        &self.identity
    }

    pub fn buckets(&self) -> &[CompiledBucket] {
        &self.buckets
    }

    /// The bucket a decision names.
    pub fn bucket(&self, id: BucketId) -> Option<&CompiledBucket> {
        self.buckets.get(id.index())
    }

    /// The bucket `name` of `service`.
    pub fn find(&self, service: &str, name: &str) -> Option<&CompiledBucket> {
        self.buckets
            .iter()
            .find(|b| &*b.service == service && b.bucket.name == name)
    }

    /// Decides a request at `now` against every bucket it matches: dropped if any enforcing
    /// bucket drops it, shadow-dropped (forwarded, counted as a virtual drop) if only shadow
    /// buckets would. Every matching bucket counts the request.
    ///
    /// This never waits, so it cannot ask Redis: a request that matches a `store: redis` bucket
    /// is decided there by the bucket's `on_store_failure`, as if Redis were down. Use
    /// [`Rules::begin`] and [`Rules::finish`] (or [`crate::Client::decide_async`]) to decide
    /// such buckets exactly.
    pub fn decide<H: Headers + ?Sized>(
        &self,
        now: Nanos,
        attrs: &RequestAttrs<'_>,
        headers: &H,
    ) -> Decision {
        match self.begin(now, attrs, headers) {
            Step::Done(decision) => decision,
            Step::Redis(pending) => {
                let mut decision = pending.local;
                for check in pending.checks {
                    let bucket = &self.buckets[check.id.index()];
                    let verdict = match &self.store {
                        Some(store) => store.policy_verdict(bucket.on_store_failure()),
                        None => Verdict::Allow,
                    };
                    decision =
                        decision.combine(bucket.record_tier(check.id, verdict, pending.tier));
                }
                decision
            }
        }
    }

    /// Decides a request at `now` against every in-memory bucket it matches, and returns either
    /// the decision or the `store: redis` buckets it still has to pass. Allocates nothing unless
    /// the request matches a `store: redis` bucket.
    ///
    /// Buckets are charged in order, and one that admits is not refunded when a later one drops:
    /// the overlap is usually a broad bucket and a narrow one, and the broad one then counts
    /// traffic that was offered to it, which is what the control plane wants to see.
    ///
    /// A token budget (a bucket whose response reports its cost) is admitted here and its
    /// charge dropped, so only its estimate is ever taken; use [`Rules::begin_charged`] to
    /// settle what the response reports.
    pub fn begin<H: Headers + ?Sized>(
        &self,
        now: Nanos,
        attrs: &RequestAttrs<'_>,
        headers: &H,
    ) -> Step {
        self.begin_charged(now, attrs, headers, &mut BudgetCharges::new())
    }

    /// Like [`Rules::begin`], and adds to `charges` each token budget the request was admitted
    /// against (or forwarded past in shadow mode), for the caller to settle with the cost its
    /// response reports ([`BudgetCharge::settle`]), or to cancel if the request is not forwarded
    /// after all. A budget in `store: redis` costs no Redis call here: it is refused only while
    /// the last settlement on this proxy found the shared bucket in debt.
    pub fn begin_charged<H: Headers + ?Sized>(
        &self,
        now: Nanos,
        attrs: &RequestAttrs<'_>,
        headers: &H,
        charges: &mut BudgetCharges,
    ) -> Step {
        MATCHES.with(|cell| match cell.try_borrow_mut() {
            Ok(mut matches) => self.decide_with(now, attrs, headers, &mut matches, charges),
            // Only reachable if a decision re-entered itself; a fresh buffer keeps it correct.
            Err(_) => self.decide_with(now, attrs, headers, &mut Matches::new(), charges),
        })
    }

    /// Asks Redis for each `store: redis` bucket of `pending`, through the store's circuit
    /// breaker; a bucket whose Redis cannot answer in time is decided by its
    /// `on_store_failure`. Every such bucket counts the request.
    pub async fn finish(&self, pending: RedisChecks) -> Decision {
        let mut decision = pending.local;
        for check in pending.checks {
            let bucket = &self.buckets[check.id.index()];
            let verdict = match (&self.store, &bucket.state.limiters) {
                (Some(store), Limiters::Exact(exact)) => {
                    store
                        .decide(
                            exact,
                            check.key.as_ref(),
                            check.cost,
                            bucket.on_store_failure(),
                        )
                        .await
                }
                // `compile` gives every `store: redis` bucket an exact limiter and a store.
                _ => Verdict::Allow,
            };
            decision = decision.combine(bucket.record_tier(check.id, verdict, pending.tier));
        }
        decision
    }

    fn decide_with<H: Headers + ?Sized>(
        &self,
        now: Nanos,
        attrs: &RequestAttrs<'_>,
        headers: &H,
        matches: &mut Matches,
        charges: &mut BudgetCharges,
    ) -> Step {
        self.matcher.find(attrs, matches);
        let mut decision = Decision::Allow;
        let mut checks = Vec::new();
        for id in matches.iter() {
            let bucket = &self.buckets[id.index()];
            if let CompiledCost::Response(cost) = &bucket.cost {
                let Some((verdict, charge)) = self.admit_owing(bucket, cost, now, attrs) else {
                    continue;
                };
                let forwarded = verdict.is_allow() || bucket.mode == Mode::Shadow || bucket.trial;
                // Counted in requests, or in tokens for a budget of the control plane: what it
                // forwards at its cost when the response settles, what it drops now at the
                // mean cost.
                let counted = match (&cost.tokens, forwarded) {
                    (None, _) => 1,
                    (Some(_), true) => 0,
                    (Some(_), false) => cost.dropped_cost(&bucket.state),
                };
                decision = decision.combine(bucket.record_tier_n(
                    id,
                    verdict,
                    attrs.criticality,
                    (counted, cost.tokens.is_some()),
                ));
                if forwarded {
                    charges.push(BudgetCharge {
                        reserved: if verdict.is_allow() {
                            charge.reserved
                        } else {
                            0
                        },
                        ..charge
                    });
                }
                continue;
            }
            if let Limiters::Exact(exact) = &bucket.state.limiters {
                let key = match exact.subject() {
                    None => None,
                    Some(kind) => match attrs.subject(kind) {
                        Some(value) => Some(exact.subject_key(value)),
                        // The matcher only returns a `*` bucket for requests that carry it.
                        None => continue,
                    },
                };
                checks.push(Check {
                    id,
                    key,
                    cost: bucket.cost(headers),
                });
                continue;
            }
            let verdict = bucket.verdict(now, attrs, bucket.cost(headers));
            decision = decision.combine(bucket.record_tier(id, verdict, attrs.criticality));
        }
        if checks.is_empty() {
            Step::Done(decision)
        } else {
            Step::Redis(RedisChecks {
                local: decision,
                checks,
                tier: attrs.criticality,
            })
        }
    }

    /// Admits a request against a token budget: its verdict, and the charge to settle if it
    /// is forwarded. `None` for a per-subject budget the request carries no subject of.
    fn admit_owing(
        &self,
        bucket: &CompiledBucket,
        cost: &Arc<ResponseCost>,
        now: Nanos,
        attrs: &RequestAttrs<'_>,
    ) -> Option<(Verdict, BudgetCharge)> {
        let estimate = cost.estimate;
        let mut subject = None;
        let (verdict, quota) = match &bucket.state.limiters {
            Limiters::Shared(limiter) => (
                match limiter {
                    // A budget of the control plane: dropped by the instructed ratio, by tier.
                    Limiter::DropRatio(_) => limiter.decide_tier(now, 1, attrs.criticality),
                    _ => limiter.admit_owing(now, estimate),
                },
                limiter.quota(now, bucket.rate),
            ),
            Limiters::PerSubject(kind, map) => {
                let value = attrs.subject(*kind)?;
                subject = Some(value.into());
                map.admit_owing_quota(value, now, estimate)
            }
            Limiters::Exact(exact) => {
                let until = match (exact.subject(), &bucket.state.subject_debts) {
                    (Some(kind), Some(debts)) => {
                        let value = attrs.subject(kind)?;
                        let until = debts.until(value, now);
                        subject = Some(value.into());
                        until
                    }
                    _ => bucket.state.owed_until.load(Ordering::Relaxed),
                };
                let verdict = if now < until {
                    Verdict::Deny {
                        retry_after: std::time::Duration::from_nanos(until - now),
                    }
                } else {
                    Verdict::Allow
                };
                let quota = spillway_core::algo::Quota {
                    remaining: if now < until { 0 } else { bucket.rate.count() },
                    reset: std::time::Duration::from_nanos(until.saturating_sub(now)),
                };
                (verdict, quota)
            }
            Limiters::PerValue(_) => return None,
        };
        Some((
            verdict,
            BudgetCharge {
                cost: cost.clone(),
                subject,
                reserved: if matches!(bucket.state.limiters, Limiters::Exact(_)) {
                    0
                } else {
                    estimate
                },
                remaining: quota.remaining,
                reset_ns: u64::try_from(quota.reset.as_nanos()).unwrap_or(u64::MAX),
                tier: attrs.criticality,
                outcome: Outcome::of(verdict, bucket.mode),
            },
        ))
    }

    /// Calls `visit` with each bucket a request with these attributes matches (a candidate's
    /// twin left out), without deciding or counting it: for what a caller counts per bucket
    /// beside the decision, such as the proxy's upgrades. Off the decision path: it allocates.
    pub fn matching(&self, attrs: &RequestAttrs<'_>, mut visit: impl FnMut(&CompiledBucket)) {
        let mut matches = Matches::new();
        self.matcher.find(attrs, &mut matches);
        for id in matches.iter() {
            if let Some(bucket) = self.buckets.get(id.index())
                && !bucket.trial
            {
                visit(bucket);
            }
        }
    }

    /// Evicts idle subjects where a sweep is due; returns how many.
    pub(crate) fn sweep(&self, now: Nanos) -> usize {
        self.buckets
            .iter()
            .map(|b| match &b.state.limiters {
                Limiters::PerSubject(_, map) | Limiters::PerValue(map) => map.maybe_sweep(now),
                _ => 0,
            })
            .sum()
    }
}

fn build(service: &str, bucket: &Bucket, max_subjects: usize) -> Result<Limiters, ClientError> {
    let param = |source| ClientError::Bucket {
        service: service.to_owned(),
        bucket: bucket.name.clone(),
        source,
    };
    let rate = Rate::new(bucket.limit.count.get(), bucket.limit.period).map_err(param)?;
    let burst = bucket.burst.map(NonZeroU64::get);
    if bucket.store == StateStore::Redis {
        return ExactBucket::new(service, bucket, rate, burst).map(Limiters::Exact);
    }
    build_local(bucket, rate, burst, max_subjects).map_err(param)
}

fn build_local(
    bucket: &Bucket,
    rate: Rate,
    burst: Option<u64>,
    max_subjects: usize,
) -> Result<Limiters, spillway_core::algo::ParamError> {
    if let Some(descriptor) = &bucket.descriptor
        && descriptor.is_per_value()
        && let Some(map) = SubjectMap::new(bucket.algorithm, rate, burst, max_subjects)?
    {
        return Ok(Limiters::PerValue(map));
    }
    if let Some(subject) = &bucket.match_spec.subject
        && subject.value == SubjectValue::Each
        && let Some(map) = SubjectMap::new(bucket.algorithm, rate, burst, max_subjects)?
    {
        return Ok(Limiters::PerSubject(subject.kind, map));
    }
    Ok(Limiters::Shared(match bucket.algorithm {
        Algorithm::DropRatio => Limiter::DropRatio(DropRatio::new(rate.period())),
        Algorithm::AdaptiveTokenBucket => {
            let history = bucket
                .burst_window
                .unwrap_or(config::validate::DEFAULT_BURST_WINDOW)
                .as_secs();
            Limiter::AdaptiveTokenBucket(AdaptiveTokenBucket::new(rate, history)?)
        }
        kind => Limiter::new(kind, rate, burst)?,
    }))
}

/// The drop ratio in force at `now` for a drop-ratio bucket (0 without an instruction).
pub(crate) fn drop_ratio(state: &BucketState, now: Nanos) -> Option<f64> {
    match &state.limiters {
        Limiters::Shared(Limiter::DropRatio(d)) => Some(d.current(now).map_or(0.0, |r| r.as_f64())),
        _ => None,
    }
}

/// Counts an instruction's expiry once; true if it expired just now.
pub(crate) fn note_expiry(state: &BucketState, now: Nanos) -> bool {
    let expires = state.instruction_expires.load(Ordering::Relaxed);
    expires != 0
        && now >= expires
        && state
            .instruction_expires
            .compare_exchange(expires, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
