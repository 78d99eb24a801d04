//! Drop-by-ratio: drop the share of requests the control plane sent, until the instruction
//! expires.
//!
//! Which requests are dropped follows a **drop schedule** per host and bucket by default:
//! error diffusion, which admits about `(1 - r) x n` of every `n` requests, spread evenly, where
//! an independent coin per request admits `Binomial(n, 1 - r)`. At a drop ratio of 1/3 a caller
//! sending 3 requests gets 2 through, where the coin gives it 0 to 3 (0 with chance 1/27); over
//! a fleet, the admitted total varies only with the arrivals, not with the coins as well. The
//! schedule keeps what it owes, `e = (1 - r) x requests - admitted`, and admits each request with
//! chance `(1 - r) + e / 4` (clamped to [0, 1]): a request owed is more likely to pass, one
//! admitted ahead of time less. The owed count stays within about 4 requests of 0 (at `e = 4`
//! every request passes, at `e = -4` none), so `admitted` and `(1 - r) x n` never drift apart;
//! and every decision keeps a chance of its own, the dither, so callers that take turns in a
//! fixed round robin are not aliased with the schedule (a pure error diffusion at 1/3 would
//! admit the first two of three round-robin callers every time and the third never; here their
//! shares differ by the noise alone). The coin is kept ([`DropRatio::with_coin`]) as the
//! baseline the simulator compares with.
//!
//! **Criticality**: an instruction may carry a ratio per tier
//! ([`crate::criticality::shed_lowest_first`]), and so may the client's own ratio; each request
//! is dropped at its tier's ratio, on a schedule of its tier's own (one shared schedule would
//! let a sheddable request's debt drop a critical one). An instruction without tiers drops every
//! tier alike.
//!
//! The hot path is four atomic loads (the instruction and the client's own ratio between
//! instructions, each a ratio and an expiry), a thread-local random number and, for the
//! schedule, one compare-and-swap on the thread's own stripe of the schedule: no lock, no
//! allocation, no syscall.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::deny_after;
use crate::clock::{Nanos, nanos};
use crate::counters::thread_stripe;
use crate::criticality::{Criticality, TIERS};
use crate::decision::Verdict;

/// A probability in fixed point: `raw / 2^32`, from 0 to 1 inclusive.
///
/// At 1.5x the limit the drop ratio is 1/3, stored as 1,431,655,766 (rounded up, so the excess
/// is dropped rather than let through): a request is dropped when a uniform `u32` falls below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ratio(u64);

impl Ratio {
    /// 2^32, the raw value of 1.
    pub const SCALE: u64 = 1 << 32;
    /// Never drop.
    pub const ZERO: Ratio = Ratio(0);
    /// Always drop.
    pub const ONE: Ratio = Ratio(Self::SCALE);

    /// From a raw value, clamped to 1.
    pub fn from_raw(raw: u64) -> Ratio {
        Ratio(raw.min(Self::SCALE))
    }

    /// The raw fixed-point value.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// `num / den` rounded up, clamped to [0, 1]; 0 when `den` is 0.
    pub fn from_fraction(num: u64, den: u64) -> Ratio {
        if den == 0 {
            return Ratio::ZERO;
        }
        let raw = (u128::from(num) << 32).div_ceil(u128::from(den));
        Ratio(u64::try_from(raw).unwrap_or(u64::MAX).min(Self::SCALE))
    }

    /// From a float, clamped to [0, 1] and rounded up; NaN is 0 (fail open).
    pub fn from_f64(x: f64) -> Ratio {
        if x.is_nan() || x <= 0.0 {
            Ratio::ZERO
        } else if x >= 1.0 {
            Ratio::ONE
        } else {
            Ratio((x * Self::SCALE as f64).ceil() as u64)
        }
    }

    /// As a float in [0, 1].
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / Self::SCALE as f64
    }

    /// One toss: true with probability `self`, given a uniform `u32`.
    #[inline]
    pub fn hits(self, coin: u32) -> bool {
        u64::from(coin) < self.0
    }
}

/// A ratio per tier, in [`Criticality::ALL`] order.
pub type TierRatios = [Ratio; TIERS];

