//! Fixed window: at most `count` units in each aligned window of one period.
//!
//! Cheapest of the exact counters, but a client can spend a window's quota at its very end and
//! the next window's at the very start, so up to twice the count passes within one period
//! across a boundary. The sliding-window log does not have that flaw.

use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use super::{ParamError, Quota, Rate, deny_after, deny_never};
use crate::clock::Nanos;
use crate::decision::Verdict;

/// A fixed-window counter in one atomic word: the window number (low 32 bits) and the units used
/// in it (32 bits).
///
/// At 100 per minute, windows are `[0, 60s)`, `[60s, 120s)`, ...: the 101st unit at 59 s is told
/// to retry in 1 s, when the count resets. The window number wraps after 2^32 windows; a stale
/// count would only be mistaken for the current one if the bucket stayed idle for exactly a
/// multiple of 2^32 windows (136 years of one-second windows).
#[derive(Debug)]
pub struct FixedWindow {
    state: AtomicU64,
    count: u64,
    period: Nanos,
}

/// How many windows ahead of a request's own window a stored count may be and still be taken for
/// a newer window opened by a thread with a later clock (rather than a stale one to reset).
pub(crate) const MAX_SKEW_WINDOWS: u32 = 16;

fn pack(window: u64, used: u64) -> u64 {
    (window << 32) | used
}

impl FixedWindow {
    /// A fixed window of `rate.count()` units per `rate.period()`; the count must fit 32 bits.
    pub fn new(rate: Rate) -> Result<Self, ParamError> {
        if rate.count() > u64::from(u32::MAX) {
            return Err(ParamError::CountTooLarge {
                count: rate.count(),
                max: u64::from(u32::MAX),
            });
        }
        Ok(Self {
            // A count of 0 is right for any window, so the initial tag does not matter.
            state: AtomicU64::new(0),
            count: rate.count(),
            period: rate.period_ns(),
        })
    }

    /// Charges `cost` units to the window of `now` if they fit.
    #[inline]
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        if cost == 0 {
            return Verdict::Allow;
        }
        if cost > self.count {
            return deny_never();
        }
        let mut window = now / self.period;
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let tag = (current >> 32) as u32;
            let used = current & u64::from(u32::MAX);
            let ahead = tag.wrapping_sub(window as u32);
            let used = if ahead == 0 {
                used
            } else if used > 0 && ahead <= MAX_SKEW_WINDOWS {
                // Another thread read a later clock and opened a newer window: count this request
                // there rather than reopen an old window and lose the newer count.
                window += u64::from(ahead);
                used
            } else {
                0
            };
            if used + cost > self.count {
                let next = (window + 1).saturating_mul(self.period);
                return deny_after(next.saturating_sub(now));
            }
            let next = pack(u64::from(window as u32), used + cost);
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Verdict::Allow,
                Err(seen) => current = seen,
            }
        }
    }

    /// Units left in the window of `now`, and the time until it ends: at 100 per minute with 30
    /// used at 45 s, 70 left and a reset in 15 s.
    pub fn quota(&self, now: Nanos) -> Quota {
        let next = (now / self.period + 1).saturating_mul(self.period);
        Quota {
            remaining: self.count.saturating_sub(self.used(now)),
            reset: Duration::from_nanos(next.saturating_sub(now)),
        }
    }

    /// Units used in the window of `now`.
    pub fn used(&self, now: Nanos) -> u64 {
        let current = self.state.load(Ordering::Relaxed);
        if (current >> 32) as u32 == (now / self.period) as u32 {
            current & u64::from(u32::MAX)
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn resets_at_the_window_boundary() {
        let w = FixedWindow::new(Rate::new(100, Duration::from_secs(60)).unwrap()).unwrap();
        assert!(w.decide(0, 100).is_allow());
        assert_eq!(
            w.decide(59 * SEC, 1),
            Verdict::Deny {
                retry_after: Duration::from_secs(1)
            }
        );
        assert!(w.decide(60 * SEC, 100).is_allow());
        assert_eq!(w.used(61 * SEC), 100);
        // A request read against an older clock is charged to the newest window.
        assert!(!w.decide(59 * SEC, 1).is_allow());
    }
}
