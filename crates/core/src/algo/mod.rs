//! Limiter algorithms: each one decides a request of some cost against its own state.
//!
//! Every algorithm is sans-IO: `decide(now, cost)` takes the time as an argument and answers a
//! [`Verdict`]; none of them reads a clock. State is shared by reference between threads. The
//! meters ([`TokenBucket`], [`Gcra`], [`LeakyBucket`]) and the windows ([`FixedWindow`],
//! [`SlidingWindowCounter`]) live in one or two `AtomicU64`s updated by compare-exchange, so the
//! hot path takes no lock; [`SlidingWindowLog`] is a list by nature and sits behind a mutex, as
//! does [`AdaptiveTokenBucket`]'s ring of slots. [`DropRatio`] needs only two atomic loads and a
//! thread-local coin.
//!
//! A cost of 0 is always admitted and charges nothing. A cost larger than the algorithm could
//! ever admit at once is denied with a retry-after of [`crate::decision::NEVER`].

mod adaptive;
mod drop_ratio;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod sliding_counter;
mod sliding_log;
mod token_bucket;

use std::num::NonZeroU64;
use std::time::Duration;

pub use adaptive::{AdaptiveTokenBucket, DEFAULT_HISTORY_SECS, MAX_HISTORY_SECS, Share};
pub use drop_ratio::{DropRatio, Ratio, TierRatios, tier_ratios, uniform};
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use leaky_bucket::LeakyBucket;
pub use sliding_counter::SlidingWindowCounter;
pub use sliding_log::SlidingWindowLog;
pub use token_bucket::TokenBucket;

use crate::clock::{Nanos, nanos};
use crate::criticality::Criticality;
use crate::decision::{NEVER, Verdict};

/// Why algorithm parameters were refused. Each names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("a limit of 0 requests admits nothing; use a count of at least 1")]
    ZeroCount,
    #[error("a limit over a period of 0 is meaningless; use a period of at least 1ns")]
    ZeroPeriod,
    #[error("the period {period:?} is longer than the 584 years that fit in u64 nanoseconds")]
    PeriodTooLong { period: Duration },
    #[error(
        "{count} per {period_ns}ns is more than one request per nanosecond; lengthen the period or lower the count"
    )]
    RateTooHigh { count: u64, period_ns: u64 },
    #[error(
        "burst {burst} is too large: burst x emission interval ({interval_ns}ns) overflows u64 nanoseconds"
    )]
    BurstTooLarge { burst: u64, interval_ns: u64 },
    #[error("a burst of 0 admits nothing; use at least 1 or leave it unset")]
    ZeroBurst,
    #[error("count {count} is larger than this algorithm's maximum of {max} per window")]
    CountTooLarge { count: u64, max: u64 },
    #[error("history of {secs}s is out of range; use 1 to {max}s", max = MAX_HISTORY_SECS)]
    HistoryOutOfRange { secs: u64 },
}

/// What a limiter can still admit, read right after a decision: Envoy's `limit_remaining` and
/// `duration_until_reset`, and the `ratelimit` headers' remaining and reset.
///
/// `remaining` is in units of cost 1; `reset` is when the whole limit is free again: the end of
/// a fixed window, the time a meter (token bucket, GCRA, leaky bucket) takes to refill, the time
/// the newest entry of a sliding log takes to leave it. A request over the limit is told a
/// retry-after no longer than `reset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    pub remaining: u64,
    pub reset: Duration,
}

/// A limit as plain numbers: `count` units per `period`, both non-zero.
///
/// `Rate::new(5000, 1s)` is 5,000 per second, an emission interval of 200,000 ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    count: NonZeroU64,
    period_ns: NonZeroU64,
}

impl Rate {
    /// `count` per `period`. Refuses 0 for either, periods beyond u64 nanoseconds, and more
    /// than one unit per nanosecond.
    pub fn new(count: u64, period: Duration) -> Result<Self, ParamError> {
        if period.as_nanos() > u128::from(u64::MAX) {
            return Err(ParamError::PeriodTooLong { period });
        }
        Self::from_nanos(count, nanos(period))
    }

    /// `count` per `period_ns` nanoseconds.
    pub fn from_nanos(count: u64, period_ns: Nanos) -> Result<Self, ParamError> {
        let count = NonZeroU64::new(count).ok_or(ParamError::ZeroCount)?;
        let period = NonZeroU64::new(period_ns).ok_or(ParamError::ZeroPeriod)?;
        if count.get() > period.get() {
            return Err(ParamError::RateTooHigh {
                count: count.get(),
                period_ns,
            });
        }
        Ok(Self {
            count,
            period_ns: period,
        })
    }

    /// `count` per second.
    pub fn per_second(count: u64) -> Result<Self, ParamError> {
        Self::from_nanos(count, crate::clock::NANOS_PER_SEC)
    }

    /// Units per period.
    pub fn count(self) -> u64 {
        self.count.get()
    }

