//! A bucket's state: its limiters and what it counts, shared between rules snapshots while the
//! bucket's definition does not change. Below both the rules that decide and the token budgets
//! that settle.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use spillway_core::algo::Limiter;
use spillway_core::counters::CostMoments;
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
    /// A `store: redis` token budget per subject value: which values are in debt, and until
    /// when, as their last settlements' Redis calls told.
    pub(crate) subject_debts: Option<Box<SubjectDebts>>,
}

/// The subjects of a per-subject `store: redis` token budget that are in debt, as far as this
/// process has seen: a fixed table of slots, each a subject's hash tag and the millisecond its
/// debt ends, in one word. Admission reads one slot and takes no lock; a settlement writes it.
/// Two subjects in debt at once whose hashes pick the same slot share it, the later one's debt
/// kept: the other is admitted until its own next debit learns the debt again from Redis,
/// which always holds every subject's meter. The hash is keyed per process, so nobody can
/// choose a value whose tag matches another's.
// Without the `redis` feature no bucket is `Exact`, so nothing settles into the table.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug)]
pub(crate) struct SubjectDebts {
    slots: Box<[AtomicU64]>,
    hasher: std::hash::RandomState,
    /// Units of subjects' debits Redis could not take, carried by each subject's next debit
    /// (at most [`HELD_MAX`] subjects; off the decision path, so a lock is fine here).
    held: std::sync::Mutex<std::collections::HashMap<Box<str>, u64>>,
}

/// The subjects whose failed debits are held at once: beyond them, a failed debit is lost
/// (counted), so a long Redis outage under many subjects cannot grow memory without bound.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
const HELD_MAX: usize = 65_536;

