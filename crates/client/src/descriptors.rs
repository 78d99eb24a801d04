//! Envoy descriptors: the one bucket that decides a request descriptor, and its
//! decision at a cost (Envoy's `hits_addend`) with what Envoy is told about the limit:
//! `current_limit`, `limit_remaining` and `duration_until_reset`.
//!
//! A decision here is the hot path of `ShouldRateLimit`: finding the bucket walks a tree of
//! hash maps keyed by borrowed strings, and deciding it reads one limiter (or one per counted
//! value, behind the same sharded map as per-subject buckets), so neither allocates nor takes a
//! lock of its own; the key of a bucket with several counted entries is written on the stack.
//! Only a `store: redis` bucket allocates, for its Redis key and the call, as the HTTP path does.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use spillway_core::algo::{Kind, Quota, Rate};
use spillway_core::clock::Nanos;
use spillway_core::config::ResponseSource;
use spillway_core::criticality::Criticality;
use spillway_core::decision::{BucketId, Decision, NEVER, Verdict};
use spillway_core::descriptor::{Answer, DescriptorSpec, Entries};
use spillway_core::limit::Limit;

use crate::rules::{CompiledBucket, Rules};
use crate::state::Limiters;
use crate::store::RedisKey;
use crate::subjects::SUBJECT_VALUE_MAX;

/// `limit_remaining` of an `unlimited` descriptor, as envoyproxy/ratelimit answers it.
pub const UNLIMITED_REMAINING: u64 = u32::MAX as u64;

/// The answer for one request descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// The bucket that decided, `None` for a descriptor that matched none.
    pub bucket: Option<BucketId>,
    /// `Drop` is Envoy's OVER_LIMIT; `ShadowDrop` (a shadow bucket over its limit) is OK.
    pub decision: Decision,
    /// How the bucket answers (`limit` unless it is `unlimited`, `allow` or `over-limit`).
    pub answer: Answer,
    /// The limit to report as `current_limit`: `None` for no bucket, `unlimited` and `allow`.
    pub limit: Option<Limit>,
    /// Units of cost 1 still admitted right after this decision.
    pub remaining: u64,
    /// When the whole limit is free again ([`Quota`]), never before an over-limit answer's
    /// retry-after.
    pub reset: Duration,
}

impl DescriptorStatus {
    /// A descriptor no bucket matched: OK, no limit (envoyproxy/ratelimit's answer).
    pub const UNMATCHED: DescriptorStatus = DescriptorStatus {
        bucket: None,
        decision: Decision::Allow,
        answer: Answer::Allow,
        limit: None,
        remaining: 0,
        reset: Duration::ZERO,
    };

    /// Envoy's OVER_LIMIT: an enforcing bucket denied it.
    pub fn is_over_limit(&self) -> bool {
        matches!(self.decision, Decision::Drop { .. })
    }
}

/// A descriptor decision that is complete, or that still needs Redis.
#[derive(Debug)]
pub enum DescriptorStep {
    Done(DescriptorStatus),
    /// A `store: redis` bucket: finish it with [`Rules::finish_descriptor`].
    Redis(DescriptorCheck),
}

/// A `store: redis` descriptor bucket's pending call.
#[derive(Debug)]
pub struct DescriptorCheck {
    id: BucketId,
    key: Option<RedisKey>,
    cost: u64,
    tier: Criticality,
    /// Envoy's settlement of a token budget: debit `cost`, never refuse.
    settle: bool,
    /// When the call was made, for the settlement's debt.
    at: Nanos,
}

impl Rules {
    /// The bucket that decides the descriptor `entries` of `domain`: the most specific
    /// descriptor bucket in envoyproxy/ratelimit's order (see [`spillway_core::descriptor`]).
    /// Allocates nothing.
    pub fn descriptor_bucket<E: Entries + ?Sized>(
        &self,
        domain: &str,
        entries: &E,
    ) -> Option<BucketId> {
        self.descriptors.find(domain, entries)
    }

