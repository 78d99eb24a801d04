//! Sliding-window counter: the weighted two-window approximation of a sliding window.
//!
//! Keeps only the count of the current fixed window and of the previous one, and estimates the
//! sliding window ending now as `previous x (share of the previous window still inside) +
//! current`. Two atomic words, no lock, no per-request memory; the price is an approximation,
//! bounded below.

use std::sync::atomic::{AtomicU64, Ordering};

use super::fixed_window::MAX_SKEW_WINDOWS;
use std::time::Duration;

use super::{ParamError, Quota, Rate, deny_after, deny_never};
use crate::clock::Nanos;
use crate::decision::Verdict;

/// A sliding-window counter of `count` units per `period`.
///
/// A request of cost `c` at offset `e` into window `k` is admitted when
/// `prev x (P - e) / P + cur + c <= count`, where `prev` and `cur` are the units admitted in
/// windows `k-1` and `k` and `P` is the period. All in integers: `prev x (P - e) + (cur + c) x P
/// <= count x P`.
///
/// # Error bound
/// - **Never more than `count` per aligned window**: `cur <= count` always, so each fixed window
///   `[kP, (k+1)P)` admits at most `count`, and any sliding window of length `P` (which spans two
///   of them) admits less than `2 x count`.
/// - **The estimate is exact when the previous window's traffic was uniform**, so on steady
///   traffic it agrees with the sliding-window log.
/// - **Worst case**: traffic bunched at the end of window `k-1` is under-counted. At 100 per
///   minute, 100 requests at 59.9 s and another 99 at 119.8 s are all admitted (at 119.8 s the
///   estimate weighs the previous window by 0.2/60, counting 0.33 of its 100), so the sliding
///   minute ending at 119.8 s holds 199: the `2 x count` bound is approached. Bunched at the
///   start of a window instead, traffic is over-counted and the counter admits less than the
///   log would.
///
/// Each window's count is a 32-bit field, so the count must fit 32 bits.
#[derive(Debug)]
pub struct SlidingWindowCounter {
    /// Window `k` lives in slot `k % 2`, tagged with `k` (low 32 bits) beside its count.
    slots: [AtomicU64; 2],
    count: u64,
    period: Nanos,
}

fn tag(v: u64) -> u32 {
    (v >> 32) as u32
}

fn used(v: u64) -> u64 {
    v & u64::from(u32::MAX)
}

impl SlidingWindowCounter {
    /// A counter of `rate.count()` units per `rate.period()`.
    pub fn new(rate: Rate) -> Result<Self, ParamError> {
        if rate.count() > u64::from(u32::MAX) {
            return Err(ParamError::CountTooLarge {
                count: rate.count(),
                max: u64::from(u32::MAX),
            });
        }
        Ok(Self {
            slots: [AtomicU64::new(0), AtomicU64::new(0)],
            count: rate.count(),
            period: rate.period_ns(),
        })
    }

