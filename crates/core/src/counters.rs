//! Per-bucket counters (offered, allowed, dropped, shadow-dropped), striped per thread.
//!
//! Every decision bumps a counter, so counters are on the hot path. One shared `AtomicU64` per
//! counter would make every core fight over one cache line; instead each bucket has a few
//! cache-line-padded stripes, each thread writes to its own stripe, and the reporter sums the
//! stripes once per interval. Offered is not stored: it is `allowed + dropped + shadow_dropped`,
//! which saves an atomic add per request. Each counter is kept per criticality tier,
//! which costs nothing on the hot path (the tier picks the counter) and fits the same cache
//! lines: twelve counters in a stripe of 128 bytes.

use std::cell::Cell;
use std::ops::Sub;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::criticality::{Criticality, TIERS};
use crate::decision::{Decision, Mode, Verdict};

/// Stripes per bucket by default: enough that a handful of worker threads rarely share one.
pub const DEFAULT_STRIPES: usize = 8;

/// What happened to a request in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Dropped,
    ShadowDropped,
}

impl Outcome {
    /// The outcome of `verdict` in a bucket of `mode`.
    pub fn of(verdict: Verdict, mode: Mode) -> Self {
        match (verdict, mode) {
            (Verdict::Allow, _) => Outcome::Allowed,
            (Verdict::Deny { .. }, Mode::Enforce) => Outcome::Dropped,
            (Verdict::Deny { .. }, Mode::Shadow) => Outcome::ShadowDropped,
        }
    }
}

impl From<Decision> for Outcome {
    fn from(d: Decision) -> Self {
        match d {
            Decision::Allow => Outcome::Allowed,
            Decision::Drop { .. } => Outcome::Dropped,
            Decision::ShadowDrop { .. } => Outcome::ShadowDropped,
        }
    }
}

/// One tier's part of a reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierCounts {
    pub allowed: u64,
    pub dropped: u64,
    pub shadow_dropped: u64,
}

impl TierCounts {
    /// Everything of the tier that arrived.
    #[inline]
    pub fn offered(&self) -> u64 {
        self.allowed + self.dropped + self.shadow_dropped
    }
}

/// A reading of a bucket's counters: monotonic totals since the counters were created, and
/// their parts per tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub allowed: u64,
    pub dropped: u64,
    pub shadow_dropped: u64,
    /// Per tier in [`Criticality::ALL`] order. A reading made by hand may leave them at zero:
    /// whatever the tiers do not hold counts as the default tier ([`Snapshot::tier`]).
    pub tiers: [TierCounts; TIERS],
    /// The sum of the squares of the costs counted with [`BucketCounters::record_cost_tier`]
    /// (a token budget's tokens; 0 for a bucket counted in requests), wrapping: the spread of
    /// what `offered` counted, which the control plane tells noise from a change of load by.
    pub squares: u64,
}

impl Snapshot {
    /// Everything that arrived: allowed, dropped or shadow-dropped.
    #[inline]
    pub fn offered(&self) -> u64 {
        self.allowed + self.dropped + self.shadow_dropped
    }

    /// The counts of `tier`; the default tier also holds what no tier was given.
    #[inline]
    pub fn tier(&self, tier: Criticality) -> TierCounts {
        let own = self.tiers[tier.index()];
        if tier != Criticality::default() {
            return own;
        }
        let others = |f: fn(&TierCounts) -> u64| -> u64 {
            Criticality::ALL
                .iter()
                .filter(|&&t| t != tier)
                .map(|t| f(&self.tiers[t.index()]))
                .sum()
        };
        TierCounts {
            allowed: self.allowed.saturating_sub(others(|t| t.allowed)),
            dropped: self.dropped.saturating_sub(others(|t| t.dropped)),
            shadow_dropped: self
                .shadow_dropped
                .saturating_sub(others(|t| t.shadow_dropped)),
        }
    }

    /// What each tier was offered, in [`Criticality::ALL`] order.
    #[inline]
    pub fn offered_by_tier(&self) -> [u64; TIERS] {
        Criticality::ALL.map(|t| self.tier(t).offered())
    }
}

/// The counts between two readings: `later - earlier`.
impl Sub for Snapshot {
    type Output = Snapshot;

    fn sub(self, earlier: Snapshot) -> Snapshot {
        let tier = |i: usize| TierCounts {
            allowed: self.tiers[i]
                .allowed
                .saturating_sub(earlier.tiers[i].allowed),
            dropped: self.tiers[i]
                .dropped
                .saturating_sub(earlier.tiers[i].dropped),
            shadow_dropped: self.tiers[i]
                .shadow_dropped
                .saturating_sub(earlier.tiers[i].shadow_dropped),
        };
        Snapshot {
            allowed: self.allowed.saturating_sub(earlier.allowed),
            dropped: self.dropped.saturating_sub(earlier.dropped),
            shadow_dropped: self.shadow_dropped.saturating_sub(earlier.shadow_dropped),
            tiers: std::array::from_fn(tier),
            // A wrapping total: the difference of two readings is right across the wrap.
            squares: self.squares.wrapping_sub(earlier.squares),
        }
    }
}

