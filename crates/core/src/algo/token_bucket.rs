//! Token bucket: a capacity of tokens refilled at a rate; a request takes `cost` tokens.
//!
//! Stored as the instant the bucket will be full again (see [`super::gcra`]), which needs one
//! atomic word where "tokens and last refill time" would need two updated together.

use super::gcra::{Check, Meter};
use super::{ParamError, Quota, Rate};
use crate::clock::Nanos;
use crate::decision::Verdict;

/// A token bucket holding up to `capacity` tokens, refilled at `rate`, starting full.
///
/// The example of 10,000 tokens refilled at 1,000/s: an idle bucket admits 10,000 requests at once;
/// after that one token returns every millisecond, and a request finding the bucket empty is told
/// to retry in exactly the time its missing tokens take to return (1 ms for a cost of 1, 100 ms
/// for a cost of 100). Admitted cost over any stretch of `t` never exceeds
/// `capacity + t / interval`.
#[derive(Debug)]
pub struct TokenBucket {
    meter: Meter,
}

impl TokenBucket {
    /// A bucket refilled at `rate` with `capacity` tokens (default `rate.count()`, one period's
    /// worth).
    pub fn new(rate: Rate, capacity: Option<u64>) -> Result<Self, ParamError> {
        let capacity = capacity.unwrap_or(rate.count());
        if capacity == 0 {
            return Err(ParamError::ZeroBurst);
        }
        Ok(Self {
            meter: Meter::new(rate, capacity, Check::AfterCharge)?,
        })
    }

    /// Takes `cost` tokens at `now` if they are there; a cost above the capacity never fits.
    #[inline]
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        self.meter.decide(now, cost)
    }

    /// Whole tokens in the bucket at `now` (never below zero unless the bucket is broken).
    pub fn tokens(&self, now: Nanos) -> i64 {
        self.meter.available(now)
    }

    /// The capacity in tokens.
    pub fn capacity(&self) -> u64 {
        self.meter.capacity()
    }

    /// Nanoseconds for one token to return.
    pub fn interval_ns(&self) -> Nanos {
        self.meter.interval()
    }

    /// Tokens left at `now` and the time until the bucket is full again.
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

    /// Tokens owed at `now` (0 when not in debt).
    pub fn debt(&self, now: Nanos) -> u64 {
        self.meter.debt(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn s5_example_refills_one_token_per_millisecond() {
        let b = TokenBucket::new(Rate::per_second(1000).unwrap(), Some(10_000)).unwrap();
        assert_eq!(b.tokens(0), 10_000);
        assert!(b.decide(0, 10_000).is_allow());
        assert_eq!(b.tokens(0), 0);
        assert_eq!(
            b.decide(0, 100),
            Verdict::Deny {
                retry_after: Duration::from_millis(100)
            }
        );
        assert_eq!(b.tokens(1_000_000), 1);
        assert!(b.decide(100_000_000, 100).is_allow());
    }
}