    /// The period in nanoseconds.
    pub fn period_ns(self) -> Nanos {
        self.period_ns.get()
    }

    /// The period.
    pub fn period(self) -> Duration {
        Duration::from_nanos(self.period_ns.get())
    }

    /// Nanoseconds per unit, rounded up so that a meter built on it never admits more than
    /// `count` per `period`: 3 per second gives 333,333,334 ns, so three units take
    /// 1.000000002 s instead of 1 s. The error is below one part in the interval (under 0.1% for
    /// any rate up to 1,000,000/s).
    pub fn emission_interval_ns(self) -> Nanos {
        self.period_ns.get().div_ceil(self.count.get())
    }

    /// The rate in units per second, for reporting and the control plane.
    pub fn per_sec_f64(self) -> f64 {
        self.count.get() as f64 * 1e9 / self.period_ns.get() as f64
    }
}

/// The algorithms by name, as the configuration spells them, in the order docs/configuration.md lists them.
/// `drop-ratio` is the default.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// The control plane computes a drop ratio that every client applies.
    #[default]
    DropRatio,
    /// Each client refills at its share of the global load.
    AdaptiveTokenBucket,
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindowLog,
    SlidingWindowCounter,
    Gcra,
}

impl Kind {
    /// Every kind, in the configuration reference's order.
    pub const ALL: [Kind; 8] = [
        Kind::DropRatio,
        Kind::AdaptiveTokenBucket,
        Kind::TokenBucket,
        Kind::LeakyBucket,
        Kind::FixedWindow,
        Kind::SlidingWindowLog,
        Kind::SlidingWindowCounter,
        Kind::Gcra,
    ];

    /// The configuration name, e.g. `sliding-window-log`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token-bucket",
            Kind::LeakyBucket => "leaky-bucket",
            Kind::FixedWindow => "fixed-window",
            Kind::SlidingWindowLog => "sliding-window-log",
            Kind::SlidingWindowCounter => "sliding-window-counter",
            Kind::Gcra => "gcra",
            Kind::AdaptiveTokenBucket => "adaptive-token-bucket",
            Kind::DropRatio => "drop-ratio",
        }
    }

    /// The kind for a configuration name.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kind takes a `burst`.
    pub fn takes_burst(self) -> bool {
        matches!(self, Kind::TokenBucket | Kind::LeakyBucket | Kind::Gcra)
    }
}

/// Any algorithm behind one type, for rule sets that mix them.
#[derive(Debug)]
pub enum Limiter {
    TokenBucket(TokenBucket),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    SlidingWindowLog(SlidingWindowLog),
    SlidingWindowCounter(SlidingWindowCounter),
    Gcra(Gcra),
    AdaptiveTokenBucket(AdaptiveTokenBucket),
    DropRatio(DropRatio),
}

impl Limiter {
    /// Builds the algorithm `kind` for `rate`, with `burst` where the kind takes one (it is
    /// ignored otherwise; configuration validation reports it). A drop-ratio limiter starts with
    /// no instruction, so it admits everything until the control plane sends one, and
    /// suggests the rate's period as retry-after.
    pub fn new(kind: Kind, rate: Rate, burst: Option<u64>) -> Result<Self, ParamError> {
        Ok(match kind {
            Kind::TokenBucket => Limiter::TokenBucket(TokenBucket::new(rate, burst)?),
            Kind::LeakyBucket => Limiter::LeakyBucket(LeakyBucket::new(rate, burst)?),
            Kind::FixedWindow => Limiter::FixedWindow(FixedWindow::new(rate)?),
            Kind::SlidingWindowLog => Limiter::SlidingWindowLog(SlidingWindowLog::new(rate)),
            Kind::SlidingWindowCounter => {
                Limiter::SlidingWindowCounter(SlidingWindowCounter::new(rate)?)
            }
            Kind::Gcra => Limiter::Gcra(Gcra::new(rate, burst)?),
            Kind::AdaptiveTokenBucket => {
                Limiter::AdaptiveTokenBucket(AdaptiveTokenBucket::new(rate, DEFAULT_HISTORY_SECS)?)
            }
            Kind::DropRatio => Limiter::DropRatio(DropRatio::new(rate.period())),
        })
    }

