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
    /// A `store: redis` budget's units that Redis could not take (down, slow, the circuit
    /// open): carried by the next debit rather than lost.
    pub(crate) unsent: AtomicU64,
}

impl BudgetCounters {
    pub fn debited(&self) -> u64 {
        self.debited.load(Ordering::Relaxed)
    }

    pub fn unreported(&self) -> u64 {
        self.unreported.load(Ordering::Relaxed)
    }

    /// Units owed to Redis that no debit has carried there yet.
    pub fn unsent(&self) -> u64 {
        self.unsent.load(Ordering::Relaxed)
    }
}
