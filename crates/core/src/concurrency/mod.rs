//! Adaptive concurrency limits: how many requests may be in flight to an upstream,
//! learnt from how long its answers take.
//!
//! A rate limit in requests per second cannot see an upstream that slows down; a limit on the
//! requests in flight can, because by Little's law an upstream that serves `C` requests a second
//! with `L` in flight answers in `L / C` seconds: once `L` passes what the upstream does at once,
//! more in flight only queues and adds latency. The algorithms here watch that latency and move
//! the limit to where it starts to grow.
//!
//! Sans-IO: an algorithm ([`Fixed`], [`Vegas`], [`Gradient`]) is fed [`ConcurrencyWindow`]s (the round-trip
//! times and in-flight counts of the requests that completed since the last one) and the time,
//! as values; it never reads a clock. The [`Gate`] is the hot path: an atomic in-flight counter
//! checked against the current limit, plus the atomic sums a window is made of; the proxy calls
//! [`Gate::update`] from a timer, off the hot path, which feeds the algorithm and stores the new
//! limit with one atomic store.
//!
//! Worked example: an upstream of 32 workers that each take 20 ms serves 1,600 requests a
//! second at 20 ms. With 64 in flight it still serves 1,600 a second, but each answer takes
//! 40 ms; with 3,200 a second offered and no limit the queue (and the latency) grows without
//! bound. [`Gradient`] settles near `1.5 x 32 + 4 = 52` in flight (latency about 33 ms), [`Vegas`]
//! near `32 + 3..6 x log10(limit)`.

mod fixed;
mod gate;
mod gradient;
mod vegas;

use std::fmt;
use std::time::Duration;

pub use fixed::Fixed;
pub use gate::{Gate, Permit, Rejected};
pub use gradient::Gradient;
pub use vegas::Vegas;

/// The default `initial_limit` of the adaptive algorithms (Netflix's concurrency-limits starts
/// at 20 too).
pub const DEFAULT_INITIAL_LIMIT: u32 = 20;
/// The default `min_limit`: a few requests always go through, so the latency is still measured.
pub const DEFAULT_MIN_LIMIT: u32 = 4;
/// The default `max_limit`.
pub const DEFAULT_MAX_LIMIT: u32 = 1_000;
/// The largest limit a file may ask for.
pub const LIMIT_CEILING: u32 = 1_000_000;
/// How often the proxy closes a window and lets the algorithm move the limit.
pub const UPDATE_EVERY: Duration = Duration::from_millis(50);
/// A window of fewer completions than this is kept open (up to [`MAX_WINDOW`]), so the limit
/// moves on a mean of several round trips rather than on one.
pub const MIN_SAMPLES: u64 = 10;
/// The longest a window stays open waiting for [`MIN_SAMPLES`].
pub const MAX_WINDOW: Duration = Duration::from_secs(1);

/// What the requests that completed during one window saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyWindow {
    /// Requests whose round trip was measured.
    pub samples: u64,
    /// Their mean round-trip time.
    pub mean_rtt: Duration,
    /// The shortest of them.
    pub min_rtt: Duration,
    /// Requests that failed or timed out: a sign of overload, with no usable round trip.
    pub dropped: u64,
    /// The most requests in flight at once during the window.
    pub max_inflight: u32,
}

/// A limit algorithm: windows and the time in, a limit out.
pub trait LimitAlgorithm {
    /// The limit now.
    fn limit(&self) -> u32;
    /// Learns from one window ending at `now` (any monotonic origin) and returns the new limit.
    fn update(&mut self, now: Duration, window: &ConcurrencyWindow) -> u32;
}

/// Which algorithm a `concurrency:` section asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmName {
    Gradient,
    Vegas,
    Fixed,
}

impl AlgorithmName {
    pub const ALL: [AlgorithmName; 3] = [
        AlgorithmName::Gradient,
        AlgorithmName::Vegas,
        AlgorithmName::Fixed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AlgorithmName::Gradient => "gradient",
            AlgorithmName::Vegas => "vegas",
            AlgorithmName::Fixed => "fixed",
        }
    }
}

impl fmt::Display for AlgorithmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated `concurrency:` section: `min_limit <= initial_limit <= max_limit`, all at least 1
/// (a fixed limit has all three equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConcurrencySettings {
    pub algorithm: AlgorithmName,
    pub min_limit: u32,
    pub max_limit: u32,
    pub initial_limit: u32,
}

impl ConcurrencySettings {
    /// A fixed limit of `limit` (at least 1).
    pub fn fixed(limit: u32) -> Self {
        let limit = limit.max(1);
        ConcurrencySettings {
            algorithm: AlgorithmName::Fixed,
            min_limit: limit,
            max_limit: limit,
            initial_limit: limit,
        }
    }

    /// `algorithm` with the default bounds.
    pub fn adaptive(algorithm: AlgorithmName) -> Self {
        ConcurrencySettings {
            algorithm,
            min_limit: DEFAULT_MIN_LIMIT,
            max_limit: DEFAULT_MAX_LIMIT,
            initial_limit: DEFAULT_INITIAL_LIMIT,
        }
    }

    /// The algorithm these settings describe, at its initial limit.
    pub fn limiter(&self) -> ConcurrencyLimiter {
        let min = self.min_limit.max(1);
        let max = self.max_limit.max(min);
        let initial = self.initial_limit.clamp(min, max);
        match self.algorithm {
            AlgorithmName::Fixed => ConcurrencyLimiter::Fixed(Fixed::new(initial)),
            AlgorithmName::Vegas => ConcurrencyLimiter::Vegas(Vegas::new(initial, min, max)),
            AlgorithmName::Gradient => {
                ConcurrencyLimiter::Gradient(Gradient::new(initial, min, max))
            }
        }
    }
}

/// One of the algorithms, chosen by the configuration (an enum rather than a box, so a call is
/// a match, not a virtual call).
#[derive(Debug, Clone)]
pub enum ConcurrencyLimiter {
    Fixed(Fixed),
    Vegas(Vegas),
    Gradient(Gradient),
}

impl LimitAlgorithm for ConcurrencyLimiter {
    fn limit(&self) -> u32 {
        match self {
            ConcurrencyLimiter::Fixed(a) => a.limit(),
            ConcurrencyLimiter::Vegas(a) => a.limit(),
            ConcurrencyLimiter::Gradient(a) => a.limit(),
        }
    }

    fn update(&mut self, now: Duration, window: &ConcurrencyWindow) -> u32 {
        match self {
            ConcurrencyLimiter::Fixed(a) => a.update(now, window),
            ConcurrencyLimiter::Vegas(a) => a.update(now, window),
            ConcurrencyLimiter::Gradient(a) => a.update(now, window),
        }
    }
}

/// A limit kept as a real number between updates, rounded for the gate and never outside
/// `[min, max]`.
pub(crate) fn rounded(limit: f64, min: u32, max: u32) -> u32 {
    (limit.round() as u32).clamp(min, max)
}
