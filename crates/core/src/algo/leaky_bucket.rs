//! Leaky bucket: smooth pacing at the rate, for backends that need an even flow.
//!
//! The bucket is a queue drained at the rate. A request is admitted when the queue in front of it
//! drains within `burst` emission intervals (0 by default: only an empty queue admits), and then
//! adds `cost` intervals of work. So requests leave spaced by their cost, a weighted request is
//! never refused for being large, and a heavy one delays the next. Same one-word meter as the
//! token bucket (see [`super::gcra`]), with the tolerance checked before charging.

use super::gcra::{Check, Meter};
use super::{ParamError, Quota, Rate};
use crate::clock::Nanos;
use crate::decision::Verdict;

/// A leaky bucket at `rate` that tolerates a backlog of `burst` intervals.
///
/// At 100/s (10 ms apart) with no burst, requests at 0, 4 and 10 ms see: admitted, retry in 6 ms,
/// admitted. A cost-5 request at 20 ms is admitted and the next fits at 70 ms. Admitted cost in
/// any window of one period is at most `count + burst + (largest cost - 1)`.
#[derive(Debug)]
pub struct LeakyBucket {
    meter: Meter,
}

impl LeakyBucket {
    /// A leaky bucket draining at `rate` that admits while the backlog is at most `burst`
    /// intervals (default 0, strict pacing).
    pub fn new(rate: Rate, burst: Option<u64>) -> Result<Self, ParamError> {
        Ok(Self {
            meter: Meter::new(rate, burst.unwrap_or(0), Check::BeforeCharge)?,
        })
    }

    /// Admits the request at `now` if the backlog allows, charging `cost` intervals.
    #[inline]
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        self.meter.decide(now, cost)
    }

    /// The backlog the bucket tolerates, in intervals.
    pub fn burst(&self) -> u64 {
        self.meter.capacity()
    }

    /// Nanoseconds of drain per unit of cost.
    pub fn interval_ns(&self) -> Nanos {
        self.meter.interval()
    }

    /// Requests of cost 1 still admitted at `now`, and the time until the queue has drained.
    pub fn quota(&self, now: Nanos) -> Quota {
        self.meter.quota(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    #[test]
    fn paces_requests_by_their_cost() {
        let b = LeakyBucket::new(Rate::per_second(100).unwrap(), None).unwrap();
        assert!(b.decide(0, 1).is_allow());
        assert_eq!(
            b.decide(4 * MS, 1),
            Verdict::Deny {
                retry_after: Duration::from_millis(6)
            }
        );
        assert!(b.decide(10 * MS, 1).is_allow());
        assert!(b.decide(20 * MS, 5).is_allow());
        assert!(!b.decide(69 * MS, 1).is_allow());
        assert!(b.decide(70 * MS, 1).is_allow());
    }
}
