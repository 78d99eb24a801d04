//! What the run saw, every 100 ms: hosts linked, reports sent, instruction sets received, and
//! the fleet's offered and admitted totals; and the JSON summary made from it.

use serde::Serialize;

use crate::shape::LoadStep;

/// How often the fleet is read.
pub const TICK_S: f64 = 0.1;

/// The trailing window over which the admitted rate must come within 5% of the limit for a
/// step to count as enforced (three ticks).
pub const ENFORCED_WINDOW_TICKS: usize = 3;

/// One reading of the whole fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    /// Seconds since the run started.
    pub t: f64,
    pub connected: usize,
    pub reports: u64,
    pub instructions: u64,
    pub connects: u64,
    /// Offered and admitted so far, over every host's loaded buckets.
    pub offered: f64,
    pub admitted: f64,
}

/// One second of the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Second {
    /// The second's end, seconds since the run started.
    pub t: f64,
    pub connected: usize,
    pub reports: u64,
    pub instructions: u64,
    pub offered_rps: f64,
    pub admitted_rps: f64,
    pub admitted_to_limit: f64,
}

/// The step of the load and how long the fleet took to enforce the limit after it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StepEnforcement {
    pub factor: f64,
    pub at_s: f64,
    /// From the step until the admitted rate over the trailing 300 ms is within 5% of the
    /// limit; `None` when it never was before the run ended.
    pub enforcement_delay_s: Option<f64>,
}

/// The JSON summary `spillway emulate` prints.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FleetSummary {
    pub hosts: usize,
    pub buckets: usize,
    pub tls: bool,
    pub seconds: f64,
    /// Hosts linked when the run ended.
    pub connected: usize,
    /// When every host was first linked at once, seconds since the start (`None`: never).
    pub all_linked_after_s: Option<f64>,
    /// Streams opened beyond each host's first.
    pub reconnects: u64,
    pub reports_sent: u64,
    pub instructions_received: u64,
    /// The loaded buckets' limits summed, requests per second.
    pub limit_rps: f64,
    /// Over the steady part of the run (from 5 s after the start or 2 s after the step, to the end).
    pub offered_rps: f64,
    pub admitted_rps: f64,
    pub admitted_to_limit: f64,
    pub step: Option<StepEnforcement>,
    pub per_second: Vec<Second>,
}

/// The readings of a run, one per tick.
#[derive(Debug, Default)]
pub struct Record {
    pub readings: Vec<Reading>,
}

impl Record {
    /// The summary of the run: `limit_rps` summed over the loaded buckets.
    pub fn summary(
        &self,
        hosts: usize,
        buckets: usize,
        tls: bool,
        limit_rps: f64,
        step: Option<LoadStep>,
    ) -> FleetSummary {
        let r = &self.readings;
        let last = r.last().copied().unwrap_or_default();
        let rate = |a: &Reading, b: &Reading, f: fn(&Reading) -> f64| {
            let dt = b.t - a.t;
            if dt > 0.0 { (f(b) - f(a)) / dt } else { 0.0 }
        };
        let ratio = |admitted: f64| {
            if limit_rps > 0.0 {
                admitted / limit_rps
            } else {
                0.0
            }
        };
        // One reading per whole second (the last one at or before it).
        let mut per_second = Vec::new();
        let mut previous = Reading::default();
        for second in 1..=(last.t.floor() as usize) {
            let Some(reading) = r.iter().rev().find(|x| x.t <= second as f64 + 1e-6) else {
                continue;
            };
            if reading.t <= previous.t {
                continue;
            }
            let admitted_rps = rate(&previous, reading, |x| x.admitted);
            per_second.push(Second {
                t: reading.t,
                connected: reading.connected,
                reports: reading.reports - previous.reports,
                instructions: reading.instructions - previous.instructions,
                offered_rps: rate(&previous, reading, |x| x.offered),
                admitted_rps,
                admitted_to_limit: ratio(admitted_rps),
            });
            previous = *reading;
        }
        let steady_from = step.map_or(5.0, |s| s.at.as_secs_f64() + 2.0);
        let steady = r
            .iter()
            .find(|x| x.t >= steady_from)
            .filter(|first| first.t < last.t)
            .or(r.first());
        let (offered_rps, admitted_rps) = match steady {
            Some(first) => (
                rate(first, &last, |x| x.offered),
                rate(first, &last, |x| x.admitted),
            ),
            None => (0.0, 0.0),
        };
        let step = step.map(|s| StepEnforcement {
            factor: s.factor,
            at_s: s.at.as_secs_f64(),
            enforcement_delay_s: self.enforcement_delay(s, limit_rps),
        });
        FleetSummary {
            hosts,
            buckets,
            tls,
            seconds: last.t,
            connected: last.connected,
            all_linked_after_s: r.iter().find(|x| x.connected >= hosts).map(|x| x.t),
            reconnects: last.connects.saturating_sub(hosts as u64),
            reports_sent: last.reports,
            instructions_received: last.instructions,
            limit_rps,
            offered_rps,
            admitted_rps,
            admitted_to_limit: ratio(admitted_rps),
            step,
            per_second,
        }
    }

