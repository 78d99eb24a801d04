//! Drop-by-ratio (G8): drop each request with the probability the control plane sent, until the
//! instruction expires (G9).
//!
//! The hot path is four atomic loads (the instruction and the client's own surge correction,
//! each a ratio and an expiry) and a thread-local coin: no lock, no allocation, no syscall.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::deny_after;
use crate::clock::{Nanos, nanos};
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

/// The drop-ratio limiter of one bucket on one client: the current instruction (a [`Ratio`] and
/// the instant it expires).
///
/// The control plane sends `drop 1/3 until t+5s`; from then on each request is dropped with
/// probability 1/3, so at 1.5x the limit two thirds get through, on every instance alike. When
/// `t+5s` passes without a newer instruction the limiter admits everything again (fail-open,
/// G9). A new limiter has no instruction and admits everything.
#[derive(Debug)]
pub struct DropRatio {
    ratio: AtomicU64,
    expires_at: AtomicU64,
    /// The client's own correction between instructions ([`crate::surge`]), applied when higher.
    surge: AtomicU64,
    surge_until: AtomicU64,
    retry_after: Duration,
}

impl DropRatio {
    /// A limiter with no instruction whose drops suggest retrying after `retry_after` (the
    /// control interval is a good choice: the next instruction may differ). Retry-after is a hint
    /// here, not W4's exact promise, since any retry passes with probability `1 - ratio`.
    pub fn new(retry_after: Duration) -> Self {
        Self {
            ratio: AtomicU64::new(0),
            expires_at: AtomicU64::new(0),
            surge: AtomicU64::new(0),
            surge_until: AtomicU64::new(0),
            retry_after,
        }
    }

    /// Installs an instruction: drop with probability `ratio` until `expires_at`.
    pub fn set(&self, ratio: Ratio, expires_at: Nanos) {
        // Ratio first, expiry second (release): a reader that sees the new expiry sees the new
        // ratio. One that sees the old expiry with the new ratio applies the newer ratio a moment
        // early, which is harmless.
        self.ratio.store(ratio.raw(), Ordering::Relaxed);
        self.expires_at.store(expires_at, Ordering::Release);
    }

    /// Installs an instruction valid for `ttl` from `now`.
    pub fn set_for(&self, ratio: Ratio, now: Nanos, ttl: Duration) {
        self.set(ratio, now.saturating_add(nanos(ttl)));
    }

    /// Installs the client's own surge correction until `until`: while it holds, the higher of
    /// it and the instruction's ratio is dropped. It never outlives the instruction (G9).
    pub fn set_surge(&self, ratio: Ratio, until: Nanos) {
        self.surge.store(ratio.raw(), Ordering::Relaxed);
        self.surge_until.store(until, Ordering::Release);
    }

    /// Forgets the instruction, so everything is admitted.
    pub fn clear(&self) {
        self.expires_at.store(0, Ordering::Release);
        self.surge_until.store(0, Ordering::Release);
    }

    /// The ratio in force at `now`, or `None` once the instruction has expired: the
    /// instruction's, or the surge correction's when that holds and is higher.
    pub fn current(&self, now: Nanos) -> Option<Ratio> {
        let ratio = self.instructed(now)?;
        if now < self.surge_until.load(Ordering::Acquire) {
            Some(ratio.max(Ratio(self.surge.load(Ordering::Relaxed))))
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

    /// Decides one request at `now` with the thread-local coin.
    #[inline]
    pub fn decide(&self, now: Nanos) -> Verdict {
        match self.current(now) {
            Some(r) if r != Ratio::ZERO && r.hits(fastrand::u32(..)) => {
                deny_after(nanos(self.retry_after))
            }
            _ => Verdict::Allow,
        }
    }

    /// Decides one request at `now` with the caller's generator, for deterministic simulations.
    #[inline]
    pub fn decide_with(&self, now: Nanos, rng: &mut fastrand::Rng) -> Verdict {
        match self.current(now) {
            Some(r) if r != Ratio::ZERO && r.hits(rng.u32(..)) => {
                deny_after(nanos(self.retry_after))
            }
            _ => Verdict::Allow,
        }
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
            d.decide(99),
            Verdict::Deny {
                retry_after: Duration::from_secs(1)
            }
        );
        assert_eq!(d.decide(100), Verdict::Allow);
        d.set_for(Ratio::ONE, 100, Duration::from_nanos(50));
        assert!(!d.decide(149).is_allow());
        d.clear();
        assert!(d.decide(149).is_allow());
    }

    #[test]
    fn the_surge_correction_adds_drops_only_while_both_hold() {
        let d = DropRatio::new(Duration::from_secs(1));
        let half = Ratio::from_fraction(1, 2);
        let most = Ratio::from_fraction(9, 10);
        // No instruction: a correction alone drops nothing (fail-open, G9).
        d.set_surge(most, 1_000);
        assert_eq!(d.current(10), None);
        d.set(half, 500);
        assert_eq!(d.current(10), Some(most));
        assert_eq!(d.instructed(10), Some(half));
        // A correction below the instruction changes nothing.
        d.set_surge(Ratio::from_fraction(1, 10), 1_000);
        assert_eq!(d.current(10), Some(half));
        // Past the correction's end the instruction alone; past the instruction's, nothing.
        d.set_surge(most, 100);
        assert_eq!(d.current(100), Some(half));
        assert_eq!(d.current(500), None);
    }
}
