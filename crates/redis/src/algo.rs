//! The algorithms Redis decides exactly, with their parameters in the units the scripts take.

use std::num::NonZeroU64;

use spillway_core::algo::{Kind, Rate};

use crate::script::ScriptKind;

/// A `Kind` that has no Redis script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} cannot use store: redis; use token-bucket, leaky-bucket, fixed-window, sliding-window-log, sliding-window-counter or gcra",
    .0.name()
)]
pub struct UnsupportedAlgorithm(pub Kind);

/// An exact algorithm and its parameters.
///
/// Redis keeps time in microseconds (`TIME`), so periods are rounded up to whole microseconds:
/// a limit never becomes looser by the rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactAlgo {
    /// Holds up to `capacity` tokens, refilled at `rate` (10,000 tokens at 1,000/s).
    TokenBucket { rate: Rate, capacity: NonZeroU64 },
    /// Drains at `rate`; admits while the backlog is at most `burst` intervals, like
    /// `spillway_core::algo::LeakyBucket`.
    LeakyBucket { rate: Rate, burst: u64 },
    /// At most `rate.count()` units per window of `rate.period()`, aligned on the Unix epoch.
    FixedWindow { rate: Rate },
    /// At most `rate.count()` units in any window of `rate.period()`.
    SlidingWindowLog { rate: Rate },
    /// At most `rate.count()` units per aligned window of `rate.period()`, and about that many in
    /// any sliding window, estimated from two counters like
    /// `spillway_core::algo::SlidingWindowCounter`.
    SlidingWindowCounter { rate: Rate },
    /// GCRA at `rate` with bursts of up to `burst` units, like `spillway_core::algo::Gcra`.
    Gcra { rate: Rate, burst: NonZeroU64 },
}

impl ExactAlgo {
    /// The algorithm `kind` at `rate`; `burst` is the token bucket's capacity and GCRA's burst
    /// (default: the rate's count) or the leaky bucket's tolerance (default 0), as in the
    /// configuration.
    pub fn new(kind: Kind, rate: Rate, burst: Option<u64>) -> Result<Self, UnsupportedAlgorithm> {
        Ok(match kind {
            Kind::TokenBucket => {
                let capacity = burst
                    .and_then(NonZeroU64::new)
                    .unwrap_or(nonzero(rate.count()));
                ExactAlgo::TokenBucket { rate, capacity }
            }
            Kind::LeakyBucket => ExactAlgo::LeakyBucket {
                rate,
                burst: burst.unwrap_or(0),
            },
            Kind::FixedWindow => ExactAlgo::FixedWindow { rate },
            Kind::SlidingWindowLog => ExactAlgo::SlidingWindowLog { rate },
            Kind::SlidingWindowCounter => ExactAlgo::SlidingWindowCounter { rate },
            Kind::Gcra => ExactAlgo::Gcra {
                rate,
                burst: burst
                    .and_then(NonZeroU64::new)
                    .unwrap_or(nonzero(rate.count())),
            },
            other => return Err(UnsupportedAlgorithm(other)),
        })
    }

    /// A token bucket of `capacity` tokens refilled at `rate`.
    pub fn token_bucket(rate: Rate, capacity: u64) -> Self {
        ExactAlgo::TokenBucket {
            rate,
            capacity: NonZeroU64::new(capacity).unwrap_or(NonZeroU64::MIN),
        }
    }

    /// The configuration kind.
    pub fn kind(&self) -> Kind {
        match self {
            ExactAlgo::TokenBucket { .. } => Kind::TokenBucket,
            ExactAlgo::LeakyBucket { .. } => Kind::LeakyBucket,
            ExactAlgo::FixedWindow { .. } => Kind::FixedWindow,
            ExactAlgo::SlidingWindowLog { .. } => Kind::SlidingWindowLog,
            ExactAlgo::SlidingWindowCounter { .. } => Kind::SlidingWindowCounter,
            ExactAlgo::Gcra { .. } => Kind::Gcra,
        }
    }

    /// The rate.
    pub fn rate(&self) -> Rate {
        match *self {
            ExactAlgo::TokenBucket { rate, .. }
            | ExactAlgo::LeakyBucket { rate, .. }
            | ExactAlgo::FixedWindow { rate }
            | ExactAlgo::SlidingWindowLog { rate }
            | ExactAlgo::SlidingWindowCounter { rate }
            | ExactAlgo::Gcra { rate, .. } => rate,
        }
    }

    pub(crate) fn script(&self) -> ScriptKind {
        match self {
            ExactAlgo::TokenBucket { .. } => ScriptKind::TokenBucket,
            ExactAlgo::LeakyBucket { .. } => ScriptKind::LeakyBucket,
            ExactAlgo::FixedWindow { .. } => ScriptKind::FixedWindow,
            ExactAlgo::SlidingWindowLog { .. } => ScriptKind::SlidingWindowLog,
            ExactAlgo::SlidingWindowCounter { .. } => ScriptKind::SlidingWindowCounter,
            ExactAlgo::Gcra { .. } => ScriptKind::Gcra,
        }
    }