    /// Decides a request of `cost` units at `now`, of the default tier.
    #[inline]
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        self.decide_tier(now, cost, Criticality::default())
    }

    /// Decides a request of `cost` units and criticality `tier` at `now`: a drop-ratio bucket
    /// drops at the tier's ratio; every other algorithm ignores the tier.
    #[inline]
    pub fn decide_tier(&self, now: Nanos, cost: u64, tier: Criticality) -> Verdict {
        match self {
            Limiter::TokenBucket(a) => a.decide(now, cost),
            Limiter::LeakyBucket(a) => a.decide(now, cost),
            Limiter::FixedWindow(a) => a.decide(now, cost),
            Limiter::SlidingWindowLog(a) => a.decide(now, cost),
            Limiter::SlidingWindowCounter(a) => a.decide(now, cost),
            Limiter::Gcra(a) => a.decide(now, cost),
            Limiter::AdaptiveTokenBucket(a) => a.decide(now, cost),
            Limiter::DropRatio(a) => a.decide(now, tier),
        }
    }

    /// Admits a request whose cost its response will report (a token budget): the token bucket
    /// and GCRA reserve `estimate` units, or without one admit while they are neither empty nor
    /// in debt; [`Limiter::settle`] then debits what the response reported. The other kinds
    /// cannot go into debt (validation keeps response costs off them) and decide `estimate`, at
    /// least 1, as a plain cost. Lock-free and allocation-free like [`Limiter::decide`].
    #[inline]
    pub fn admit_owing(&self, now: Nanos, estimate: u64) -> Verdict {
        match self {
            Limiter::TokenBucket(a) => a.admit_owing(now, estimate),
            Limiter::Gcra(a) => a.admit_owing(now, estimate),
            other => other.decide(now, estimate.max(1)),
        }
    }

    /// Settles a request admitted by [`Limiter::admit_owing`] that reserved `reserved` and cost
    /// `actual`: one atomic update that may leave the bucket in debt. A no-op on other kinds.
    pub fn settle(&self, now: Nanos, reserved: u64, actual: u64) {
        match self {
            Limiter::TokenBucket(a) => a.settle(now, reserved, actual),
            Limiter::Gcra(a) => a.settle(now, reserved, actual),
            _ => {}
        }
    }

    /// What the limiter still admits at `now` (see [`Quota`]); `rate` is the limit it was built
    /// for, which the control-plane algorithms need: a drop-ratio bucket keeps no count, so it
    /// reports the share of the limit its instruction still admits (`count x (1 - ratio)`) and the
    /// limit's period; an adaptive token bucket its tokens and the period. Allocates nothing; the
    /// sliding log and the adaptive bucket take their own lock, as their decisions do.
    pub fn quota(&self, now: Nanos, rate: Rate) -> Quota {
        match self {
            Limiter::TokenBucket(a) => a.quota(now),
            Limiter::LeakyBucket(a) => a.quota(now),
            Limiter::FixedWindow(a) => a.quota(now),
            Limiter::SlidingWindowLog(a) => a.quota(now),
            Limiter::SlidingWindowCounter(a) => a.quota(now),
            Limiter::Gcra(a) => a.quota(now),
            Limiter::AdaptiveTokenBucket(a) => Quota {
                remaining: a.tokens(now),
                reset: rate.period(),
            },
            Limiter::DropRatio(a) => {
                let ratio = a.current(now).unwrap_or(Ratio::ZERO);
                let kept = u128::from(rate.count()) * u128::from(Ratio::SCALE - ratio.raw());
                Quota {
                    remaining: u64::try_from(kept >> 32).unwrap_or(u64::MAX),
                    reset: rate.period(),
                }
            }
        }
    }

    /// The kind of this limiter.
    pub fn kind(&self) -> Kind {
        match self {
            Limiter::TokenBucket(_) => Kind::TokenBucket,
            Limiter::LeakyBucket(_) => Kind::LeakyBucket,
            Limiter::FixedWindow(_) => Kind::FixedWindow,
            Limiter::SlidingWindowLog(_) => Kind::SlidingWindowLog,
            Limiter::SlidingWindowCounter(_) => Kind::SlidingWindowCounter,
            Limiter::Gcra(_) => Kind::Gcra,
            Limiter::AdaptiveTokenBucket(_) => Kind::AdaptiveTokenBucket,
            Limiter::DropRatio(_) => Kind::DropRatio,
        }
    }
}

/// A denial `ns` nanoseconds from now.
pub(crate) fn deny_after(ns: Nanos) -> Verdict {
    Verdict::Deny {
        retry_after: Duration::from_nanos(ns),
    }
}

/// A denial of a cost that can never fit.
pub(crate) fn deny_never() -> Verdict {
    Verdict::Deny { retry_after: NEVER }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_refuses_bad_parameters() {
        assert_eq!(Rate::per_second(0), Err(ParamError::ZeroCount));
        assert_eq!(Rate::new(5, Duration::ZERO), Err(ParamError::ZeroPeriod));
        assert!(matches!(
            Rate::new(1, Duration::MAX),
            Err(ParamError::PeriodTooLong { .. })
        ));
        assert_eq!(
            Rate::from_nanos(11, 10),
            Err(ParamError::RateTooHigh {
                count: 11,
                period_ns: 10
            })
        );
    }

    #[test]
    fn emission_interval_rounds_up() {
        assert_eq!(
            Rate::per_second(5000).unwrap().emission_interval_ns(),
            200_000
        );
        assert_eq!(
            Rate::per_second(3).unwrap().emission_interval_ns(),
            333_333_334
        );
    }

    #[test]
    fn kind_names_round_trip() {
        for kind in Kind::ALL {
            assert_eq!(Kind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(Kind::from_name("token_bucket"), None);
    }
}
