//! The compiled rule snapshot: the configuration, its matcher and one limiter per bucket,
//! immutable once built and swapped whole on a reload.

use std::cell::RefCell;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderName;
use spillway_core::algo::{AdaptiveTokenBucket, DropRatio, Limiter, Rate};
use spillway_core::clock::Nanos;
use spillway_core::config::{self, Algorithm, Bucket, Config, Cost, Store};
use spillway_core::counters::{BucketCounters, Outcome};
use spillway_core::decision::{BucketId, Decision, Mode, Verdict};
use spillway_core::limit::Limit;
use spillway_core::matcher::{Matcher, Matches};
use spillway_core::pattern::{RequestAttrs, SubjectKind, SubjectValue};

use crate::error::ClientError;
use crate::identity::{Headers, Identity};
use crate::subjects::SubjectMap;

/// Where a bucket's state lives: one limiter, or one per subject value.
#[derive(Debug)]
pub(crate) enum Limiters {
    Shared(Limiter),
    PerSubject(SubjectKind, SubjectMap),
    /// `store: redis` buckets are decided by the Redis store, which the proxy does not wire yet;
    /// until it does they admit everything rather than turn our gap into drops.
    External,
}

/// A bucket's state, shared between snapshots while its definition does not change, so a reload
/// that touches one bucket keeps every other bucket's tokens, windows and instructions.
#[derive(Debug)]
pub(crate) struct BucketState {
    pub(crate) limiters: Limiters,
    /// When the current drop-ratio instruction expires (0: none), to count expiries (G9).
    pub(crate) instruction_expires: AtomicU64,
}

/// How a request's cost is found (W3).
#[derive(Debug, Clone)]
enum CompiledCost {
    Fixed(u64),
    Header(HeaderName, u64),
}

/// One bucket of the snapshot.
#[derive(Debug)]
pub struct CompiledBucket {
    service: Arc<str>,
    bucket: Bucket,
    mode: Mode,
    cost: CompiledCost,
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
        }
    }

    fn verdict(&self, now: Nanos, attrs: &RequestAttrs<'_>, cost: u64) -> Verdict {
        match &self.state.limiters {
            Limiters::Shared(limiter) => limiter.decide(now, cost),
            Limiters::PerSubject(kind, map) => match attrs.subject(*kind) {
                Some(value) => map.decide(value, now, cost),
                // The matcher only returns a `*` bucket for requests that carry the subject.
                None => Verdict::Allow,
            },
            Limiters::External => Verdict::Allow,
        }
    }

    /// Subjects held, for per-subject buckets.
    pub fn subjects(&self) -> Option<usize> {
        match &self.state.limiters {
            Limiters::PerSubject(_, map) => Some(map.len()),
            _ => None,
        }
    }

    /// How long a subject of a per-subject bucket stays idle before it is evicted.
    pub fn subject_idle(&self) -> Option<std::time::Duration> {
        match &self.state.limiters {
            Limiters::PerSubject(_, map) => Some(std::time::Duration::from_nanos(map.idle_ns())),
            _ => None,
        }
    }

    /// Subjects admitted without a limiter because the bucket's map was full.
    pub fn subject_overflow(&self) -> u64 {
        match &self.state.limiters {
            Limiters::PerSubject(_, map) => map.overflow(),
            _ => 0,
        }
    }
}