    /// Whether any descriptor bucket names `domain`.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.descriptors.has_domain(domain)
    }

    /// The buckets that bucket `id` replaces: when one request's descriptors match both, the
    /// replaced one is not decided (envoyproxy/ratelimit's `replaces`).
    pub fn replaces(&self, id: BucketId) -> &[BucketId] {
        self.buckets.get(id.index()).map_or(&[], |b| &b.replaces)
    }

    /// Decides the descriptor `entries`, which bucket `id` matched ([`Rules::descriptor_bucket`]),
    /// at `now` for `cost` units, and counts it (an `unlimited` or `allow` bucket is never
    /// counted). A descriptor with another number of entries than the bucket's is answered
    /// [`DescriptorStatus::UNMATCHED`]. Allocates nothing unless the bucket is `store: redis`,
    /// which [`Rules::finish_descriptor`] completes.
    pub fn decide_descriptor<E: Entries + ?Sized>(
        &self,
        now: Nanos,
        id: BucketId,
        entries: &E,
        cost: u64,
    ) -> DescriptorStep {
        self.decide_descriptor_tier(now, id, entries, cost, Criticality::default())
    }

    /// [`Rules::decide_descriptor`] for a request of criticality `tier` (a drop-ratio bucket
    /// drops by it, every bucket counts by it): the tier of a descriptor's
    /// [`spillway_core::descriptor::CRITICALITY_KEY`] entry, read with
    /// [`crate::IdentityExtractor::criticality_of`].
    pub fn decide_descriptor_tier<E: Entries + ?Sized>(
        &self,
        now: Nanos,
        id: BucketId,
        entries: &E,
        cost: u64,
        tier: Criticality,
    ) -> DescriptorStep {
        let Some((bucket, spec)) = self.compiled_descriptor(id) else {
            return DescriptorStep::Done(DescriptorStatus::UNMATCHED);
        };
        // A descriptor of another shape than the bucket's has no value for some counted entry:
        // the bucket did not match it.
        if entries.len() != spec.entries.len() {
            return DescriptorStep::Done(DescriptorStatus::UNMATCHED);
        }
        let status = |decision, limit, remaining, reset| DescriptorStatus {
            bucket: Some(id),
            decision,
            answer: spec.answer,
            limit,
            remaining,
            reset,
        };
        match spec.answer {
            Answer::Limit => {}
            // Neither is counted (envoyproxy/ratelimit never passes them to its cache): their
            // traffic is no offered load of the bucket, which the control plane would otherwise
            // see far over a limit that does not apply.
            Answer::Allow => {
                return DescriptorStep::Done(status(Decision::Allow, None, 0, Duration::ZERO));
            }
            Answer::Unlimited => {
                return DescriptorStep::Done(status(
                    Decision::Allow,
                    None,
                    UNLIMITED_REMAINING,
                    Duration::ZERO,
                ));
            }
            Answer::OverLimit => {
                // The end of the limit's current window, as a window of that unit would reset.
                let period = bucket.rate.period_ns();
                let reset = Duration::from_nanos(period - now % period);
                let decision = bucket.record_tier(id, Verdict::Deny { retry_after: reset }, tier);
                let limit = Some(bucket.limit());
                return DescriptorStep::Done(status(decision, limit, 0, reset));
            }
        }
        if bucket.response_cost().is_some() {
            return DescriptorStep::Done(admit_budget(bucket, id, spec, entries, now, tier));
        }
        match &bucket.state.limiters {
            Limiters::Shared(limiter) => {
                let verdict = limiter.decide_tier(now, cost, tier);
                let quota = limiter.quota(now, bucket.rate);
                DescriptorStep::Done(answer(bucket, id, spec, verdict, quota, tier))
            }
            Limiters::PerValue(map) => {
                let (verdict, quota) =
                    with_counted_key(spec, entries, |key| map.decide_quota(key, now, cost));
                DescriptorStep::Done(answer(bucket, id, spec, verdict, quota, tier))
            }
            Limiters::Exact(exact) => {
                let key = exact
                    .per_value()
                    .then(|| with_counted_key(spec, entries, |key| exact.subject_key(key)));
                DescriptorStep::Redis(DescriptorCheck {
                    id,
                    key,
                    cost,
                    tier,
                    settle: false,
                    at: now,
                })
            }
            // Validation gives a descriptor bucket no subject.
            Limiters::PerSubject(..) => DescriptorStep::Done(DescriptorStatus::UNMATCHED),
        }
    }

    /// Whether bucket `id` is a token budget that Envoy charges when the response ends
    /// (`cost: { response: hits_addend }`): a descriptor of it that carries a `hits_addend` is
    /// a settlement ([`Rules::settle_descriptor`]), one without is an admission.
    pub fn settled_by_envoy(&self, id: BucketId) -> bool {
        self.buckets
            .get(id.index())
            .and_then(CompiledBucket::response_cost)
            .is_some_and(|cost| *cost.source() == ResponseSource::HitsAddend)
    }

    /// Envoy's call at the end of a response (its `apply_on_stream_done` rate limit) for the
    /// descriptor `entries` of bucket `id`, a token budget: debits `cost` units whatever the
    /// bucket holds, so it may go into debt that later admissions pay, and never refuses. Counted
    /// in the budget's debited units, not as a request. A `store: redis` bucket is debited by
    /// [`Rules::finish_descriptor`] (one call); a local one allocates nothing.
    pub fn settle_descriptor<E: Entries + ?Sized>(
        &self,
        now: Nanos,
        id: BucketId,
        entries: &E,
        cost: u64,
    ) -> DescriptorStep {
        let Some((bucket, spec)) = self.compiled_descriptor(id) else {
            return DescriptorStep::Done(DescriptorStatus::UNMATCHED);
        };
        if entries.len() != spec.entries.len() || spec.answer != Answer::Limit {
            return DescriptorStep::Done(DescriptorStatus::UNMATCHED);
        }
        let quota = match &bucket.state.limiters {
            Limiters::Shared(limiter) => {
                limiter.settle(now, 0, cost);
                limiter.quota(now, bucket.rate)
            }
            Limiters::PerValue(map) => {
                with_counted_key(spec, entries, |key| map.settle_quota(key, now, cost))
            }
            Limiters::Exact(_) => {
                return DescriptorStep::Redis(DescriptorCheck {
                    id,
                    key: None,
                    cost,
                    tier: Criticality::default(),
                    settle: true,
                    at: now,
                });
            }
            Limiters::PerSubject(..) => return DescriptorStep::Done(DescriptorStatus::UNMATCHED),
        };
        bucket.state.budget.settle(cost, false);
        DescriptorStep::Done(settled(bucket, id, spec, quota))
    }

    /// Asks Redis for a `store: redis` descriptor bucket, through the store's circuit breaker;
    /// when Redis cannot answer in time, the bucket's `on_store_failure` decides. Counts it.
    pub async fn finish_descriptor(&self, check: DescriptorCheck) -> DescriptorStatus {
        let Some((bucket, spec)) = self.compiled_descriptor(check.id) else {
            return DescriptorStatus::UNMATCHED;
        };
        if check.settle {
            return self.finish_settlement(bucket, check, spec).await;
        }
        let (verdict, remaining, kind) = match (&self.store, &bucket.state.limiters) {
            (Some(store), Limiters::Exact(exact)) => {
                let (verdict, remaining) = store
                    .decide_remaining(
                        exact,
                        check.key.as_ref(),
                        check.cost,
                        bucket.on_store_failure(),
                    )
                    .await;
                (verdict, remaining, exact.kind_rate().0)
            }
            // `compile` gives every `store: redis` bucket an exact limiter and a store.
            _ => (Verdict::Allow, None, bucket.algorithm()),
        };
        let burst = bucket.config().burst.map(|b| b.get());
        let full = full_units(kind, bucket.rate, burst);
        let remaining = remaining.unwrap_or(if verdict.is_allow() { full } else { 0 });
        let quota = Quota {
            remaining,
            reset: redis_reset(kind, bucket.rate, full, remaining, unix_now()),
        };
        answer(bucket, check.id, spec, verdict, quota, check.tier)
    }
}