/// One thread's share of a bucket's counters, alone on its cache lines (128 bytes: adjacent-line
/// prefetchers on x86 pull lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe {
    /// By tier, then by [`Outcome`] (allowed, dropped, shadow-dropped).
    counts: [[AtomicU64; 3]; TIERS],
    /// The squares of the costs counted by [`BucketCounters::record_cost_tier`], on the same
    /// line as the counts it goes with.
    squares: AtomicU64,
}

/// Gives each thread a stripe number once, round robin, so the first threads get distinct ones:
/// the stripe of a thread in every striped structure (these counters, a drop schedule).
pub(crate) fn thread_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<Option<usize>> = const { Cell::new(None) };
    }
    STRIPE.with(|s| match s.get() {
        Some(i) => i,
        None => {
            let i = NEXT.fetch_add(1, Ordering::Relaxed);
            s.set(Some(i));
            i
        }
    })
}

/// The counters of one bucket.
#[derive(Debug)]
pub struct BucketCounters {
    stripes: Box<[Stripe]>,
}

impl Default for BucketCounters {
    fn default() -> Self {
        Self::with_stripes(DEFAULT_STRIPES)
    }
}

impl BucketCounters {
    /// Counters with `stripes` stripes, rounded up to a power of two (at least 1) so that picking
    /// a thread's stripe is a mask rather than a division, which would cost more than the add.
    pub fn with_stripes(stripes: usize) -> Self {
        let stripes = stripes.max(1).next_power_of_two();
        Self {
            stripes: (0..stripes).map(|_| Stripe::default()).collect(),
        }
    }

    /// Adds `n` (1 per request, or its cost) to the counter of `outcome`, in the default tier.
    #[inline]
    pub fn record(&self, outcome: Outcome, n: u64) {
        self.record_tier(Criticality::default(), outcome, n);
    }

    /// Adds `n` to the counter of `outcome` in `tier`.
    #[inline]
    pub fn record_tier(&self, tier: Criticality, outcome: Outcome, n: u64) {
        // The length is a power of two (see `with_stripes`).
        let stripe = &self.stripes[thread_stripe() & (self.stripes.len() - 1)];
        let counter = &stripe.counts[tier.index()][outcome as usize];
        // Relaxed: totals only need to be eventually complete, and each add is atomic.
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds a request of `cost` units (a token budget's tokens) to the counter of `outcome` in
    /// `tier`, and its square to the sum of squares ([`Snapshot::squares`]): two adds on the
    /// thread's own stripe, one cache line.
    #[inline]
    pub fn record_cost_tier(&self, tier: Criticality, outcome: Outcome, cost: u64) {
        let stripe = &self.stripes[thread_stripe() & (self.stripes.len() - 1)];
        stripe.counts[tier.index()][outcome as usize].fetch_add(cost, Ordering::Relaxed);
        // Wrapping (readings subtract across the wrap); a cost over 2^32 counts 2^64 - 1.
        stripe
            .squares
            .fetch_add(cost.saturating_mul(cost), Ordering::Relaxed);
    }

    /// Sums the stripes.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::default();
        for stripe in self.stripes.iter() {
            snapshot.squares = snapshot
                .squares
                .wrapping_add(stripe.squares.load(Ordering::Relaxed));
            for (tier, counts) in snapshot.tiers.iter_mut().zip(&stripe.counts) {
                tier.allowed += counts[Outcome::Allowed as usize].load(Ordering::Relaxed);
                tier.dropped += counts[Outcome::Dropped as usize].load(Ordering::Relaxed);
                tier.shadow_dropped +=
                    counts[Outcome::ShadowDropped as usize].load(Ordering::Relaxed);
            }
        }
        for tier in snapshot.tiers {
            snapshot.allowed += tier.allowed;
            snapshot.dropped += tier.dropped;
            snapshot.shadow_dropped += tier.shadow_dropped;
        }
        snapshot
    }
}

/// What the settled responses of a token budget cost: their number, their sum and the sum of
/// their squares. A host counts a request its control-plane budget drops at the mean
/// ([`CostMoments::dropped_cost`]) and its surge guard counts in requests' worth of tokens
/// ([`CostMoments::unit`]); the client keeps these sums in atomics, the simulator in a plain
/// value, and both read them here.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostMoments {
    pub settled: u64,
    pub sum: u64,
    pub squares: f64,
}

