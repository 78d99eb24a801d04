//! The figures of a run: enforcement delay, steady-state error, overshoot, fairness, wrongful
//! drops, control-plane bytes and the round trips a central counter costs.

use crate::engine::{FleetSample, TICK_NS, TICKS_PER_SAMPLE, Trace};
use crate::scenario::Scenario;

/// Hosts that offered fewer requests in the measured window are left out of Jain's index: below
/// 50 requests, the binomial noise of a perfectly fair coin alone (at a drop ratio of 2/3, a
/// standard deviation of 0.067 on an admitted fraction of 0.33) pulls the index down.
pub const FAIRNESS_MIN_REQUESTS: u64 = 50;

/// Seconds per sample.
const SAMPLE_S: f64 = (TICK_NS * TICKS_PER_SAMPLE) as f64 / 1e9;

/// The figures of one run. `None` where the scenario does not ask the question (no surge, no
/// overload).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// From the surge to the first 100 ms sample from which every sample of the surge admits at
    /// most 10% over the limit (plus three standard deviations of Poisson noise), up to the end
    /// of the surge or the failure the scenario injects.
    pub enforcement_delay_s: Option<f64>,
    /// `|admitted - limit| / limit` over the measured window, when it is overloaded.
    pub steady_error: Option<f64>,
    /// The highest 1 s average admitted over the limit, `(admitted - limit) / limit`, from one
    /// second after the surge to its end (the first second is the loop's reaction time).
    pub peak_overshoot: Option<f64>,
    /// Jain's index over the hosts' admitted fractions in the measured window: 1 when every host
    /// gets the same share of its requests through, `1/n` when one host gets everything. Hosts
    /// with fewer than [`FAIRNESS_MIN_REQUESTS`] requests in the window are left out.
    pub jain: Option<f64>,
    /// Requests dropped in 1 s windows in which the fleet offered no more than the limit.
    pub wrongful_drops: u64,
    /// Control-plane bytes (every tier, both ways) per live host per second.
    pub control_bytes_per_host_s: f64,
    /// Added latency of a decision: the round trip to the store, median and 99th percentile of
    /// requests (0 for local decisions).
    pub round_trip_p50_ms: f64,
    pub round_trip_p99_ms: f64,
}

impl Metrics {
    pub fn of(scenario: &Scenario, trace: &Trace) -> Metrics {
        let limit = scenario.limit_rps;
        let samples = &trace.samples;
        let rps = |s: &FleetSample| s.admitted as f64 / SAMPLE_S;
        // The surge is over when the load falls, or when the scenario breaks the control plane
        // or a region (what happens then is another question than enforcement).
        let surge_end = [
            Some(scenario.step_to_s),
            scenario.control_down.map(|(from, _)| from),
            scenario.region_loss.map(|(_, at)| at),
        ]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
        let enforcement_delay_s = scenario.surge_at().map(|at| {
            let expected = limit * SAMPLE_S;
            let bound = 1.1 * expected + 3.0 * expected.sqrt();
            let during: Vec<&FleetSample> = samples
                .iter()
                .filter(|s| s.t_s >= at && s.t_s < surge_end)
                .collect();
            let last_over = during.iter().rposition(|s| s.admitted as f64 > bound);
            match last_over {
                None => 0.0,
                Some(i) => during.get(i + 1).map_or(surge_end - at, |s| s.t_s - at),
            }
        });
        let (m0, m1) = scenario.measure;
        let overloaded = scenario.offered_rps(m0) > limit;
        let window: Vec<&FleetSample> = samples
            .iter()
            .filter(|s| s.t_s >= m0 && s.t_s < m1)
            .collect();
        let steady_error = (overloaded && !window.is_empty()).then(|| {
            let mean = window.iter().map(|s| rps(s)).sum::<f64>() / window.len() as f64;
            (mean - limit).abs() / limit
        });
        let peak_overshoot = scenario.surge_at().map(|at| {
            let per_second = (1.0 / SAMPLE_S).round() as usize;
            let after: Vec<f64> = samples
                .iter()
                .filter(|s| s.t_s >= at + 1.0 && s.t_s < surge_end)
                .map(rps)
                .collect();
            after
                .windows(per_second)
                .map(|w| w.iter().sum::<f64>() / w.len() as f64)
                .fold(0.0_f64, |peak, avg| peak.max((avg - limit) / limit))
        });
        let fractions: Vec<f64> = trace
            .measured
            .iter()
            .filter(|(offered, _)| *offered >= FAIRNESS_MIN_REQUESTS)
            .map(|(offered, admitted)| *admitted as f64 / *offered as f64)
            .collect();
        let jain = (!fractions.is_empty()).then(|| jain(&fractions));
        let per_second = (1.0 / SAMPLE_S).round() as usize;
        let wrongful_drops = samples
            .chunks(per_second)
            .filter(|c| {
                let offered: u64 = c.iter().map(|s| s.offered).sum();
                offered as f64 <= limit * c.len() as f64 * SAMPLE_S
            })
            .map(|c| c.iter().map(|s| s.dropped).sum::<u64>())
            .sum();
        let hosts = scenario.hosts as f64;
        let control_bytes_per_host_s = trace.control_bytes as f64 / hosts / scenario.duration_s;
        let (round_trip_p50_ms, round_trip_p99_ms) = (
            percentile(&trace.round_trips, 0.5),
            percentile(&trace.round_trips, 0.99),
        );
        Metrics {
            enforcement_delay_s,
            steady_error,
            peak_overshoot,
            jain,
            wrongful_drops,
            control_bytes_per_host_s,
            round_trip_p50_ms,
            round_trip_p99_ms,
        }
    }
}

/// Jain's fairness index, `(sum x)^2 / (n sum x^2)`: for shares 1, 1, 1, 1 it is 1; for 1, 0, 0,
/// 0 it is 0.25. All zero counts as fair (everyone got the same: nothing).
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        1.0
    } else {
        sum * sum / (xs.len() as f64 * squares)
    }
}

/// The `q` quantile of values weighted by counts, sorted by value; 0 when empty.
fn percentile(weighted: &[(f64, u64)], q: f64) -> f64 {
    let total: u64 = weighted.iter().map(|(_, n)| n).sum();
    if total == 0 {
        return 0.0;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (value, n) in weighted {
        seen += n;
        if seen >= rank {
            return *value;
        }
    }
    weighted.last().map_or(0.0, |(v, _)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert_eq!(jain(&[0.5, 0.5, 0.5, 0.5]), 1.0);
        assert_eq!(jain(&[1.0, 0.0, 0.0, 0.0]), 0.25);
    }

    #[test]
    fn weighted_percentiles_follow_the_counts() {
        let w = [(1.0, 90), (70.0, 10)];
        assert_eq!(percentile(&w, 0.5), 1.0);
        assert_eq!(percentile(&w, 0.99), 70.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