impl Rules {
    /// Bucket `id` and its descriptor, when it is a descriptor bucket of these rules.
    fn compiled_descriptor(&self, id: BucketId) -> Option<(&CompiledBucket, &DescriptorSpec)> {
        let bucket = self.buckets.get(id.index())?;
        Some((bucket, bucket.config().descriptor.as_ref()?))
    }

    /// Debits a `store: redis` budget in Redis (one script call) and keeps how long it is in
    /// debt, which this process's admissions honour without asking Redis. A debit Redis cannot
    /// take is held and carried by the bucket's next one, as the HTTP path's is.
    async fn finish_settlement(
        &self,
        bucket: &CompiledBucket,
        check: DescriptorCheck,
        spec: &DescriptorSpec,
    ) -> DescriptorStatus {
        #[cfg(feature = "redis")]
        if let (Some(store), Limiters::Exact(exact)) = (&self.store, &bucket.state.limiters) {
            let unsent = &bucket.state.budget.unsent;
            let cost = check.cost.saturating_add(unsent.swap(0, Ordering::Relaxed));
            match store.debit(exact, None, cost).await {
                Some(owed) => {
                    let until = check
                        .at
                        .saturating_add(u64::try_from(owed.as_nanos()).unwrap_or(u64::MAX));
                    bucket
                        .state
                        .owed_until
                        .store(if owed.is_zero() { 0 } else { until }, Ordering::Relaxed);
                }
                None => {
                    unsent.fetch_add(cost, Ordering::Relaxed);
                }
            }
        }
        bucket.state.budget.settle(check.cost, false);
        settled(bucket, check.id, spec, exact_quota(bucket, check.at))
    }
}

