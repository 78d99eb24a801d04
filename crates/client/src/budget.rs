//! Token budgets: buckets whose cost the response reports when it ends. A request is admitted
//! against them while they are not in debt (reserving an estimate when one is configured), and
//! leaves a [`BudgetCharge`] per such bucket that the caller settles with what the response reported.

use std::collections::BTreeMap;
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::atomic::Ordering;
use std::time::Duration;

use spillway_core::algo::Quota;
use spillway_core::clock::Nanos;
use spillway_core::config::{CostResponse, ResponseSource};
use spillway_core::counters::{BucketCounters, Outcome};
use spillway_core::criticality::Criticality;
use spillway_core::limit::Limit;

pub use crate::state::BudgetCounters;
use crate::state::{BucketState, Limiters};

/// A bucket's response cost, compiled once per snapshot.
#[derive(Debug)]
pub struct ResponseCost {
    pub(crate) service: Arc<str>,
    pub(crate) bucket: Arc<str>,
    pub(crate) limit: Limit,
    pub(crate) source: ResponseSource,
    /// The fields of the object the source names and their weights; empty: the source names
    /// the cost itself.
    pub(crate) weights: Box<[(String, u64)]>,
    pub(crate) estimate: u64,
    pub(crate) fallback: u64,
    /// A budget of the control plane (`store: control-plane`): the bucket's counters, which
    /// count tokens rather than requests, so that what the hosts report is tokens offered and
    /// admitted. A request admitted is counted when it settles, at its cost; one dropped at
    /// once, at the mean cost of those settled ([`ResponseCost::dropped_cost`]). Each with its
    /// square (`BucketCounters::record_cost_tier`), so the reports carry the spread of the
    /// tokens offered.
    pub(crate) tokens: Option<Arc<BucketCounters>>,
    /// The bucket's state, which a charge settles. Held here, so that a charge holds the bucket
    /// by one reference count rather than one per part, and a reload while a response streams
    /// still settles the state the request was admitted by.
    pub(crate) state: Arc<BucketState>,
    /// The Redis of a `store: redis` budget, which its charges settle in.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) store: Option<Arc<crate::store::ExactStore>>,
}

/// Where a budget's charges settle: its bucket's state and the snapshot's Redis.
pub(crate) struct SettledIn {
    pub(crate) state: Arc<BucketState>,
    pub(crate) store: Option<Arc<crate::store::ExactStore>>,
}

impl ResponseCost {
    pub(crate) fn compile(
        service: Arc<str>,
        bucket: &str,
        limit: Limit,
        holds: u64,
        cost: &CostResponse,
        tokens: Option<Arc<BucketCounters>>,
        settled_in: SettledIn,
    ) -> Option<Self> {
        // Validation refused a source that does not parse; rules from elsewhere that slip one
        // through fall back to a fixed cost of the default.
        let source = cost.source().ok()?;
        Some(Self {
            service,
            bucket: bucket.into(),
            limit,
            source,
            weights: cost
                .weights
                .as_ref()
                .map(|w: &BTreeMap<String, u64>| w.iter().map(|(k, v)| (k.clone(), *v)).collect())
                .unwrap_or_default(),
            // An estimate above what the bucket holds could never be taken: it reserves the
            // whole bucket instead (`spillway check` warns).
            estimate: cost.estimate().min(holds),
            fallback: cost.fallback(),
            tokens,
            state: settled_in.state,
            store: settled_in.store,
        })
    }

    /// Whether the bucket's counts are tokens (a budget of the control plane).
    pub fn counts_tokens(&self) -> bool {
        self.tokens.is_some()
    }

    /// The tokens a request that was never answered is counted at: the mean cost of the
    /// responses `state` settled so far, or before the first the estimate, else the default.
    /// At least 1. The drop ratio does not look at a request's size, so what it drops costs the
    /// same on average as what it admits.
    pub(crate) fn dropped_cost(&self, state: &BucketState) -> u64 {
        let before_any = if self.estimate > 0 {
            self.estimate
        } else {
            self.fallback
        };
        state.budget.moments().dropped_cost(before_any)
    }

    /// Where the response reports its cost.
    pub fn source(&self) -> &ResponseSource {
        &self.source
    }

    /// The weighted fields, empty when the source names the cost itself.
    pub fn weights(&self) -> &[(String, u64)] {
        &self.weights
    }

