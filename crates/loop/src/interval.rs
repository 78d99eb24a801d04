//! Wall-clock intervals shared by every tier.
//!
//! Interval `s` of length `I` ms covers `[s x I, (s + 1) x I)` in Unix milliseconds. Every host
//! closes the same interval at the same instant without talking to anyone, so an aggregator can
//! tell when it has heard from all its clients about interval `s`, and two controllers know they
//! are summing the same second. With 1 s intervals, a report sent at 12:00:01.000 is about
//! interval 12:00:00.000-12:00:00.999. The cores take the time as an argument: the servers pass
//! Unix milliseconds, the simulator its own.

use std::time::Duration;

/// The shortest interval accepted; the configuration allows 100 ms reports.
pub const MIN_INTERVAL_MS: u64 = 10;

/// The longest interval accepted: one hour. A limiter that hears from its fleet less often than
/// that does not limit anything; the bound keeps a bogus interval from a broken or hostile peer
/// (a host's report, an aggregator's instructions) from stalling a tier's reports or growing a
/// surge guard's history without end.
pub const MAX_INTERVAL_MS: u64 = 3_600_000;

/// A report interval in milliseconds, from [`MIN_INTERVAL_MS`] to [`MAX_INTERVAL_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interval(u64);

impl Interval {
    /// An interval of `duration`, raised to [`MIN_INTERVAL_MS`] if shorter and cut to
    /// [`MAX_INTERVAL_MS`] if longer.
    pub fn new(duration: Duration) -> Self {
        Self::from_ms(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    /// An interval of `ms` milliseconds, raised to [`MIN_INTERVAL_MS`] if shorter and cut to
    /// [`MAX_INTERVAL_MS`] if longer.
    pub fn from_ms(ms: u64) -> Self {
        Interval(ms.clamp(MIN_INTERVAL_MS, MAX_INTERVAL_MS))
    }

    pub fn ms(self) -> u64 {
        self.0
    }

    pub fn duration(self) -> Duration {
        Duration::from_millis(self.0)
    }

    pub fn secs(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// The interval that contains `at_ms`.
    pub fn sequence_at(self, at_ms: u64) -> u64 {
        at_ms / self.0
    }

    /// When interval `sequence` ends (the next one starts), in Unix milliseconds.
    pub fn end_of(self, sequence: u64) -> u64 {
        sequence.saturating_add(1).saturating_mul(self.0)
    }

    /// How long an aggregator or controller waits past the end of an interval for late reports
    /// before it closes the interval without them: a quarter of the interval, so at 1 s reports
    /// a missing client delays its zone by 250 ms, never a whole interval.
    pub fn grace_ms(self) -> u64 {
        (self.0 / 4).max(5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_are_aligned_to_the_wall_clock() {
        let i = Interval::from_ms(250);
        assert_eq!(i.sequence_at(1_000), 4);
        assert_eq!(i.sequence_at(1_249), 4);
        assert_eq!(i.end_of(4), 1_250);
        assert_eq!(i.grace_ms(), 62);
        assert_eq!(Interval::from_ms(0).ms(), MIN_INTERVAL_MS);
        assert_eq!(Interval::from_ms(u64::MAX).ms(), MAX_INTERVAL_MS);
        assert_eq!(Interval::new(Duration::MAX).ms(), MAX_INTERVAL_MS);
    }
}