/// Admits a descriptor of a token budget while the bucket is not in debt; it takes nothing,
/// the settlement charges what the response used. Counts it.
fn admit_budget<E: Entries + ?Sized>(
    bucket: &CompiledBucket,
    id: BucketId,
    spec: &DescriptorSpec,
    entries: &E,
    now: Nanos,
    tier: Criticality,
) -> DescriptorStatus {
    let (verdict, quota) = match &bucket.state.limiters {
        Limiters::Shared(limiter) => (limiter.admit_owing(now, 0), limiter.quota(now, bucket.rate)),
        Limiters::PerValue(map) => {
            with_counted_key(spec, entries, |key| map.admit_owing_quota(key, now, 0))
        }
        Limiters::Exact(_) => {
            let quota = exact_quota(bucket, now);
            let verdict = if quota.remaining == 0 {
                Verdict::Deny {
                    retry_after: quota.reset,
                }
            } else {
                Verdict::Allow
            };
            (verdict, quota)
        }
        Limiters::PerSubject(..) => return DescriptorStatus::UNMATCHED,
    };
    answer(bucket, id, spec, verdict, quota, tier)
}

/// What a `store: redis` budget holds as this process knows it: nothing while in the debt its
/// last debit reported, else its whole limit.
fn exact_quota(bucket: &CompiledBucket, now: Nanos) -> Quota {
    let until = bucket.state.owed_until.load(Ordering::Relaxed);
    Quota {
        remaining: if now < until { 0 } else { bucket.rate.count() },
        reset: Duration::from_nanos(until.saturating_sub(now)),
    }
}

/// The answer to a settlement: OK, whatever the bucket holds after it.
fn settled(
    bucket: &CompiledBucket,
    id: BucketId,
    spec: &DescriptorSpec,
    quota: Quota,
) -> DescriptorStatus {
    DescriptorStatus {
        bucket: Some(id),
        decision: Decision::Allow,
        answer: spec.answer,
        limit: Some(bucket.limit()),
        remaining: quota.remaining,
        reset: quota.reset,
    }
}

