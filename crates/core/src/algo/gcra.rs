//! GCRA, the generic cell rate algorithm, and the one-word meter that the token and leaky buckets share.
//!
//! A meter keeps a single number, the theoretical arrival time (TAT): the instant at which the
//! bucket would be full again if nothing else arrived. Charging `cost` units moves the TAT
//! `cost x interval` later; a request is admitted while the TAT stays within the tolerance of
//! `now`. The whole state is one `AtomicU64`, updated by compare-exchange, so deciding takes no
//! lock and two threads never lose an update.

use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use super::{ParamError, Quota, Rate, deny_after, deny_never};
use crate::clock::Nanos;
use crate::decision::Verdict;

/// When the tolerance is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// After charging: the TAT including this request must be within the tolerance. The bucket
    /// holds `tolerance / interval` units, and a larger cost never fits (token bucket, GCRA).
    AfterCharge,
    /// Before charging: the backlog in front of this request must be within the tolerance; the
    /// request may then overfill it (leaky bucket as a queue that paces its output).
    BeforeCharge,
}

/// The shared meter.
#[derive(Debug)]
pub(crate) struct Meter {
    tat: AtomicU64,
    interval: Nanos,
    capacity: u64,
    tolerance: Nanos,
    check: Check,
}

impl Meter {
    /// A meter at `rate` whose tolerance is `capacity` intervals; it starts full (idle).
    pub(crate) fn new(rate: Rate, capacity: u64, check: Check) -> Result<Self, ParamError> {
        let interval = rate.emission_interval_ns();
        let tolerance = capacity
            .checked_mul(interval)
            .ok_or(ParamError::BurstTooLarge {
                burst: capacity,
                interval_ns: interval,
            })?;
        Ok(Self {
            tat: AtomicU64::new(0),
            interval,
            capacity,
            tolerance,
            check,
        })
    }