/// Every tier at `ratio`.
pub fn uniform(ratio: Ratio) -> TierRatios {
    [ratio; TIERS]
}

/// Per-tier ratios from [`crate::criticality::shed_lowest_first`]'s floats, or every tier at
/// `ratio` when it gave none.
pub fn tier_ratios(ratio: Ratio, split: Option<[f64; TIERS]>) -> TierRatios {
    match split {
        Some(tiers) => tiers.map(Ratio::from_f64),
        None => uniform(ratio),
    }
}

/// Stripes of a schedule: enough that a handful of worker threads rarely share one
/// (as the bucket's counters, `crate::counters::DEFAULT_STRIPES`).
const SCHEDULE_STRIPES: usize = 8;

/// The schedule's chance moves by `owed / 2^OWED_SHIFT`: a quarter of a request's chance per
/// request owed.
const OWED_SHIFT: u32 = 2;

/// What a drop schedule owes on one thread, alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// The drop-ratio limiter of one bucket on one client: the current instruction (a [`Ratio`] and
/// the instant it expires), the client's own ratio between instructions, and the drop schedule.
///
/// The control plane sends `drop 1/3 until t+5s`; from then on a third of the requests is
/// dropped (one in three, spread by the schedule), so at 1.5x the limit two thirds get through,
/// on every instance alike. When `t+5s` passes without a newer instruction the limiter admits
/// everything again (fail-open). A new limiter has no instruction and admits everything.
#[derive(Debug)]
pub struct DropRatio {
    /// The bucket's ratio, for readings; requests are dropped at their tier's (`tiers`).
    ratio: AtomicU64,
    tiers: [AtomicU64; TIERS],
    expires_at: AtomicU64,
    /// The client's own ratio between instructions ([`crate::surge`]): while it holds it is the
    /// ratio in force, higher or lower than the instruction's.
    surge: AtomicU64,
    surge_tiers: [AtomicU64; TIERS],
    surge_until: AtomicU64,
    retry_after: Duration,
    /// What the drop schedule owes, per stripe and tier (signed, in 2^-32 requests, as `u64`
    /// bits), stripe by stripe; empty for the coin.
    schedule: Box<[Stripe]>,
}

fn store_tiers(into: &[AtomicU64; TIERS], ratios: &TierRatios) {
    for (slot, r) in into.iter().zip(ratios) {
        slot.store(r.raw(), Ordering::Relaxed);
    }
}

impl DropRatio {
    /// A limiter with no instruction whose drops suggest retrying after `retry_after` (the
    /// control interval is a good choice: the next instruction may differ). Retry-after is a hint
    /// here, not the exact promise of the deterministic algorithms, since any retry passes with probability `1 - ratio`.
    pub fn new(retry_after: Duration) -> Self {
        Self {
            schedule: (0..SCHEDULE_STRIPES * TIERS)
                .map(|_| Stripe::default())
                .collect(),
            ..Self::with_coin(retry_after)
        }
    }

    /// A limiter that tosses an independent coin per request instead of following the drop
    /// schedule: the baseline that [`DropRatio::new`] improves on.
    pub fn with_coin(retry_after: Duration) -> Self {
        Self {
            ratio: AtomicU64::new(0),
            tiers: Default::default(),
            expires_at: AtomicU64::new(0),
            surge: AtomicU64::new(0),
            surge_tiers: Default::default(),
            surge_until: AtomicU64::new(0),
            retry_after,
            schedule: Box::new([]),
        }
    }

    /// Whether requests are decided by the drop schedule (the default) rather than a coin.
    pub fn scheduled(&self) -> bool {
        !self.schedule.is_empty()
    }

    /// Installs an instruction: drop with probability `ratio` until `expires_at`, every tier
    /// alike.
    pub fn set(&self, ratio: Ratio, expires_at: Nanos) {
        self.set_tiers(ratio, &uniform(ratio), expires_at);
    }

    /// Installs an instruction of ratio `ratio` that drops each tier at its own ratio of `tiers`
    /// until `expires_at`.
    pub fn set_tiers(&self, ratio: Ratio, tiers: &TierRatios, expires_at: Nanos) {
        // Ratios first, expiry second (release): a reader that sees the new expiry sees the new
        // ratios. One that sees the old expiry with the new ratios applies them a moment early,
        // which is harmless.
        self.ratio.store(ratio.raw(), Ordering::Relaxed);
        store_tiers(&self.tiers, tiers);
        self.expires_at.store(expires_at, Ordering::Release);
    }