impl CostMoments {
    /// Counts one settled response of `cost` units.
    pub fn add(&mut self, cost: u64) {
        self.settled += 1;
        self.sum = self.sum.saturating_add(cost);
        self.squares += (cost as f64) * (cost as f64);
    }

    /// The mean cost; `None` before the first response settled.
    pub fn mean(&self) -> Option<f64> {
        (self.settled > 0).then(|| self.sum as f64 / self.settled as f64)
    }

    /// The units one request stands for when counts of units are read as counts of requests:
    /// `E[cost^2] / E[cost]`, so that a sum of costs over a stretch of time, divided by it, has
    /// the spread of a Poisson count (a compound Poisson sum of costs has the variance
    /// `n E[cost^2]`). Answers of 100 to 2,000 tokens drawn evenly stand for 1,336 tokens each
    /// (their mean is 1,050). 1 before any response settled, or when costs are all 1.
    pub fn unit(&self) -> f64 {
        if self.sum > 0 && self.squares > 0.0 {
            (self.squares / self.sum as f64).max(1.0)
        } else {
            1.0
        }
    }

    /// What a request that was never answered is counted at: the mean cost rounded, or
    /// `before_any` (the estimate, else the default) before the first response settled; at
    /// least 1. The drop ratio does not look at a request's size, so what it drops costs the
    /// same on average as what it admits.
    pub fn dropped_cost(&self, before_any: u64) -> u64 {
        self.mean()
            .map_or(before_any, |mean| mean.round() as u64)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outcomes_follow_verdict_and_mode() {
        let deny = Verdict::Deny {
            retry_after: Duration::from_secs(1),
        };
        assert_eq!(Outcome::of(Verdict::Allow, Mode::Shadow), Outcome::Allowed);
        assert_eq!(Outcome::of(deny, Mode::Enforce), Outcome::Dropped);
        assert_eq!(Outcome::of(deny, Mode::Shadow), Outcome::ShadowDropped);
    }

    #[test]
    fn stripes_are_padded_to_their_own_lines() {
        assert_eq!(std::mem::align_of::<Stripe>(), 128);
        assert_eq!(std::mem::size_of::<Stripe>(), 128);
    }

    #[test]
    fn deltas_subtract_readings() {
        let c = BucketCounters::default();
        c.record(Outcome::Allowed, 3);
        let first = c.snapshot();
        c.record(Outcome::Dropped, 2);
        c.record(Outcome::Allowed, 1);
        let delta = c.snapshot() - first;
        assert_eq!((delta.allowed, delta.dropped, delta.offered()), (1, 2, 3));
        assert_eq!(delta.squares, 0, "counted in requests");
    }

    #[test]
    fn costs_count_their_squares_and_readings_subtract_across_the_wrap() {
        let c = BucketCounters::default();
        c.record_cost_tier(Criticality::default(), Outcome::Allowed, 300);
        c.record_cost_tier(Criticality::Sheddable, Outcome::Dropped, 100);
        let s = c.snapshot();
        assert_eq!((s.offered(), s.squares), (400, 100_000));
        assert_eq!(s.tier(Criticality::Sheddable).dropped, 100);
        // A total that wrapped since the earlier reading.
        let earlier = Snapshot {
            squares: u64::MAX - 9,
            ..Snapshot::default()
        };
        let later = Snapshot {
            squares: 5,
            ..Snapshot::default()
        };
        assert_eq!((later - earlier).squares, 15);
    }

    #[test]
    fn tiers_are_counted_apart_and_a_reading_by_hand_is_the_default_tier() {
        let c = BucketCounters::default();
        c.record_tier(Criticality::Sheddable, Outcome::Dropped, 4);
        c.record_tier(Criticality::Sheddable, Outcome::Allowed, 1);
        c.record(Outcome::Allowed, 7);
        let s = c.snapshot();
        assert_eq!((s.allowed, s.dropped, s.offered()), (8, 4, 12));
        assert_eq!(s.tier(Criticality::Sheddable).dropped, 4);
        assert_eq!(s.offered_by_tier(), [0, 7, 0, 5]);
        let by_hand = Snapshot {
            allowed: 10,
            dropped: 2,
            ..Snapshot::default()
        };
        assert_eq!(by_hand.offered_by_tier(), [0, 12, 0, 0]);
    }

    #[test]
    fn cost_moments_give_the_mean_and_the_unit_of_a_spread_of_sizes() {
        let mut m = CostMoments::default();
        assert_eq!((m.mean(), m.unit(), m.dropped_cost(500)), (None, 1.0, 500));
        assert_eq!(m.dropped_cost(0), 1);
        // 100 and 300: a mean of 200, E[c^2] / E[c] = 50,000 / 200 = 250.
        m.add(100);
        m.add(300);
        assert_eq!(
            (m.mean(), m.unit(), m.dropped_cost(500)),
            (Some(200.0), 250.0, 200)
        );
    }
}