/// The immutable compiled rules. Share it by `Arc`; decide from any number of threads.
#[derive(Debug)]
pub struct Rules {
    version: u64,
    config: Arc<Config>,
    identity: Identity,
    matcher: Matcher,
    buckets: Box<[CompiledBucket]>,
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
        let mut buckets = Vec::new();
        for service in &config.services {
            let service_name: Arc<str> = service.name.as_str().into();
            for bucket in &service.buckets {
                let old = previous.and_then(|p| p.find(&service.name, &bucket.name));
                let state = match old {
                    Some(old) if same_definition(&old.bucket, bucket) => old.state.clone(),
                    _ => Arc::new(BucketState {
                        limiters: build(bucket, max_subjects).map_err(|source| {
                            ClientError::Bucket {
                                service: service.name.clone(),
                                bucket: bucket.name.clone(),
                                source,
                            }
                        })?,
                        instruction_expires: AtomicU64::new(0),
                    }),
                };
                if bucket.store == Store::Redis && old.is_none() {
                    tracing::warn!(
                        service = %service.name,
                        bucket = %bucket.name,
                        "store: redis is not wired into this client yet; the bucket admits everything"
                    );
                }
                let counters = old.map_or_else(Default::default, |old| old.counters.clone());
                buckets.push(CompiledBucket {
                    service: service_name.clone(),
                    bucket: bucket.clone(),
                    mode: bucket.mode,
                    cost: match &bucket.cost {
                        Cost::Fixed(n) => CompiledCost::Fixed(n.get()),
                        Cost::Header(h) => match HeaderName::from_bytes(h.header.as_bytes()) {
                            Ok(name) => CompiledCost::Header(name, h.default.get()),
                            Err(_) => CompiledCost::Fixed(h.default.get()),
                        },
                    },
                    state,
                    counters,
                });
            }
        }
        let matcher = Matcher::compile(buckets.iter().map(|b| &b.bucket.match_spec));
        Ok(Self {
            version,
            identity: Identity::new(&config.identity),
            config: Arc::new(config),
            matcher,
            buckets: buckets.into(),
        })
    }

    /// Counts up by one with every successful load.
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    pub fn buckets(&self) -> &[CompiledBucket] {
        &self.buckets
    }

    /// The bucket a decision names.
    pub fn bucket(&self, id: BucketId) -> Option<&CompiledBucket> {
        self.buckets.get(id.0 as usize)
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
    /// Buckets are charged in order, and one that admits is not refunded when a later one drops:
    /// the overlap is usually a broad bucket and a narrow one, and the broad one then counts
    /// traffic that was offered to it, which is what the control plane wants to see.
    pub fn decide<H: Headers + ?Sized>(
        &self,
        now: Nanos,
        attrs: &RequestAttrs<'_>,
        headers: &H,
    ) -> Decision {
        MATCHES.with(|cell| match cell.try_borrow_mut() {
            Ok(mut matches) => self.decide_with(now, attrs, headers, &mut matches),
            // Only reachable if a decision re-entered itself; a fresh buffer keeps it correct.
            Err(_) => self.decide_with(now, attrs, headers, &mut Matches::new()),
        })
    }

    fn decide_with<H: Headers + ?Sized>(
        &self,
        now: Nanos,
        attrs: &RequestAttrs<'_>,
        headers: &H,
        matches: &mut Matches,
    ) -> Decision {
        self.matcher.find(attrs, matches);
        let mut decision = Decision::Allow;
        for id in matches.iter() {
            let bucket = &self.buckets[id as usize];
            let verdict = bucket.verdict(now, attrs, bucket.cost(headers));
            bucket.counters.record(Outcome::of(verdict, bucket.mode), 1);
            decision = decision.combine(verdict.into_decision(BucketId(id), bucket.mode));
        }
        decision
    }

    /// Evicts idle subjects where a sweep is due; returns how many.
    pub(crate) fn sweep(&self, now: Nanos) -> usize {
        self.buckets
            .iter()
            .map(|b| match &b.state.limiters {
                Limiters::PerSubject(_, map) => map.maybe_sweep(now),
                _ => 0,
            })
            .sum()
    }
}

fn build(
    bucket: &Bucket,
    max_subjects: usize,
) -> Result<Limiters, spillway_core::algo::ParamError> {
    if bucket.store == Store::Redis {
        return Ok(Limiters::External);
    }
    let rate = Rate::new(bucket.limit.count.get(), bucket.limit.period)?;
    let burst = bucket.burst.map(NonZeroU64::get);
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