    /// Charges `cost` units at `now` if the estimate allows.
    #[inline]
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        if cost == 0 {
            return Verdict::Allow;
        }
        if cost > self.count {
            return deny_never();
        }
        let p = self.period;
        let mut now = now;
        loop {
            let window = now / p;
            let offset = now % p;
            let slot = &self.slots[(window & 1) as usize];
            let current = slot.load(Ordering::Relaxed);
            let ahead = tag(current).wrapping_sub(window as u32);
            if ahead != 0 && used(current) > 0 && ahead <= MAX_SKEW_WINDOWS {
                // A thread with a later clock already opened a newer window in this slot: decide
                // as of that window's start instead of wiping it.
                now = (window + u64::from(ahead)) * p;
                continue;
            }
            let cur = if ahead == 0 { used(current) } else { 0 };
            let other = self.slots[((window + 1) & 1) as usize].load(Ordering::Relaxed);
            let prev = if tag(other) == (window as u32).wrapping_sub(1) {
                used(other)
            } else {
                0
            };
            let weighted = u128::from(prev) * u128::from(p - offset);
            if weighted + u128::from(cur + cost) * u128::from(p)
                > u128::from(self.count) * u128::from(p)
            {
                return deny_after(self.retry_after(prev, cur, offset, cost));
            }
            let next = (u64::from(window as u32) << 32) | (cur + cost);
            if slot
                .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                return Verdict::Allow;
            }
        }
    }

    /// Units the estimate still admits at `now`, and the time until it has faded to nothing: the
    /// current window's count weighs until the end of the next window. At 10/s with 10 in the
    /// previous second and 5 in this one, at 1.5 s: 10 x 0.5 + 5 = 10 used, 0 left, reset in
    /// 1.5 s.
    pub fn quota(&self, now: Nanos) -> Quota {
        let p = self.period;
        let window = now / p;
        let offset = now % p;
        let current = self.slots[(window & 1) as usize].load(Ordering::Relaxed);
        let cur = if tag(current) == window as u32 {
            used(current)
        } else {
            0
        };
        let other = self.slots[((window + 1) & 1) as usize].load(Ordering::Relaxed);
        let prev = if tag(other) == (window as u32).wrapping_sub(1) {
            used(other)
        } else {
            0
        };
        let estimate = u128::from(prev) * u128::from(p - offset) + u128::from(cur) * u128::from(p);
        let room = (u128::from(self.count) * u128::from(p)).saturating_sub(estimate);
        let reset = if cur > 0 {
            p - offset + p
        } else if prev > 0 {
            p - offset
        } else {
            0
        };
        Quota {
            remaining: u64::try_from(room / u128::from(p)).unwrap_or(u64::MAX),
            reset: Duration::from_nanos(reset),
        }
    }

    /// The earliest wait after which the estimate admits `cost`, if nothing else arrives: later
    /// in this window as `prev` fades, or in the next one, where this window's `cur` becomes the
    /// fading previous count. Exact: one nanosecond earlier the estimate is still too high.
    fn retry_after(&self, prev: u64, cur: u64, offset: Nanos, cost: u64) -> Nanos {
        let p = self.period;
        let p128 = u128::from(p);
        if cur + cost <= self.count && prev > 0 {
            // Need prev x (P - e) <= (count - cur - cost) x P, i.e. P - e <= x.
            let x = u128::from(self.count - cur - cost) * p128 / u128::from(prev);
            if x < p128 {
                let e = p - x as u64;
                if e < p {
                    return e - offset;
                }
            }
        }
        let e = if cur == 0 {
            0
        } else {
            let x = u128::from(self.count - cost) * p128 / u128::from(cur);
            if x >= p128 { 0 } else { p - x as u64 }
        };
        p - offset + e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    #[test]
    fn worked_example_of_the_error_bound() {
        let c =
            SlidingWindowCounter::new(Rate::new(100, Duration::from_secs(60)).unwrap()).unwrap();
        assert!(c.decide(59_900 * MS, 100).is_allow());
        // At 60 s the previous window still weighs fully: nothing fits.
        assert!(!c.decide(60_000 * MS, 1).is_allow());
        // At 119.8 s it weighs 0.2/60 of 100 = 0.33, so 99 more fit; 100 would not.
        assert!(!c.decide(119_800 * MS, 100).is_allow());
        assert!(c.decide(119_800 * MS, 99).is_allow());
    }

    #[test]
    fn uniform_previous_window_fades_linearly() {
        let c = SlidingWindowCounter::new(Rate::per_second(10).unwrap()).unwrap();
        assert!(c.decide(0, 10).is_allow());
        // At 1.5 s the estimate is 10 x 0.5 = 5, so 5 more fit and the 6th waits 100 ms.
        assert!(c.decide(1_500 * MS, 5).is_allow());
        assert_eq!(
            c.decide(1_500 * MS, 1),
            Verdict::Deny {
                retry_after: Duration::from_millis(100)
            }
        );
    }
}