    /// Installs an instruction valid for `ttl` from `now`.
    pub fn set_for(&self, ratio: Ratio, now: Nanos, ttl: Duration) {
        self.set(ratio, now.saturating_add(nanos(ttl)));
    }

    /// Installs the client's own ratio until `until`: while it holds it is dropped instead of the
    /// instruction's, which it may raise (a surge, [`crate::surge`]) or lower (the load fell
    /// below what the instruction was computed from). It never outlives the instruction,
    /// and once `until` passes the instruction's ratio applies again, so an owner that stops
    /// ticking leaves the control plane's ratio in force.
    pub fn set_surge(&self, ratio: Ratio, until: Nanos) {
        self.set_surge_tiers(ratio, &uniform(ratio), until);
    }

    /// Like [`DropRatio::set_surge`], each tier at its own ratio of `tiers`.
    pub fn set_surge_tiers(&self, ratio: Ratio, tiers: &TierRatios, until: Nanos) {
        self.surge.store(ratio.raw(), Ordering::Relaxed);
        store_tiers(&self.surge_tiers, tiers);
        self.surge_until.store(until, Ordering::Release);
    }

    /// Forgets the instruction, so everything is admitted.
    pub fn clear(&self) {
        self.expires_at.store(0, Ordering::Release);
        self.surge_until.store(0, Ordering::Release);
    }

    /// The ratio in force at `now`, or `None` once the instruction has expired: the client's own
    /// while it holds, else the instruction's.
    pub fn current(&self, now: Nanos) -> Option<Ratio> {
        let ratio = self.instructed(now)?;
        if now < self.surge_until.load(Ordering::Acquire) {
            Some(Ratio(self.surge.load(Ordering::Relaxed)))
        } else {
            Some(ratio)
        }
    }

    /// The instruction's own ratio at `now`, without the surge correction.
    pub fn instructed(&self, now: Nanos) -> Option<Ratio> {
        if now >= self.expires_at.load(Ordering::Acquire) {
            None
        } else {
            Some(Ratio(self.ratio.load(Ordering::Relaxed)))
        }
    }

    /// The ratio in force at `now` for requests of `tier`, or `None` once the instruction has
    /// expired.
    #[inline]
    pub fn current_for(&self, now: Nanos, tier: Criticality) -> Option<Ratio> {
        if now >= self.expires_at.load(Ordering::Acquire) {
            None
        } else if now < self.surge_until.load(Ordering::Acquire) {
            Some(Ratio(
                self.surge_tiers[tier.index()].load(Ordering::Relaxed),
            ))
        } else {
            Some(Ratio(self.tiers[tier.index()].load(Ordering::Relaxed)))
        }
    }

    /// Decides one request of `tier` at `now` with the thread-local generator (the schedule's
    /// dither, or the coin).
    #[inline]
    pub fn decide(&self, now: Nanos, tier: Criticality) -> Verdict {
        match self.current_for(now, tier) {
            Some(r) if r != Ratio::ZERO => self.verdict(r, tier, fastrand::u32(..)),
            _ => Verdict::Allow,
        }
    }

    /// Decides one request of `tier` at `now` with the caller's generator, for deterministic
    /// simulations.
    #[inline]
    pub fn decide_with(&self, now: Nanos, tier: Criticality, rng: &mut fastrand::Rng) -> Verdict {
        match self.current_for(now, tier) {
            Some(r) if r != Ratio::ZERO => self.verdict(r, tier, rng.u32(..)),
            _ => Verdict::Allow,
        }
    }

    /// Drops `r` given a uniform `u32`: the coin, or the tier's schedule with that dither.
    #[inline]
    fn verdict(&self, r: Ratio, tier: Criticality, random: u32) -> Verdict {
        let admit = if self.schedule.is_empty() {
            !r.hits(random)
        } else {
            self.schedule_admits(r, tier, random)
        };
        if admit {
            Verdict::Allow
        } else {
            deny_after(nanos(self.retry_after))
        }
    }