    /// The cost of a response whose reported value is `value` (a number, or with weights the
    /// object holding the fields). `None` when it holds no usable number.
    pub fn cost_of(&self, value: &serde_json::Value) -> Option<u64> {
        let number = |v: &serde_json::Value| {
            v.as_u64()
                .or_else(|| v.as_f64().filter(|f| *f >= 0.0).map(|f| f.round() as u64))
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        };
        if self.weights.is_empty() {
            return number(value);
        }
        let object = value.as_object()?;
        let mut total = 0u64;
        let mut seen = false;
        for (field, weight) in self.weights.iter() {
            if let Some(v) = object.get(field) {
                total = total.saturating_add(number(v)?.saturating_mul(*weight));
                seen = true;
            }
        }
        seen.then_some(total)
    }

    pub fn service(&self) -> &str {
        &self.service
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn limit(&self) -> Limit {
        self.limit
    }
}

/// One token budget a request was admitted against, to settle when its response ends.
///
/// Holds the budget by one `Arc` (its response cost, which holds the bucket's state), so a
/// reload while the response streams still settles the bucket the request was admitted by, and
/// admitting takes one reference count. Dropping a charge without settling it leaves the
/// estimate reserved and debits nothing more.
#[derive(Debug)]
pub struct BudgetCharge {
    pub(crate) cost: Arc<ResponseCost>,
    /// The subject value of a per-subject budget (the only charge that allocates).
    pub(crate) subject: Option<Box<str>>,
    pub(crate) reserved: u64,
    /// What the bucket still held right after admission: units, and nanoseconds until it is
    /// whole again (a [`Quota`] in two words rather than three).
    pub(crate) remaining: u64,
    pub(crate) reset_ns: u64,
    /// The request's tier and what the bucket did with it, counted in tokens at settlement
    /// by a budget of the control plane.
    pub(crate) tier: Criticality,
    pub(crate) outcome: Outcome,
}

/// How a charge was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The units debited in all (the reported cost, or the fallback).
    pub cost: u64,
    /// Whether the response reported nothing usable and was charged the fallback.
    pub unreported: bool,
}

impl BudgetCharge {
    /// The bucket's response cost: where to read it and how to weigh it.
    pub fn cost(&self) -> &ResponseCost {
        &self.cost
    }

    /// Units the bucket still held right after this request was admitted (the estimate taken),
    /// and when it is whole again.
    pub fn quota(&self) -> Quota {
        Quota {
            remaining: self.remaining,
            reset: Duration::from_nanos(self.reset_ns),
        }
    }

    /// Settles the charge at `now` with what the response reported (`None`: nothing usable,
    /// charged the fallback and counted as unreported). A bucket in `store: redis` is settled
    /// by [`BudgetCharge::settle_async`]; here it only counts.
    pub fn settle(&self, now: Nanos, reported: Option<u64>) -> Settled {
        let settled = Settled {
            cost: reported.unwrap_or(self.cost.fallback),
            unreported: reported.is_none(),
        };
        self.debit(now, settled.cost);
        self.count(settled);
        settled
    }

    /// Gives back what the charge reserved: for a request that was not forwarded after all
    /// (another bucket dropped it, or the proxy answered it itself).
    ///
    /// A budget of the control plane counts it as offered to and admitted by the bucket at the
    /// mean cost, as a bucket counted in requests counts a request it admitted that another
    /// bucket then dropped.
    pub fn cancel(&self, now: Nanos) {
        self.debit(now, 0);
        if let Some(tokens) = &self.cost.tokens {
            tokens.record_cost_tier(
                self.tier,
                self.outcome,
                self.cost.dropped_cost(&self.cost.state),
            );
        }
    }

    fn count(&self, settled: Settled) {
        self.cost
            .state
            .budget
            .settle(settled.cost, settled.unreported);
        if let Some(tokens) = &self.cost.tokens {
            tokens.record_cost_tier(self.tier, self.outcome, settled.cost);
        }
    }

    fn debit(&self, now: Nanos, actual: u64) {
        match (&self.cost.state.limiters, &self.subject) {
            (Limiters::Shared(limiter), _) => limiter.settle(now, self.reserved, actual),
            (Limiters::PerSubject(_, map), Some(subject)) => {
                map.settle(subject, now, self.reserved, actual)
            }
            _ => {}
        }
    }

