//! Gradient (after Netflix's Gradient2): the limit follows the ratio of the long-term round trip
//! to the short-term one, plus a small queue allowance, smoothed.
//!
//! Each window: `gradient = clamp(TOLERANCE x long / short, 0.5, 1)`, then
//! `limit = (1 - SMOOTHING) x limit + SMOOTHING x (limit x gradient + QUEUE)`. While the short
//! round trip stays within `TOLERANCE` (1.5) times the long one the gradient is 1 and the limit
//! grows by `SMOOTHING x QUEUE` (0.8) a window; past it the limit shrinks toward where the
//! latency is back within tolerance, at most halving. Against `W` workers of service time `S`
//! (so `short = S x limit / W` once the limit passes `W`) the fixed point is
//! `limit = TOLERANCE x W + QUEUE`: 52 for 32 workers, answered in `1.6 S`.
//!
//! Where Gradient2 keeps the long-term round trip as an exponential average of every sample, it
//! creeps up under a sustained overload (the average follows the queueing it is meant to
//! measure it against, so the limit keeps growing). Here the long-term round trip falls at
//! once, halfway to any shorter window (an upstream that speeds up is followed within a few
//! windows), but rises only with a time constant of [`Gradient::RISE`] (five minutes): an upstream
//! that got slower for good is learnt in minutes, a queue of a few seconds moves it by about 1%.
//! Meanwhile the queue allowance keeps at least `QUEUE / (1 - 0.5) = 8` in flight, so a slower
//! upstream is never starved. A window with under half the limit in flight leaves the limit alone:
//! the load held it there, so it says nothing about a higher one.
//!
//! A long-term round trip learnt while the upstream was already queueing (a limit that started
//! above its capacity) would be taken for its normal: within tolerance of it, the limit never
//! comes down. So the algorithm probes: [`Gradient::FIRST_PROBE`] after it starts and every
//! [`Gradient::PROBE_EVERY`] after that it halves the limit for about four round trips (at least
//! [`Gradient::PROBE_WINDOWS`] windows), long enough for a queue to drain and the long-term
//! round trip to fall to what the upstream takes unqueued, then goes back to the limit it had.
//! While halving the limit cuts the round trip to 60% or less (the queue's share of it was
//! large), the probe halves it again, four round trips a stage; and a probe that found a round
//! trip 10% shorter is followed by another a second later. So a limit that started far above the
//! capacity finds it within a few seconds.
//! At a limit of `1.5 W + 4` a probe idles a quarter of the workers for ~4 round trips every 30
//! s: well under 1% of the capacity.

use std::time::Duration;

use super::{ConcurrencyWindow, LimitAlgorithm, rounded};

#[derive(Debug, Clone)]
pub struct Gradient {
    limit: f64,
    min: u32,
    max: u32,
    /// The long-term round trip in seconds, once a window has been seen.
    long: Option<f64>,
    last: Option<Duration>,
    next_probe: Option<Duration>,
    probe: Option<Probe>,
}

/// A probe under way: the limit to go back to, and when it may end.
#[derive(Debug, Clone, Copy)]
struct Probe {
    resume: f64,
    /// The long-term round trip when it began.
    long: f64,
    /// The short round trip before the stage under way.
    before: f64,
    /// The shortest window of the stage under way.
    stage_short: f64,
    until: Duration,
    windows: u32,
}

impl Gradient {
    /// How much longer than the long-term round trip answers may take before the limit shrinks.
    pub const TOLERANCE: f64 = 1.5;
    /// The requests allowed to queue beyond what the gradient admits.
    pub const QUEUE: f64 = 4.0;
    /// The weight of each window's new limit.
    pub const SMOOTHING: f64 = 0.2;
    /// The smallest gradient: the limit at most halves in one window's step.
    pub const MIN_GRADIENT: f64 = 0.5;
    /// The time constant with which the long-term round trip rises.
    pub const RISE: Duration = Duration::from_secs(300);
    /// When the first probe comes, after the first window.
    pub const FIRST_PROBE: Duration = Duration::from_secs(1);
    /// How often a probe comes after that.
    pub const PROBE_EVERY: Duration = Duration::from_secs(30);
    /// The fewest windows a probe lasts.
    pub const PROBE_WINDOWS: u32 = 4;
    /// The longest one stage of a probe lasts.
    pub const PROBE_MAX: Duration = Duration::from_secs(1);
    /// A stage whose round trip is at most this share of the one before halves the limit again.
    pub const STILL_QUEUEING: f64 = 0.6;