    /// The script's arguments for a request of `cost` that would take `want` tokens when it can
    /// (only the token bucket takes more than `cost`, for batching).
    pub(crate) fn args(&self, cost: u64, want: u64) -> Vec<String> {
        let period_us = |rate: Rate| rate.period_ns().div_ceil(1_000).to_string();
        // Microseconds per unit, exact as a decimal of the nanosecond interval.
        let interval_us = |rate: Rate| {
            let ns = rate.emission_interval_ns();
            format!("{}.{:03}", ns / 1_000, ns % 1_000)
        };
        match *self {
            ExactAlgo::TokenBucket { rate, capacity } => vec![
                capacity.to_string(),
                rate.count().to_string(),
                period_us(rate),
                cost.to_string(),
                want.max(cost).to_string(),
            ],
            ExactAlgo::LeakyBucket { rate, burst } => {
                vec![interval_us(rate), burst.to_string(), cost.to_string()]
            }
            ExactAlgo::Gcra { rate, burst } => {
                vec![interval_us(rate), burst.to_string(), cost.to_string()]
            }
            ExactAlgo::FixedWindow { rate }
            | ExactAlgo::SlidingWindowLog { rate }
            | ExactAlgo::SlidingWindowCounter { rate } => {
                vec![rate.count().to_string(), period_us(rate), cost.to_string()]
            }
        }
    }
}

impl ExactAlgo {
    /// The arguments of the debit script for `cost` units: the meter's interval in microseconds
    /// and what it holds (a token bucket's capacity, GCRA's burst).
    pub(crate) fn debit_args(&self, cost: u64) -> Vec<String> {
        let rate = self.rate();
        let ns = rate.emission_interval_ns();
        let held = match *self {
            ExactAlgo::TokenBucket { capacity, .. } => capacity.get(),
            ExactAlgo::Gcra { burst, .. } => burst.get(),
            ExactAlgo::LeakyBucket { burst, .. } => burst.max(1),
            _ => rate.count(),
        };
        vec![
            format!("{}.{:03}", ns / 1_000, ns % 1_000),
            held.to_string(),
            cost.to_string(),
        ]
    }
}

fn nonzero(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).unwrap_or(NonZeroU64::MIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn kinds_without_a_script_are_refused_by_name() {
        let rate = Rate::per_second(10).unwrap();
        let err = ExactAlgo::new(Kind::DropRatio, rate, None).unwrap_err();
        assert_eq!(err, UnsupportedAlgorithm(Kind::DropRatio));
        assert!(
            err.to_string()
                .starts_with("drop-ratio cannot use store: redis")
        );
        assert!(ExactAlgo::new(Kind::AdaptiveTokenBucket, rate, None).is_err());
    }

    #[test]
    fn every_exact_kind_has_a_script() {
        let rate = Rate::per_second(10).unwrap();
        for kind in Kind::ALL {
            if let Ok(algo) = ExactAlgo::new(kind, rate, None) {
                assert_eq!(algo.kind(), kind);
                assert!(!algo.script().source().is_empty());
            }
        }
        let exact = Kind::ALL
            .iter()
            .filter(|&&k| ExactAlgo::new(k, rate, None).is_ok())
            .count();
        assert_eq!(exact, 6, "every kind but the control plane's two");
    }

    #[test]
    fn gcra_burst_defaults_to_the_count_and_takes_the_interval() {
        let rate = Rate::per_second(3).unwrap();
        let algo = ExactAlgo::new(Kind::Gcra, rate, None).unwrap();
        assert_eq!(algo.args(2, 2), ["333333.334", "3", "2"]);
        let algo = ExactAlgo::new(Kind::Gcra, rate, Some(100)).unwrap();
        assert_eq!(algo.args(1, 1), ["333333.334", "100", "1"]);
    }

    #[test]
    fn token_bucket_capacity_defaults_to_the_count() {
        let rate = Rate::per_second(1_000).unwrap();
        let algo = ExactAlgo::new(Kind::TokenBucket, rate, None).unwrap();
        assert_eq!(algo.args(1, 1), ["1000", "1000", "1000000", "1", "1"]);
        let algo = ExactAlgo::new(Kind::TokenBucket, rate, Some(10_000)).unwrap();
        assert_eq!(algo.args(3, 10), ["10000", "1000", "1000000", "3", "10"]);
    }

    #[test]
    fn periods_round_up_to_whole_microseconds() {
        let rate = Rate::new(3, Duration::from_nanos(1_000_001)).unwrap();
        assert_eq!(
            ExactAlgo::FixedWindow { rate }.args(1, 1),
            ["3", "1001", "1"]
        );
        let pacing = ExactAlgo::LeakyBucket {
            rate: Rate::per_second(3).unwrap(),
            burst: 2,
        };
        assert_eq!(pacing.args(1, 1), ["333333.334", "2", "1"]);
    }
}