    /// Whether the charge is settled in Redis (one call, [`BudgetCharge::settle_async`]).
    pub fn in_redis(&self) -> bool {
        matches!(self.cost.state.limiters, Limiters::Exact(_))
    }

    /// Settles a `store: redis` budget: one Redis call that debits the reported cost and tells
    /// how long the shared bucket is in debt, which the next admissions on this proxy honour
    /// without asking Redis. A local budget is settled as by [`BudgetCharge::settle`].
    pub async fn settle_async(&self, now: Nanos, reported: Option<u64>) -> Settled {
        #[cfg(feature = "redis")]
        if let (Limiters::Exact(exact), Some(store)) = (&self.cost.state.limiters, &self.cost.store)
        {
            let settled = Settled {
                cost: reported.unwrap_or(self.cost.fallback),
                unreported: reported.is_none(),
            };
            let owed_until = |owed: Duration| {
                if owed.is_zero() {
                    0
                } else {
                    now.saturating_add(u64::try_from(owed.as_nanos()).unwrap_or(u64::MAX))
                }
            };
            if let (Some(subject), Some(debts)) = (&self.subject, &self.cost.state.subject_debts) {
                // A subject's debit: its own key, its debt in the table of subjects. What
                // earlier debits could not send waits in the table of held units.
                let key = exact.subject_key(subject);
                let counters = &self.cost.state.budget;
                let carried = if counters.unsent.load(Ordering::Relaxed) == 0 {
                    0
                } else {
                    debts.take_held(subject, counters)
                };
                let cost = settled.cost.saturating_add(carried);
                match store.debit(exact, Some(&key), cost).await {
                    Some(owed) => debts.set(subject, owed_until(owed)),
                    None => debts.hold(subject, cost, counters),
                }
                self.count(settled);
                return settled;
            }
            // What earlier debits could not send goes with this one; if this one fails too,
            // all of it waits for the next. A debit whose reply was lost after Redis ran it is
            // sent again: a budget is overcharged rather than undercharged.
            let unsent = &self.cost.state.budget.unsent;
            let cost = settled
                .cost
                .saturating_add(unsent.swap(0, Ordering::Relaxed));
            match store.debit(exact, None, cost).await {
                Some(owed) => self
                    .cost
                    .state
                    .owed_until
                    .store(owed_until(owed), Ordering::Relaxed),
                None => {
                    unsent.fetch_add(cost, Ordering::Relaxed);
                }
            }
            self.count(settled);
            return settled;
        }
        self.settle(now, reported)
    }
}

/// The token budgets a request was admitted against. Up to four are held inline, so admitting
/// a request allocates nothing for them; a fifth and beyond spill to the heap.
#[derive(Debug, Default)]
pub struct BudgetCharges {
    inline: [Option<BudgetCharge>; 4],
    more: Vec<BudgetCharge>,
}

impl BudgetCharges {
    #[inline]
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    pub(crate) fn push(&mut self, charge: BudgetCharge) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(charge),
            None => self.more.push(charge),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.inline[0].is_none()
    }

    pub fn iter(&self) -> impl Iterator<Item = &BudgetCharge> {
        self.inline.iter().flatten().chain(self.more.iter())
    }

    /// Gives back every reservation: the request was not forwarded.
    pub fn cancel(&self, now: Nanos) {
        for charge in self.iter() {
            charge.cancel(now);
        }
    }

    /// The charges, to settle one by one.
    pub fn into_vec(self) -> Vec<BudgetCharge> {
        let mut all: Vec<BudgetCharge> = self.inline.into_iter().flatten().collect();
        all.extend(self.more);
        all
    }
}

/// Whole seconds until `quota` is whole again, at least 0, for the `ratelimit` header.
pub fn reset_secs(quota: Quota) -> u64 {
    let reset: Duration = quota.reset;
    reset.as_secs() + u64::from(reset.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stay_small_as_every_request_moves_them() {
        // One reference count and a quota in two words: 56 bytes, four of them inline.
        assert_eq!(std::mem::size_of::<BudgetCharge>(), 56);
        assert_eq!(std::mem::size_of::<Option<BudgetCharge>>(), 56);
        assert_eq!(std::mem::size_of::<BudgetCharges>(), 4 * 56 + 24);
    }
}
