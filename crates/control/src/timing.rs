//! Wall-clock intervals shared by every tier, and the capped, jittered backoff of every link.
//!
//! Interval `s` of length `I` ms covers `[s x I, (s + 1) x I)` in Unix milliseconds. Every host
//! closes the same interval at the same instant without talking to anyone, so an aggregator can
//! tell when it has heard from all its clients about interval `s`, and two controllers know they
//! are summing the same second. With 1 s intervals, a report sent at 12:00:01.000 is about
//! interval 12:00:00.000-12:00:00.999.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The shortest interval accepted; the configuration allows 100 ms reports.
pub const MIN_INTERVAL_MS: u64 = 10;

/// A report interval in milliseconds, at least [`MIN_INTERVAL_MS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Interval(u64);

impl Interval {
    /// An interval of `duration`, raised to [`MIN_INTERVAL_MS`] if shorter.
    pub fn new(duration: Duration) -> Self {
        Self::from_ms(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    /// An interval of `ms` milliseconds, raised to [`MIN_INTERVAL_MS`] if shorter.
    pub fn from_ms(ms: u64) -> Self {
        Interval(ms.max(MIN_INTERVAL_MS))
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

/// Exponential backoff between reconnection attempts, capped and with full jitter, so a fleet
/// that lost its aggregator at once does not come back at once: from 100 ms doubling to a cap of
/// 5 s, each wait drawn uniformly from half to all of the current step.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    cap: Duration,
    step: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(5))
    }
}

impl Backoff {
    /// Starting at `initial`, doubling up to `cap`.
    pub fn new(initial: Duration, cap: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            cap: cap.max(initial),
            step: initial,
        }
    }

    /// The next wait, and doubles the step for the one after.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.cap);
        step.mul_f64(0.5 + fastrand::f64() * 0.5)
    }

    /// After a success: the next failure waits the initial step again.
    pub fn reset(&mut self) {
        self.step = self.initial;
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
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let waits: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        let steps = [100, 200, 400, 400, 400];
        for (wait, step) in waits.iter().zip(steps) {
            let step = Duration::from_millis(step);
            assert!(
                *wait >= step / 2 && *wait <= step,
                "{wait:?} for step {step:?}"
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
