//! The capped, jittered backoff of every link that reconnects.

use std::time::Duration;

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
