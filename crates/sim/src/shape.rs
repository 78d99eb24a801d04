//! The figures of a step and a leave, computed the same way from 100 ms samples whether they
//! come from the simulator or from real processes (`cargo bench -p spillway-cli --bench
//! real_vs_sim`, docs/control-plane.md): the same scenario shape measured the same way on both.

use crate::engine::{FleetSample, TICK_NS, TICKS_PER_SAMPLE};

/// The width of one sample, in seconds (100 ms).
pub const SAMPLE_S: f64 = (TICK_NS * TICKS_PER_SAMPLE) as f64 / 1e9;

/// The trailing window of the enforcement delay: three samples.
const WINDOW: usize = 3;

/// One run's figures around a 15x step at `step_s` and a host leaving at `leave_s`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepAndLeave {
    /// From the step until the admitted rate over the trailing 300 ms first comes within 5% of
    /// the limit (the window's end counts); `None` when it never does before the leave.
    pub delay_s: Option<f64>,
    /// Admitted over the second after the step, as a multiple of the limit.
    pub first_second: f64,
    /// Admitted over the second after that.
    pub second_second: f64,
    /// Admitted from 2 s after the step until the leave, as a multiple of the limit.
    pub steady: f64,
    /// Admitted over the second after the leave (one report interval at 1 s).
    pub leave_second: f64,
    /// Admitted from a second after the leave to the end.
    pub after_leave: f64,
    /// The lowest admitted over 300 ms after the leave, as a multiple of the limit.
    pub leave_low: f64,
}

impl StepAndLeave {
    /// The figures of `samples` (offered and admitted per 100 ms sample, the first starting at
    /// 0 s) against `limit` per second; `None` when the samples end before a second after the
    /// leave.
    pub fn of(samples: &[(u64, u64)], limit: f64, step_s: f64, leave_s: f64) -> Option<Self> {
        let at = |t: f64| (t / SAMPLE_S).round() as usize;
        let (step, leave, end) = (at(step_s), at(leave_s), samples.len());
        if step + WINDOW > leave || at(leave_s + 1.0) >= end {
            return None;
        }
        // Admitted over samples `[from, to)`, as a multiple of the limit.
        let admitted = |from: usize, to: usize| {
            let n: u64 = samples[from..to].iter().map(|s| s.1).sum();
            n as f64 / ((to - from) as f64 * SAMPLE_S) / limit
        };
        let delay_s = (step + WINDOW..=leave)
            .find(|&k| admitted(k - WINDOW, k) <= 1.05)
            .map(|k| (k - step) as f64 * SAMPLE_S);
        let after = at(leave_s + 1.0);
        let leave_low = (leave + WINDOW..=after)
            .map(|k| admitted(k - WINDOW, k))
            .fold(f64::INFINITY, f64::min);
        Some(StepAndLeave {
            delay_s,
            first_second: admitted(step, at(step_s + 1.0).min(leave)),
            second_second: admitted(at(step_s + 1.0).min(leave - 1), at(step_s + 2.0).min(leave)),
            steady: admitted(at(step_s + 2.0).min(leave - 1), leave),
            leave_second: admitted(leave, after),
            after_leave: admitted(after, end),
            leave_low,
        })
    }

    /// [`StepAndLeave::of`] a simulator's samples.
    pub fn of_samples(
        samples: &[FleetSample],
        limit: f64,
        step_s: f64,
        leave_s: f64,
    ) -> Option<Self> {
        let pairs: Vec<(u64, u64)> = samples.iter().map(|s| (s.offered, s.admitted)).collect();
        StepAndLeave::of(&pairs, limit, step_s, leave_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100/s before a step at 1 s, `surge` admitted for the first 300 ms after it and `held`
    /// after that, `after` from the leave at 4 s to 6 s.
    fn samples(surge: u64, held: u64, after: u64) -> Vec<(u64, u64)> {
        (0..60)
            .map(|i| match i {
                0..10 => (10, 10),
                10..13 => (150, surge),
                13..40 => (150, held),
                _ => (150, after),
            })
            .collect()
    }

    #[test]
    fn the_figures_follow_their_windows() {
        // Limit 100/s: 10 admitted per sample is the limit.
        let s = StepAndLeave::of(&samples(100, 10, 5), 100.0, 1.0, 4.0).unwrap();
        // The trailing 300 ms first comes within 5% at 0.6 s after the step: samples 13-15.
        assert!(s.delay_s.is_some_and(|d| (d - 0.6).abs() < 1e-9), "{s:?}");
        // The first second: 3 samples of 100 and 7 of 10, 370 in a second.
        assert!((s.first_second - 3.7).abs() < 1e-9, "{s:?}");
        assert!((s.second_second - 1.0).abs() < 1e-9, "{s:?}");
        assert!((s.steady - 1.0).abs() < 1e-9, "{s:?}");
        assert!((s.leave_second - 0.5).abs() < 1e-9, "{s:?}");
        assert!((s.after_leave - 0.5).abs() < 1e-9, "{s:?}");
        assert!((s.leave_low - 0.5).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn a_step_never_enforced_has_no_delay_and_short_runs_have_no_figures() {
        let s = StepAndLeave::of(&samples(15, 15, 15), 100.0, 1.0, 4.0).unwrap();
        assert_eq!(s.delay_s, None);
        assert!(StepAndLeave::of(&samples(10, 10, 10)[..45], 100.0, 1.0, 4.0).is_none());
    }
}