/// Counts the verdict and builds the status.
fn answer(
    bucket: &CompiledBucket,
    id: BucketId,
    spec: &DescriptorSpec,
    verdict: Verdict,
    quota: Quota,
    tier: Criticality,
) -> DescriptorStatus {
    let decision = bucket.record_tier(id, verdict, tier);
    let reset = match verdict {
        Verdict::Deny { retry_after } if retry_after != NEVER => quota.reset.max(retry_after),
        _ => quota.reset,
    };
    DescriptorStatus {
        bucket: Some(id),
        decision,
        answer: spec.answer,
        limit: Some(bucket.limit()),
        remaining: quota.remaining,
        reset,
    }
}

/// The units of cost 1 a Redis bucket of `kind` admits when nothing is used: the burst of a token
/// bucket and of GCRA, one more than the backlog a leaky bucket tolerates (a request is admitted
/// while the backlog in front of it is within the burst), the count of a window.
fn full_units(kind: Kind, rate: Rate, burst: Option<u64>) -> u64 {
    match kind {
        Kind::TokenBucket | Kind::Gcra => burst.unwrap_or(rate.count()),
        Kind::LeakyBucket => burst.unwrap_or(0).saturating_add(1),
        _ => rate.count(),
    }
}

/// Nanoseconds since the Unix epoch, the time Redis's windows are aligned on.
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// When a Redis bucket's whole limit is free again, from what its script said is left of `full`
/// ([`full_units`]) at `unix_now`. Redis's windows are aligned on the Unix epoch (as
/// envoyproxy/ratelimit's are), so their ends come from the wall clock: a fixed window resets at
/// its end, used or not (as a local one and envoyproxy/ratelimit report it), and a sliding-window
/// counter's count of the current window weighs until the end of the next one. A meter refills
/// its missing units one emission interval each; a sliding log's newest entry leaves it within
/// one period.
fn redis_reset(kind: Kind, rate: Rate, full: u64, remaining: u64, unix_now: u64) -> Duration {
    let period = rate.period_ns();
    let missing = full.saturating_sub(remaining);
    match kind {
        Kind::FixedWindow => Duration::from_nanos(period - unix_now % period),
        _ if missing == 0 => Duration::ZERO,
        Kind::TokenBucket | Kind::Gcra | Kind::LeakyBucket => {
            Duration::from_nanos(missing.saturating_mul(rate.emission_interval_ns()))
        }
        Kind::SlidingWindowCounter => Duration::from_nanos(period - unix_now % period + period),
        _ => rate.period(),
    }
}

/// Calls `f` with the key of the request's counted values (those of the entries without an
/// exact value): the value itself when there is one, else each value as `LEN:VALUE` one after
/// the other, written on the stack, or its SHA-256 in hex when that is longer than 256 bytes (as
/// long subject values are keyed, [`crate::subject_key`]).
fn with_counted_key<E: Entries + ?Sized, T>(
    spec: &DescriptorSpec,
    entries: &E,
    f: impl FnOnce(&str) -> T,
) -> T {
    let counted = spec
        .entries
        .iter()
        .filter(|e| e.value.is_per_value())
        .count();
    if counted <= 1 {
        return f(spec.counted_values(entries).next().unwrap_or(""));
    }
    let mut key = KeyWriter::default();
    for value in spec.counted_values(entries) {
        let mut digits = [0u8; 20];
        key.push(decimal(value.len(), &mut digits));
        key.push(b":");
        key.push(value.as_bytes());
    }
    let mut hex = [0u8; 64];
    f(key.finish(&mut hex))
}

/// A key of at most [`SUBJECT_VALUE_MAX`] bytes on the stack, or the SHA-256 of a longer one.
struct KeyWriter {
    buf: [u8; SUBJECT_VALUE_MAX],
    len: usize,
    hash: Option<Sha256>,
}

impl Default for KeyWriter {
    fn default() -> Self {
        Self {
            buf: [0; SUBJECT_VALUE_MAX],
            len: 0,
            hash: None,
        }
    }
}

impl KeyWriter {
    fn push(&mut self, bytes: &[u8]) {
        if let Some(hash) = &mut self.hash {
            hash.update(bytes);
        } else if let Some(room) = self.buf.get_mut(self.len..self.len + bytes.len()) {
            room.copy_from_slice(bytes);
            self.len += bytes.len();
        } else {
            let mut hash = Sha256::new();
            hash.update(&self.buf[..self.len]);
            hash.update(bytes);
            self.hash = Some(hash);
        }
    }

