//! TCP Vegas applied to requests in flight: estimate the queue at the upstream from how much
//! longer answers take than they do unloaded, and keep it between two small bounds.
//!
//! With `limit` in flight and a no-load round trip `rtt_noload`, a round trip of `rtt` means
//! about `queue = limit x (1 - rtt_noload / rtt)` requests are waiting rather than being served.
//! With `l = log10(limit)` (at least 1): a queue of at most `l` grows the limit by `6 l` (far
//! from congestion, grow fast), under `3 l` by `l`, over `6 l` shrinks it by half the queue
//! beyond `6 l` (at least `l`); a failed request shrinks it by `l`. Worked example: at a limit of 100 (`l = 2`) and a no-load
//! round trip of 20 ms, a 24 ms round trip is a queue of 16.7 > 12, so the limit drops to 97.65.
//!
//! The no-load round trip is the shortest ever seen, forgotten every [`Vegas::PROBE_EVERY`] (the
//! shortest of the next window takes its place) so that an upstream that got slower for good is
//! learnt as its new normal.

use std::time::Duration;

use super::{ConcurrencyWindow, LimitAlgorithm, rounded};

#[derive(Debug, Clone)]
pub struct Vegas {
    limit: f64,
    min: u32,
    max: u32,
    rtt_noload: Option<Duration>,
    probed_at: Option<Duration>,
}

impl Vegas {
    /// How long a no-load round trip is trusted before it is measured again.
    pub const PROBE_EVERY: Duration = Duration::from_secs(30);

    pub fn new(initial: u32, min: u32, max: u32) -> Self {
        Vegas {
            limit: f64::from(initial.clamp(min, max)),
            min,
            max,
            rtt_noload: None,
            probed_at: None,
        }
    }

    fn log(&self) -> f64 {
        self.limit.log10().max(1.0)
    }
}

impl LimitAlgorithm for Vegas {
    fn limit(&self) -> u32 {
        rounded(self.limit, self.min, self.max)
    }

    fn update(&mut self, now: Duration, window: &ConcurrencyWindow) -> u32 {
        let l = self.log();
        if window.samples == 0 {
            if window.dropped > 0 {
                self.limit -= l;
            }
            self.limit = self.limit.clamp(f64::from(self.min), f64::from(self.max));
            return self.limit();
        }
        let probe = self
            .probed_at
            .is_none_or(|at| now.saturating_sub(at) >= Self::PROBE_EVERY);
        let noload = match self.rtt_noload {
            Some(rtt) if !probe => rtt.min(window.min_rtt),
            _ => {
                self.probed_at = Some(now);
                window.min_rtt
            }
        };
        self.rtt_noload = Some(noload);
        let rtt = window.mean_rtt.max(noload);
        let queue = if rtt.is_zero() {
            0.0
        } else {
            self.limit * (1.0 - noload.as_secs_f64() / rtt.as_secs_f64())
        };
        if window.dropped > 0 {
            self.limit -= l;
        } else if f64::from(window.max_inflight) * 2.0 < self.limit {
            // The load, not the upstream, holds the requests in flight: nothing was learnt about
            // a higher limit.
        } else if queue <= l {
            self.limit += 6.0 * l;
        } else if queue < 3.0 * l {
            self.limit += l;
        } else if queue > 6.0 * l {
            // Half the excess queue at a time: a limit far above the capacity (a high initial
            // limit, an upstream that slowed down) comes down in a few windows, not hundreds.
            self.limit -= l.max((queue - 6.0 * l) / 2.0);
        }
        self.limit = self.limit.clamp(f64::from(self.min), f64::from(self.max));
        self.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(mean_ms: u64, min_ms: u64, inflight: u32) -> ConcurrencyWindow {
        ConcurrencyWindow {
            samples: 20,
            mean_rtt: Duration::from_millis(mean_ms),
            min_rtt: Duration::from_millis(min_ms),
            dropped: 0,
            max_inflight: inflight,
        }
    }

    #[test]
    fn the_worked_example_shrinks_a_long_queue() {
        let mut vegas = Vegas::new(100, 1, 1000);
        // The first window sets the no-load round trip at 20 ms and, with no queue, grows.
        assert_eq!(vegas.update(Duration::ZERO, &window(20, 20, 100)), 112);
        let mut vegas = Vegas::new(100, 1, 1000);
        vegas.rtt_noload = Some(Duration::from_millis(20));
        vegas.probed_at = Some(Duration::ZERO);
        // 100 x (1 - 20/24) = 16.7 waiting, over 6 x log10(100) = 12: down by 2.
        assert_eq!(
            vegas.update(Duration::from_secs(1), &window(24, 24, 100)),
            98
        );
    }

    #[test]
    fn a_lightly_loaded_upstream_teaches_nothing() {
        let mut vegas = Vegas::new(100, 1, 1000);
        assert_eq!(vegas.update(Duration::ZERO, &window(20, 20, 10)), 100);
    }

    #[test]
    fn failures_shrink_the_limit() {
        let mut vegas = Vegas::new(100, 1, 1000);
        let failed = ConcurrencyWindow {
            dropped: 3,
            ..window(20, 20, 100)
        };
        assert_eq!(vegas.update(Duration::ZERO, &failed), 98);
    }
}