    /// One step of error diffusion on this thread's stripe: admit with chance `(1 - r) + e / 4`
    /// (from `random`), where `e` is what the stripe owes, then add `1 - r` to it and take the
    /// admitted request off.
    #[inline]
    fn schedule_admits(&self, r: Ratio, tier: Criticality, random: u32) -> bool {
        let scale = Ratio::SCALE as i64;
        let keep = scale - r.raw() as i64;
        let stripe = thread_stripe() & (SCHEDULE_STRIPES - 1);
        let stripe = &self.schedule[stripe * TIERS + tier.index()].0;
        let mut admit = false;
        // Never fails: the closure always returns a value.
        let _ = stripe.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            let owed = bits as i64;
            let chance = keep.saturating_add(owed >> OWED_SHIFT).clamp(0, scale);
            admit = i64::from(random) < chance;
            let owed = owed + keep - if admit { scale } else { 0 };
            Some(owed as u64)
        });
        admit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_fixed_point() {
        assert_eq!(Ratio::from_fraction(1, 3).raw(), 1_431_655_766);
        assert_eq!(Ratio::from_fraction(5, 3), Ratio::ONE);
        assert_eq!(Ratio::from_fraction(1, 0), Ratio::ZERO);
        assert_eq!(Ratio::from_f64(f64::NAN), Ratio::ZERO);
        assert_eq!(Ratio::from_f64(0.5).raw(), 1 << 31);
        assert!(Ratio::ONE.hits(u32::MAX));
        assert!(!Ratio::ZERO.hits(0));
    }

    #[test]
    fn expired_instruction_allows() {
        let d = DropRatio::new(Duration::from_secs(1));
        assert_eq!(d.current(0), None);
        d.set(Ratio::ONE, 100);
        assert_eq!(
            d.decide(99, Criticality::Critical),
            Verdict::Deny {
                retry_after: Duration::from_secs(1)
            }
        );
        assert_eq!(d.decide(100, Criticality::Critical), Verdict::Allow);
        d.set_for(Ratio::ONE, 100, Duration::from_nanos(50));
        assert!(!d.decide(149, Criticality::Critical).is_allow());
        d.clear();
        assert!(d.decide(149, Criticality::Critical).is_allow());
    }

    #[test]
    fn the_clients_own_ratio_holds_only_while_both_hold() {
        let d = DropRatio::new(Duration::from_secs(1));
        let half = Ratio::from_fraction(1, 2);
        let most = Ratio::from_fraction(9, 10);
        // No instruction: a correction alone drops nothing (fail-open).
        d.set_surge(most, 1_000);
        assert_eq!(d.current(10), None);
        d.set(half, 500);
        assert_eq!(d.current(10), Some(most));
        assert_eq!(d.instructed(10), Some(half));
        // A ratio below the instruction's lowers it while it holds (the load fell).
        d.set_surge(Ratio::from_fraction(1, 10), 1_000);
        assert_eq!(d.current(10), Some(Ratio::from_fraction(1, 10)));
        // Past the correction's end the instruction alone; past the instruction's, nothing.
        d.set_surge(most, 100);
        assert_eq!(d.current(100), Some(half));
        assert_eq!(d.current(500), None);
    }

    #[test]
    fn the_schedule_admits_the_kept_share_to_within_a_few_requests() {
        let mut rng = fastrand::Rng::with_seed(3);
        for (num, den) in [(1u64, 3u64), (2, 3), (14, 15), (1, 100), (99, 100)] {
            let d = DropRatio::new(Duration::from_secs(1));
            assert!(d.scheduled());
            d.set(Ratio::from_fraction(num, den), u64::MAX);
            let keep = 1.0 - num as f64 / den as f64;
            let mut admitted = 0u64;
            for n in 1..=3_000u64 {
                admitted += u64::from(d.decide_with(0, Criticality::Critical, &mut rng).is_allow());
                let expected = keep * n as f64;
                assert!(
                    (admitted as f64 - expected).abs() <= 5.0,
                    "{num}/{den}: {admitted} of {n}, expected {expected:.1}"
                );
            }
        }
    }

    #[test]
    fn round_robin_callers_get_equal_shares_from_the_schedule() {
        // Three callers take turns; at a drop ratio of 1/3 an undithered schedule would admit
        // the first two every time and the third never. 10,000 requests each: a coin's own
        // deviation is 0.005.
        let d = DropRatio::new(Duration::from_secs(1));
        d.set(Ratio::from_fraction(1, 3), u64::MAX);
        let mut rng = fastrand::Rng::with_seed(9);
        let mut admitted = [0u32; 3];
        for k in 0..30_000 {
            admitted[k % 3] +=
                u32::from(d.decide_with(0, Criticality::Critical, &mut rng).is_allow());
        }
        for a in admitted {
            assert!(
                (a as f64 / 10_000.0 - 2.0 / 3.0).abs() < 0.02,
                "{admitted:?}"
            );
        }
    }

    #[test]
    fn each_tier_drops_at_its_own_ratio_on_its_own_schedule() {
        // 1.5x the limit, 40% sheddable: the split drops 5/6 of sheddable and no critical.
        let d = DropRatio::new(Duration::from_secs(1));
        let split = crate::criticality::shed_lowest_first(1.0 / 3.0, &[0, 600, 0, 400]);
        d.set_tiers(
            Ratio::from_fraction(1, 3),
            &tier_ratios(Ratio::from_fraction(1, 3), split),
            u64::MAX,
        );
        let mut rng = fastrand::Rng::with_seed(5);
        let (mut critical, mut sheddable) = (0u32, 0u32);
        for k in 0..10_000 {
            if k % 5 < 3 {
                critical += u32::from(d.decide_with(0, Criticality::Critical, &mut rng).is_allow());
            } else {
                sheddable += u32::from(
                    d.decide_with(0, Criticality::Sheddable, &mut rng)
                        .is_allow(),
                );
            }
        }
        assert_eq!(critical, 6_000, "no critical request is dropped");
        assert!(
            (sheddable as f64 - 4_000.0 / 6.0).abs() <= 5.0,
            "{sheddable}"
        );
        assert_eq!(d.current(0), Some(Ratio::from_fraction(1, 3)));
        assert_eq!(d.current_for(0, Criticality::Critical), Some(Ratio::ZERO));
        assert_eq!(
            d.current_for(0, Criticality::Sheddable),
            Some(Ratio::from_f64(5.0 / 6.0))
        );
        // The client's own ratio has tiers of its own while it holds.
        d.set_surge_tiers(Ratio::ONE, &uniform(Ratio::ONE), 10);
        assert!(!d.decide(5, Criticality::Critical).is_allow());
        assert!(d.decide(10, Criticality::Critical).is_allow());
    }

    #[test]
    fn the_coin_drops_independently() {
        let d = DropRatio::with_coin(Duration::from_secs(1));
        assert!(!d.scheduled());
        d.set(Ratio::from_fraction(1, 3), u64::MAX);
        let mut rng = fastrand::Rng::with_seed(1);
        // What a caller sending 30 requests gets through, over 2,000 such callers: the coin's
        // spread is a binomial's, sqrt(30 x 2/9) = 2.6 requests; the schedule's is the few
        // requests it may owe.
        let spread = |d: &DropRatio, rng: &mut fastrand::Rng| {
            let counts: Vec<f64> = (0..2_000)
                .map(|_| {
                    (0..30)
                        .filter(|_| d.decide_with(0, Criticality::Critical, rng).is_allow())
                        .count() as f64
                })
                .collect();
            let mean = counts.iter().sum::<f64>() / counts.len() as f64;
            let var = counts.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / counts.len() as f64;
            (mean, var.sqrt())
        };
        let (mean, coin) = spread(&d, &mut rng);
        assert!(
            (mean - 20.0).abs() < 0.3 && (2.3..2.9).contains(&coin),
            "{mean} {coin}"
        );
        let s = DropRatio::new(Duration::from_secs(1));
        s.set(Ratio::from_fraction(1, 3), u64::MAX);
        let (mean, scheduled) = spread(&s, &mut rng);
        assert!((mean - 20.0).abs() < 0.1, "{mean}");
        assert!(
            scheduled < coin / 2.0,
            "{scheduled} against the coin's {coin}"
        );
    }
}