    fn finish<'a>(&'a self, hex: &'a mut [u8; 64]) -> &'a str {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        match &self.hash {
            // Values are UTF-8 and lengths ASCII, so the text is UTF-8.
            None => std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default(),
            Some(hash) => {
                for (pair, byte) in hex.chunks_exact_mut(2).zip(hash.clone().finalize()) {
                    pair[0] = DIGITS[usize::from(byte >> 4)];
                    pair[1] = DIGITS[usize::from(byte & 0xf)];
                }
                std::str::from_utf8(hex).unwrap_or_default()
            }
        }
    }
}

/// `n` in decimal, written into `digits`.
fn decimal(mut n: usize, digits: &mut [u8; 20]) -> &[u8] {
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &digits[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::descriptor::{EntrySpec, EntryValue};

    fn spec(entries: &[(&str, Option<&str>)]) -> DescriptorSpec {
        DescriptorSpec {
            domain: "d".into(),
            entries: entries
                .iter()
                .map(|(k, v)| EntrySpec {
                    key: (*k).into(),
                    value: EntryValue::new(*v),
                })
                .collect(),
            answer: Answer::Limit,
            replaces: Box::new([]),
        }
    }

    #[test]
    fn redis_buckets_reset_when_their_whole_burst_or_window_is_free() {
        const SEC: u64 = 1_000_000_000;
        let rate = Rate::per_second(10).unwrap();
        let at = 1_700_000_000 * SEC + 250_000_000;
        let reset = |kind, burst, remaining| {
            redis_reset(kind, rate, full_units(kind, rate, burst), remaining, at)
        };
        let ms = Duration::from_millis;
        // A token bucket of 40 at 10/s with 30 left refills its 10 missing tokens in 1 s, and
        // one of 5 that is full resets at once, whatever the count.
        assert_eq!(reset(Kind::TokenBucket, Some(40), 30), ms(1_000));
        assert_eq!(reset(Kind::Gcra, Some(5), 5), ms(0));
        assert_eq!(reset(Kind::Gcra, Some(5), 4), ms(100));
        // A leaky bucket with a burst of 2 admits 3 when its queue is empty.
        assert_eq!(reset(Kind::LeakyBucket, Some(2), 3), ms(0));
        assert_eq!(reset(Kind::LeakyBucket, Some(2), 0), ms(300));
        // Windows of one second aligned on the epoch, 250 ms into the current one.
        assert_eq!(reset(Kind::FixedWindow, None, 10), ms(750));
        assert_eq!(reset(Kind::FixedWindow, None, 4), ms(750));
        assert_eq!(reset(Kind::SlidingWindowCounter, None, 4), ms(1_750));
        assert_eq!(reset(Kind::SlidingWindowCounter, None, 10), ms(0));
        assert_eq!(reset(Kind::SlidingWindowLog, None, 4), ms(1_000));
    }

    #[test]
    fn counted_values_key_their_bucket_unambiguously() {
        let one = spec(&[("a", Some("x")), ("b", None)]);
        with_counted_key(&one, &[("a", "x"), ("b", "v")][..], |k| assert_eq!(k, "v"));
        let two = spec(&[("a", None), ("b", None)]);
        with_counted_key(&two, &[("a", "1:2"), ("b", "3")][..], |k| {
            assert_eq!(k, "3:1:21:3")
        });
        with_counted_key(&two, &[("a", "1"), ("b", "2:3")][..], |k| {
            assert_eq!(k, "1:13:2:3")
        });
        let long = "v".repeat(300);
        with_counted_key(&two, &[("a", long.as_str()), ("b", "x")][..], |k| {
            assert_eq!(k.len(), 64)
        });
        assert_eq!(decimal(0, &mut [0; 20]), b"0");
        assert_eq!(decimal(1234, &mut [0; 20]), b"1234");
    }
}