    #[inline]
    pub(crate) fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        if cost == 0 {
            return Verdict::Allow;
        }
        if self.check == Check::AfterCharge && cost > self.capacity {
            return deny_never();
        }
        let Some(charge) = cost.checked_mul(self.interval) else {
            return deny_never();
        };
        // Relaxed is enough: the TAT is the only shared location, and compare-exchange orders
        // every update to it.
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now);
            let Some(next) = start.checked_add(charge) else {
                return deny_never();
            };
            let reach = match self.check {
                Check::AfterCharge => next - now,
                Check::BeforeCharge => start - now,
            };
            if reach > self.tolerance {
                // Exact: at `now + excess` the reach is exactly the tolerance.
                return deny_after(reach - self.tolerance);
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Verdict::Allow,
                Err(seen) => tat = seen,
            }
        }
    }

    /// Admits a request whose cost its response will report: `estimate` units are reserved as
    /// [`Meter::decide`] would charge them, and without an estimate the request needs only one
    /// unit's room (the bucket is not empty and not in debt) and charges nothing yet. A bucket
    /// in debt refuses until refill has paid the debt back.
    #[inline]
    pub(crate) fn admit_owing(&self, now: Nanos, estimate: u64) -> Verdict {
        if estimate > 0 {
            return self.decide(now, estimate);
        }
        let tat = self.tat.load(Ordering::Relaxed);
        let reach = (tat.max(now) - now).saturating_add(self.interval);
        if reach > self.tolerance {
            deny_after(reach - self.tolerance)
        } else {
            Verdict::Allow
        }
    }

    /// Settles a request admitted by [`Meter::admit_owing`] that reserved `reserved` units and
    /// turned out to cost `actual`: the difference is debited whatever the bucket holds (so it
    /// may go into debt: the TAT beyond the tolerance), or refunded, never beyond full. One
    /// atomic update, so settlements and decisions never lose each other's charges.
    pub(crate) fn settle(&self, now: Nanos, reserved: u64, actual: u64) {
        if actual == reserved {
            return;
        }
        let interval = self.interval;
        let _ = self
            .tat
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
                Some(if actual > reserved {
                    let owed = (actual - reserved).saturating_mul(interval);
                    tat.max(now).saturating_add(owed)
                } else if tat > now {
                    let back = (reserved - actual).saturating_mul(interval);
                    tat.saturating_sub(back).max(now)
                } else {
                    tat
                })
            });
    }

    /// Units owed at `now`: how far the bucket is below empty (0 when it is not in debt).
    pub(crate) fn debt(&self, now: Nanos) -> u64 {
        let ahead = self.tat.load(Ordering::Relaxed).saturating_sub(now);
        ahead.saturating_sub(self.tolerance).div_ceil(self.interval)
    }

    /// Whole units left at `now`: the tolerance not yet used, in intervals. Negative only if the
    /// meter had admitted more than its definition allows.
    pub(crate) fn available(&self, now: Nanos) -> i64 {
        let debt = i128::from(self.tat.load(Ordering::Relaxed).saturating_sub(now));
        let left = (i128::from(self.tolerance) - debt).div_euclid(i128::from(self.interval));
        i64::try_from(left).unwrap_or(if left < 0 { i64::MIN } else { i64::MAX })
    }

    pub(crate) fn interval(&self) -> Nanos {
        self.interval
    }

    /// What the meter still admits at `now` in units of cost 1, and when it is idle (full) again:
    /// the debt in front of `now`. A token bucket of 10 at 1 per 100 ms that just took 4 has 6
    /// left and is full again in 400 ms; a leaky bucket without burst and an empty queue admits 1.
    pub(crate) fn quota(&self, now: Nanos) -> Quota {
        let debt = self.tat.load(Ordering::Relaxed).saturating_sub(now);
        let room = self.tolerance.checked_sub(debt);
        let remaining = match (self.check, room) {
            (_, None) => 0,
            (Check::AfterCharge, Some(room)) => room / self.interval,
            (Check::BeforeCharge, Some(room)) => room / self.interval + 1,
        };
        Quota {
            remaining,
            reset: Duration::from_nanos(debt),
        }
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// GCRA as governor and redis-cell define it: `rate` with bursts of up to `burst` units (default:
/// the rate's count).
///
/// At 5,000/s with a burst of 100, the emission interval is 200 µs and the tolerance 20 ms: an
/// idle key admits 100 requests at once, then one every 200 µs. GCRA and the token bucket are the
/// same meter (a TAT within `burst` intervals of now is a bucket with tokens left); both names
/// exist because users know both.
#[derive(Debug)]
pub struct Gcra {
    meter: Meter,
}

impl Gcra {
    /// GCRA at `rate` with a maximum burst of `burst` units (default `rate.count()`).
    pub fn new(rate: Rate, burst: Option<u64>) -> Result<Self, ParamError> {
        let burst = burst.unwrap_or(rate.count());
        if burst == 0 {
            return Err(ParamError::ZeroBurst);
        }
        Ok(Self {
            meter: Meter::new(rate, burst, Check::AfterCharge)?,
        })
    }

    /// Decides a request of `cost` units at `now`; a cost above the burst never fits.
    #[inline]
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        self.meter.decide(now, cost)
    }

    /// The emission interval in nanoseconds.
    pub fn interval_ns(&self) -> Nanos {
        self.meter.interval()
    }

    /// The maximum burst in units.
    pub fn burst(&self) -> u64 {
        self.meter.capacity()
    }

    /// Units left at `now` and the time until the burst is whole again.
    pub fn quota(&self, now: Nanos) -> Quota {
        self.meter.quota(now)
    }

    /// Admits a request whose response reports its cost (see [`super::Limiter::admit_owing`]).
    #[inline]
    pub fn admit_owing(&self, now: Nanos, estimate: u64) -> Verdict {
        self.meter.admit_owing(now, estimate)
    }

    /// Debits (or refunds) what a response reported against what was reserved.
    pub fn settle(&self, now: Nanos, reserved: u64, actual: u64) {
        self.meter.settle(now, reserved, actual);
    }

    /// Units owed at `now` (0 when not in debt).
    pub fn debt(&self, now: Nanos) -> u64 {
        self.meter.debt(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_one_per_interval() {
        let g = Gcra::new(Rate::per_second(5000).unwrap(), Some(100)).unwrap();
        for _ in 0..100 {
            assert!(g.decide(0, 1).is_allow());
        }
        assert_eq!(
            g.decide(0, 1),
            Verdict::Deny {
                retry_after: Duration::from_micros(200)
            }
        );
        assert!(g.decide(200_000, 1).is_allow());
    }

    #[test]
    fn a_reported_cost_puts_the_meter_into_debt_that_refill_pays_back() {
        // 10 per second, 10 held: an interval of 100 ms.
        let g = Gcra::new(Rate::per_second(10).unwrap(), None).unwrap();
        assert!(g.admit_owing(0, 0).is_allow());
        assert_eq!(
            g.quota(0).remaining,
            10,
            "nothing reserved without an estimate"
        );
        // The response reports 25: 15 owed beyond empty.
        g.settle(0, 0, 25);
        assert_eq!(g.debt(0), 15);
        assert_eq!(g.quota(0).remaining, 0);
        // Refused until the 15 owed and one unit of room have refilled: 1.6 s.
        assert_eq!(
            g.admit_owing(0, 0),
            Verdict::Deny {
                retry_after: Duration::from_millis(1600)
            }
        );
        assert!(!g.decide(1_500_000_000, 1).is_allow());
        assert!(g.admit_owing(1_600_000_000, 0).is_allow());
        assert_eq!(g.debt(1_600_000_000), 0);
    }

    #[test]
    fn an_estimate_is_reserved_then_topped_up_or_refunded() {
        let g = Gcra::new(Rate::per_second(10).unwrap(), None).unwrap();
        assert!(g.admit_owing(0, 4).is_allow());
        assert_eq!(g.quota(0).remaining, 6);
        g.settle(0, 4, 1);
        assert_eq!(g.quota(0).remaining, 9, "3 of the 4 reserved come back");
        assert!(g.admit_owing(0, 4).is_allow());
        g.settle(0, 4, 7);
        assert_eq!(g.quota(0).remaining, 2);
        // A refund never fills the bucket beyond full.
        g.settle(10_000_000_000, 4, 0);
        assert_eq!(g.quota(10_000_000_000).remaining, 10);
        // An estimate larger than what is left is refused, like any cost.
        g.settle(10_000_000_000, 0, 8);
        assert!(!g.admit_owing(10_000_000_000, 4).is_allow());
        assert!(g.admit_owing(10_000_000_000, 0).is_allow());
    }

    #[test]
    fn settlements_from_many_threads_lose_no_debit() {
        let g = Gcra::new(Rate::per_second(10).unwrap(), None).unwrap();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        g.settle(0, 0, 3);
                    }
                });
            }
        });
        // 12,000 debited on a bucket of 10 that started full.
        assert_eq!(g.debt(0), 11_990);
    }
}