    /// From the step until the admitted rate over the trailing window is within 5% of the limit.
    fn enforcement_delay(&self, step: LoadStep, limit_rps: f64) -> Option<f64> {
        let at = step.at.as_secs_f64();
        let r = &self.readings;
        let first = r.iter().position(|x| x.t >= at)?;
        (first + ENFORCED_WINDOW_TICKS..r.len())
            .find(|&i| {
                let (a, b) = (&r[i - ENFORCED_WINDOW_TICKS], &r[i]);
                (b.admitted - a.admitted) / (b.t - a.t) <= limit_rps * 1.05
            })
            .map(|i| r[i].t - at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Readings of a fleet offered 100/s against a limit of 50/s that admits everything until
    /// `enforced_at` and 50/s after it.
    fn record(enforced_at: f64, seconds: f64) -> Record {
        let mut readings = Vec::new();
        let (mut offered, mut admitted) = (0.0, 0.0);
        let ticks = (seconds / TICK_S).round() as usize;
        for i in 0..=ticks {
            let t = i as f64 * TICK_S;
            readings.push(Reading {
                t,
                connected: 10,
                reports: (t * 10.0) as u64,
                instructions: (t * 10.0) as u64,
                connects: 10,
                offered,
                admitted,
            });
            offered += 100.0 * TICK_S;
            admitted += if t < enforced_at { 100.0 } else { 50.0 } * TICK_S;
        }
        Record { readings }
    }

    #[test]
    fn the_summary_gives_rates_per_second_and_the_enforcement_delay() {
        let step = LoadStep {
            factor: 2.0,
            at: Duration::from_secs(3),
        };
        let summary = record(3.5, 10.0).summary(10, 1, false, 50.0, Some(step));
        assert_eq!(summary.per_second.len(), 10);
        assert!(
            (summary.per_second[0].offered_rps - 100.0).abs() < 1.0,
            "{summary:?}"
        );
        assert!(
            (summary.per_second[9].admitted_rps - 50.0).abs() < 1.0,
            "{summary:?}"
        );
        assert!(
            (summary.admitted_to_limit - 1.0).abs() < 0.02,
            "{summary:?}"
        );
        // Enforced from 3.5 s on: the trailing 300 ms window is clean from about 3.8 s.
        let delay = summary.step.unwrap().enforcement_delay_s.unwrap();
        assert!((0.7..=0.95).contains(&delay), "{delay}");
        assert_eq!(summary.all_linked_after_s, Some(0.0));
    }

    #[test]
    fn a_step_never_enforced_has_no_delay() {
        let step = LoadStep {
            factor: 2.0,
            at: Duration::from_secs(3),
        };
        let summary = record(100.0, 6.0).summary(10, 1, false, 50.0, Some(step));
        assert_eq!(summary.step.as_ref().unwrap().enforcement_delay_s, None);
        assert!(summary.admitted_to_limit > 1.9, "{summary:?}");
    }
}