/// 4,096 slots: 32 KiB per budget.
const DEBT_SLOTS: usize = 4096;
/// The low bits of a slot are the end of the debt in milliseconds of the client's clock
/// (2^44 ms is over 500 years); the high bits the subject's tag.
const UNTIL_BITS: u32 = 44;
const UNTIL_MASK: u64 = (1 << UNTIL_BITS) - 1;

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl SubjectDebts {
    pub(crate) fn new() -> Self {
        Self {
            slots: (0..DEBT_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            hasher: std::hash::RandomState::new(),
            held: Default::default(),
        }
    }

    /// Holds `units` of `subject` that Redis could not take, counted in the budget's
    /// `unsent`; lost (and counted so) when the table of held subjects is full.
    pub(crate) fn hold(&self, subject: &str, units: u64, counters: &BudgetCounters) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(subject) {
            *n = n.saturating_add(units);
        } else if held.len() < HELD_MAX {
            held.insert(subject.into(), units);
        } else {
            counters.lost.fetch_add(units, Ordering::Relaxed);
            return;
        }
        counters.unsent.fetch_add(units, Ordering::Relaxed);
    }

    /// Takes the units held for `subject`, to send with its debit, off the budget's `unsent`.
    pub(crate) fn take_held(&self, subject: &str, counters: &BudgetCounters) -> u64 {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let units = held.remove(subject).unwrap_or(0);
        counters.unsent.fetch_sub(units, Ordering::Relaxed);
        units
    }

    /// The slot of `subject` and the tag it writes there (never 0, so an empty slot is 0).
    fn slot(&self, subject: &str) -> (&AtomicU64, u64) {
        let hash = self.hasher.hash_one(subject);
        let tag = (hash >> UNTIL_BITS).max(1);
        (&self.slots[(hash as usize) % DEBT_SLOTS], tag)
    }

    /// Until when (nanoseconds of the client's clock) `subject` is in debt: 0 when it is not,
    /// as far as this process knows.
    pub(crate) fn until(&self, subject: &str, now: u64) -> u64 {
        let (slot, tag) = self.slot(subject);
        let word = slot.load(Ordering::Relaxed);
        let until = (word & UNTIL_MASK).saturating_mul(1_000_000);
        if word >> UNTIL_BITS == tag && now < until {
            until
        } else {
            0
        }
    }

    /// Records what `subject`'s settlement learned: in debt until `until` (nanoseconds), or
    /// not at all (0).
    pub(crate) fn set(&self, subject: &str, until: u64) {
        let (slot, tag) = self.slot(subject);
        if until == 0 {
            // Clear the slot only if it is still this subject's.
            let word = slot.load(Ordering::Relaxed);
            if word >> UNTIL_BITS == tag {
                let _ = slot.compare_exchange(word, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
            return;
        }
        let until_ms = until.div_ceil(1_000_000).min(UNTIL_MASK);
        slot.store(tag << UNTIL_BITS | until_ms, Ordering::Relaxed);
    }
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
    /// Units of failed debits of a per-subject Redis budget that could not be held (too many
    /// subjects held at once): lost.
    pub(crate) lost: AtomicU64,
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

    /// Units owed to Redis that no debit has carried there yet.
    pub fn unsent(&self) -> u64 {
        self.unsent.load(Ordering::Relaxed)
    }

    /// Units of failed debits that could not be held for a later one.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
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

    /// What the responses settled so far cost: their number, sum and sum of squares.
    pub fn moments(&self) -> CostMoments {
        CostMoments {
            settled: self.settled(),
            sum: self.debited(),
            squares: f64::from_bits(self.squares.load(Ordering::Relaxed)),
        }
    }

    /// The mean cost of the responses settled so far; `None` before the first.
    pub fn mean_cost(&self) -> Option<f64> {
        self.moments().mean()
    }

    /// The units one request stands for when counts of units are read as counts of requests
    /// (`CostMoments::unit`): 1 before any response settled, or when costs are all 1.
    pub fn count_unit(&self) -> f64 {
        self.moments().unit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_subject_in_debt_is_known_until_its_debt_ends_and_cleared_by_a_debit_that_leaves_none() {
        let debts = SubjectDebts::new();
        assert_eq!(debts.until("alice", 5 * MS), 0);
        debts.set("alice", 900 * MS + 1);
        // Rounded up to the millisecond: never shorter than Redis said.
        assert_eq!(debts.until("alice", 5 * MS), 901 * MS);
        assert_eq!(debts.until("bob", 5 * MS), 0, "bob is not alice");
        assert_eq!(debts.until("alice", 901 * MS), 0, "the debt has ended");
        debts.set("alice", 2_000 * MS);
        debts.set("alice", 0);
        assert_eq!(debts.until("alice", 5 * MS), 0);
    }

    #[test]
    fn subjects_sharing_a_slot_keep_the_later_debt_and_no_other_subject_is_refused() {
        let debts = SubjectDebts::new();
        // Two values whose hashes pick the same slot (found by trying).
        let first = "user-0".to_owned();
        let (slot, _) = debts.slot(&first);
        let slot = slot as *const AtomicU64;
        let second = (1..100_000)
            .map(|i| format!("user-{i}"))
            .find(|v| std::ptr::eq(debts.slot(v).0, slot))
            .expect("a value sharing the slot among 100,000");
        debts.set(&first, 1_000 * MS);
        debts.set(&second, 2_000 * MS);
        assert_eq!(debts.until(&second, MS), 2_000 * MS);
        assert_eq!(
            debts.until(&first, MS),
            0,
            "overwritten: admitted until Redis says again"
        );
        // Clearing the first (its debit found no debt) leaves the second's debt alone.
        debts.set(&first, 0);
        assert_eq!(debts.until(&second, MS), 2_000 * MS);
    }

    #[test]
    fn failed_debits_are_held_per_subject_and_lost_only_past_the_table() {
        let debts = SubjectDebts::new();
        let counters = BudgetCounters::default();
        debts.hold("alice", 300, &counters);
        debts.hold("alice", 200, &counters);
        debts.hold("bob", 7, &counters);
        assert_eq!(counters.unsent(), 507);
        assert_eq!(debts.take_held("alice", &counters), 500);
        assert_eq!(debts.take_held("alice", &counters), 0);
        assert_eq!(counters.unsent(), 7);
        for i in 0..HELD_MAX {
            debts.hold(&format!("s{i}"), 1, &counters);
        }
        // bob and 65,535 others fill it: the last is lost, counted.
        assert_eq!(counters.lost(), 1);
        assert_eq!(counters.unsent(), 7 + HELD_MAX as u64 - 1);
    }
}
