//! A bucket's state: its limiters and what it counts, shared between rules snapshots while the
//! bucket's definition does not change. Below both the rules that decide and the token budgets
//! that settle.

use std::sync::atomic::{AtomicU64, Ordering};

use spillway_core::algo::Limiter;
use spillway_core::pattern::SubjectKind;

use crate::store::ExactBucket;
use crate::subjects::SubjectMap;

/// Where a bucket's state lives: one limiter, or one per subject value.
#[derive(Debug)]
pub(crate) enum Limiters {
    Shared(Limiter),
    PerSubject(SubjectKind, SubjectMap),
    /// A descriptor bucket with entries of any value: one limiter per combination of
    /// the request's values of those entries.
    PerValue(SubjectMap),
    /// `store: redis`: decided by one Lua call in Redis, so the count is exact across proxies
    /// (within `batch - 1` tokens per proxy and key for a bucket with `batch`). Without the
    /// `redis` feature `ExactBucket` has no values, so no bucket is ever `Exact`.
    Exact(ExactBucket),
}

/// A bucket's state, shared between snapshots while its definition does not change, so a reload
/// that touches one bucket keeps every other bucket's tokens, windows and instructions.
#[derive(Debug)]
pub(crate) struct BucketState {
    pub(crate) limiters: Limiters,
    /// When the current drop-ratio instruction expires (0: none), to count expiries.
    pub(crate) instruction_expires: AtomicU64,
    /// A token budget's settled costs.
    pub(crate) budget: BudgetCounters,
    /// A `store: redis` token budget: until when the shared bucket is in debt, as the last
    /// settlement's Redis call told (0: not in debt). Admissions before then are refused here,
    /// without asking Redis.
    pub(crate) owed_until: AtomicU64,
}

/// What a token budget counts besides the decisions: what responses reported, and how many
/// never did.
#[derive(Debug, Default)]
pub struct BudgetCounters {
    /// Units debited by settled responses (reported or fallback).
    pub(crate) debited: AtomicU64,
    /// Responses that reported no readable cost and were charged the fallback.
    pub(crate) unreported: AtomicU64,
    /// Responses settled, and the sum of the squares of their costs (an `f64`'s bits): with
    /// `debited`, the running mean cost a request of a control-plane budget is counted at when
    /// it is dropped, and the unit its surge guard counts in.
    pub(crate) settled: AtomicU64,
    pub(crate) squares: AtomicU64,
}

impl BudgetCounters {
    pub fn debited(&self) -> u64 {
        self.debited.load(Ordering::Relaxed)
    }

    pub fn unreported(&self) -> u64 {
        self.unreported.load(Ordering::Relaxed)
    }

    /// Responses settled.
    pub fn settled(&self) -> u64 {
        self.settled.load(Ordering::Relaxed)
    }

    /// Counts one settled response of `cost` units. Lock-free: two adds and a compare-exchange
    /// loop on the squares' sum.
    pub(crate) fn settle(&self, cost: u64, unreported: bool) {
        self.debited.fetch_add(cost, Ordering::Relaxed);
        if unreported {
            self.unreported.fetch_add(1, Ordering::Relaxed);
        }
        self.settled.fetch_add(1, Ordering::Relaxed);
        let square = (cost as f64) * (cost as f64);
        // The closure always returns `Some`, so the update cannot fail.
        let _ = self
            .squares
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + square).to_bits())
            });
    }

    /// The mean cost of the responses settled so far; `None` before the first.
    pub fn mean_cost(&self) -> Option<f64> {
        let settled = self.settled();
        (settled > 0).then(|| self.debited() as f64 / settled as f64)
    }

    /// The units one request stands for when counts of units are read as counts of requests:
    /// `E[cost^2] / E[cost]`, so that a sum of costs over a stretch of time, divided by it, has
    /// the spread of a Poisson count (a compound Poisson sum of costs has the variance
    /// `n E[cost^2]`). 1 before any response settled, or when costs are all 1.
    pub fn count_unit(&self) -> f64 {
        let debited = self.debited() as f64;
        let squares = f64::from_bits(self.squares.load(Ordering::Relaxed));
        if debited > 0.0 && squares > 0.0 {
            (squares / debited).max(1.0)
        } else {
            1.0
        }
    }
}