    /// How long a stage of a probe lasts when answers took `short` seconds before it: about four
    /// round trips, at most [`Gradient::PROBE_MAX`].
    fn stage_length(short: f64) -> Duration {
        Duration::from_secs_f64(short * 4.0).min(Self::PROBE_MAX)
    }

    pub fn new(initial: u32, min: u32, max: u32) -> Self {
        Gradient {
            limit: f64::from(initial.clamp(min, max)),
            min,
            max,
            long: None,
            last: None,
            next_probe: None,
            probe: None,
        }
    }

    /// The long-term round trip, once a window has been seen.
    pub fn long_rtt(&self) -> Option<Duration> {
        self.long.map(Duration::from_secs_f64)
    }
}

impl LimitAlgorithm for Gradient {
    fn limit(&self) -> u32 {
        rounded(self.limit, self.min, self.max)
    }

    fn update(&mut self, now: Duration, window: &ConcurrencyWindow) -> u32 {
        let elapsed = self
            .last
            .map_or(Duration::ZERO, |last| now.saturating_sub(last));
        self.last = Some(now);
        if window.samples == 0 || window.mean_rtt.is_zero() {
            return self.limit();
        }
        let short = window.mean_rtt.as_secs_f64();
        let long = match self.long {
            None => short,
            // A probe's windows are measurements of a drained queue: taken as they are.
            Some(long) if self.probe.is_some() => long.min(short),
            Some(long) if short < long => long + (short - long) * 0.5,
            Some(long) => {
                let rise = 1.0 - (-elapsed.as_secs_f64() / Self::RISE.as_secs_f64()).exp();
                long + (short - long) * rise
            }
        };
        self.long = Some(long);
        let next_probe = *self.next_probe.get_or_insert(now + Self::FIRST_PROBE);
        if let Some(probe) = &mut self.probe {
            probe.windows += 1;
            // The first window of a stage still holds requests admitted before it.
            if probe.windows > 1 {
                probe.stage_short = probe.stage_short.min(short);
            }
            if probe.windows >= Self::PROBE_WINDOWS && now >= probe.until {
                let halved = (self.limit / 2.0).max(f64::from(self.min));
                if probe.stage_short <= Self::STILL_QUEUEING * probe.before && halved < self.limit {
                    // Half the limit took about half the latency: still queueing. Halve again.
                    probe.before = probe.stage_short;
                    probe.stage_short = f64::INFINITY;
                    probe.windows = 0;
                    probe.until = now + Self::stage_length(probe.before);
                    self.limit = halved;
                    return self.limit();
                }
                // A probe that found a much shorter round trip started from a long-term round
                // trip learnt in a queue: probe again soon, until one finds nothing new.
                let again = if long < probe.long * 0.9 {
                    Self::FIRST_PROBE
                } else {
                    Self::PROBE_EVERY
                };
                self.limit = probe.resume;
                self.probe = None;
                self.next_probe = Some(now + again);
            }
            return self.limit();
        }
        if now >= next_probe && f64::from(window.max_inflight) * 2.0 >= self.limit {
            self.probe = Some(Probe {
                resume: self.limit,
                long,
                before: short,
                stage_short: f64::INFINITY,
                until: now + Self::stage_length(short),
                windows: 0,
            });
            self.limit = (self.limit / 2.0).max(f64::from(self.min));
            return self.limit();
        }
        if f64::from(window.max_inflight) * 2.0 < self.limit {
            return self.limit();
        }
        let gradient = (Self::TOLERANCE * long / short).clamp(Self::MIN_GRADIENT, 1.0);
        let target = self.limit * gradient + Self::QUEUE;
        self.limit = (1.0 - Self::SMOOTHING) * self.limit + Self::SMOOTHING * target;
        self.limit = self.limit.clamp(f64::from(self.min), f64::from(self.max));
        self.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(mean_ms: u64, inflight: u32) -> ConcurrencyWindow {
        ConcurrencyWindow {
            samples: 20,
            mean_rtt: Duration::from_millis(mean_ms),
            min_rtt: Duration::from_millis(mean_ms),
            dropped: 0,
            max_inflight: inflight,
        }
    }

    #[test]
    fn within_tolerance_the_limit_grows_by_the_smoothed_queue() {
        let mut g = Gradient::new(100, 1, 1000);
        g.update(Duration::ZERO, &window(20, 100));
        // gradient 1: 0.8 x 100 + 0.2 x (100 + 4) = 100.8, then 101.6.
        assert_eq!(g.update(Duration::from_millis(50), &window(20, 100)), 102);
    }

    #[test]
    fn twice_the_long_round_trip_shrinks_the_limit() {
        let mut g = Gradient::new(100, 1, 1000);
        g.update(Duration::ZERO, &window(20, 100));
        // The first window grew it to 100.8; then 1.5 x 20 / 40 = 0.75:
        // 0.8 x 100.8 + 0.2 x (75.6 + 4) = 96.56. The long round trip rose by
        // 20 ms x (1 - e^(-0.05/300)): nothing visible.
        assert_eq!(g.update(Duration::from_millis(50), &window(40, 100)), 97);
        assert!(g.long_rtt().unwrap() < Duration::from_micros(20_010));
    }

    #[test]
    fn a_faster_upstream_is_followed_at_once() {
        let mut g = Gradient::new(100, 1, 1000);
        g.update(Duration::ZERO, &window(40, 100));
        g.update(Duration::from_millis(50), &window(20, 100));
        g.update(Duration::from_millis(100), &window(20, 100));
        // Halfway each window: 40, 30, 25.
        assert_eq!(g.long_rtt(), Some(Duration::from_millis(25)));
    }

    #[test]
    fn a_probe_halves_the_limit_for_four_round_trips_then_resumes() {
        let mut g = Gradient::new(100, 1, 1000);
        let at = |ms| Duration::from_millis(ms);
        g.update(at(0), &window(20, 100));
        let before = g.update(at(950), &window(20, 100));
        assert_eq!(before, 102);
        // At 1 s the probe starts: half of 101.6, until 80 ms and four windows have passed.
        assert_eq!(g.update(at(1000), &window(20, 100)), 51);
        for ms in [1050, 1100, 1150] {
            assert_eq!(g.update(at(ms), &window(14, 50)), 51);
        }
        // 14 ms is 70% of the 20 ms before: not queueing enough to halve again. The probe ends
        // and 14 ms is the long round trip now.
        assert_eq!(g.update(at(1200), &window(14, 50)), 102);
        assert_eq!(g.long_rtt(), Some(Duration::from_millis(14)));
    }

    #[test]
    fn a_probe_that_halves_the_latency_halves_the_limit_again() {
        let mut g = Gradient::new(100, 1, 1000);
        let at = |ms| Duration::from_millis(ms);
        g.update(at(0), &window(20, 100));
        g.update(at(950), &window(20, 100));
        assert_eq!(g.update(at(1000), &window(20, 100)), 51);
        for ms in [1050, 1100, 1150] {
            g.update(at(ms), &window(10, 50));
        }
        // Half the limit, half the latency: a queue. A quarter of the limit, for 4 x 10 ms.
        assert_eq!(g.update(at(1200), &window(10, 50)), 25);
    }

    #[test]
    fn a_light_load_leaves_the_limit_alone() {
        let mut g = Gradient::new(100, 1, 1000);
        g.update(Duration::ZERO, &window(20, 10));
        assert_eq!(g.update(Duration::from_millis(50), &window(80, 10)), 100);
    }
}
