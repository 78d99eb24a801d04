//! The figures of a run: enforcement delay, steady-state error, overshoot, fairness, wrongful
//! drops, control-plane bytes and the round trips a central counter costs.

use crate::engine::{FleetSample, TICK_NS, TICKS_PER_SAMPLE, Trace};
use crate::scenario::Scenario;
use spillway_core::criticality::Criticality;

/// Hosts that offered fewer requests in the measured window are left out of Jain's index: below
/// 50 requests, the binomial noise of a perfectly fair coin alone (at a drop ratio of 2/3, a
/// standard deviation of 0.067 on an admitted fraction of 0.33) pulls the index down.
pub const FAIRNESS_MIN_REQUESTS: u64 = 50;

/// Seconds per sample.
const SAMPLE_S: f64 = (TICK_NS * TICKS_PER_SAMPLE) as f64 / 1e9;

/// How long every sample must stay within the bound for the limit to count as enforced: 2 s.
/// The delay is the start of the first such run, so a noisy sample after it changes nothing
/// (what comes after shows in the peak overshoot); with "from the last sample over the bound
/// on", one 100 ms sample at 41 s once made `many-callers` read 43 s instead of 1.4 s.
pub const ENFORCED_FOR_S: f64 = 2.0;

/// The noise of a scenario's figures, what a perfect limiter would still show: Poisson arrivals
/// at the limit, and a fair coin's binomial spread of each host's admitted fraction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    /// Three standard deviations of a 100 ms sample admitting the limit, relative to it: the
    /// margin of the enforcement bound (`sqrt(L x 0.1 s)`).
    pub sample_3sd: f64,
    /// Three standard deviations of a 1 s window at the limit, relative to it: the noise of the
    /// peak overshoot and of the second after the first.
    pub second_3sd: f64,
    /// Three standard deviations of the measured window's mean at the limit, relative to it:
    /// the noise of the steady-state error.
    pub window_3sd: f64,
    /// Jain's index that independent coins alone would give the measured hosts at the ratio
    /// they saw (`1 / (1 + mean((1 - p) / (p n)))`), when the window is overloaded: below it,
    /// a limiter is less fair than a coin.
    pub coin_jain: Option<f64>,
}

/// The figures of one run. `None` where the scenario does not ask the question (no surge, no
/// overload).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// From the surge to the first 100 ms sample that starts [`ENFORCED_FOR_S`] of samples that
    /// each admit at most 10% over the limit (plus three standard deviations of Poisson noise,
    /// [`Noise::sample_3sd`]), up to the end of the surge or the failure the scenario injects.
    pub enforcement_delay_s: Option<f64>,
    /// `|admitted - limit| / limit` over the measured window, when it is overloaded.
    pub steady_error: Option<f64>,
    /// The highest 1 s average admitted over the limit, `(admitted - limit) / limit`, from one
    /// second after the surge to its end (the first second is the loop's reaction time).
    pub peak_overshoot: Option<f64>,
    /// What the second after the first (surge + 1 s to + 2 s) admitted over the limit,
    /// `(admitted - limit) / limit`: how much of the surge gets past the first instruction.
    pub second_after_first: Option<f64>,
    /// The noise band of these figures.
    pub noise: Noise,
    /// Jain's index over the hosts' admitted fractions in the measured window: 1 when every host
    /// gets the same share of its requests through, `1/n` when one host gets everything. Hosts
    /// with fewer than [`FAIRNESS_MIN_REQUESTS`] requests in the window are left out. `None` when
    /// the scenario mixes criticality tiers, which hosts send in different shares.
    pub jain: Option<f64>,
    /// Requests dropped in 1 s windows in which the fleet offered no more than the limit.
    pub wrongful_drops: u64,
    /// Control-plane bytes (every tier, both ways) per live host per second.
    pub control_bytes_per_host_s: f64,
    /// Added latency of a decision: the round trip to the store, median and 99th percentile of
    /// requests (0 for local decisions).
    pub round_trip_p50_ms: f64,
    pub round_trip_p99_ms: f64,
    /// The share of each tier's requests dropped in the measured window, when the scenario
    /// sends more than one tier.
    pub tier_drops: Option<TierDrops>,
    /// A token budget's figures, when the scenario's bucket is one.
    pub tokens: Option<TokenFigures>,
}

/// What a token budget admitted and refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenFigures {
    /// The tokens of the answers that ended in the measured window over what the budget allows
    /// in it (limit x seconds): 1 is the budget exactly.
    pub admitted: f64,
    /// The answers that ended in the window.
    pub answers: u64,
    /// The load before the step, a factor of the budget in tokens (0.5: half of it).
    pub under_factor: f64,
    /// Requests offered then, refused, and refused while the budget had room (a replay of the
    /// budget, charged each answer's tokens when it ended, held a token): wrongful refusals.
    pub under_offered: u64,
    pub under_refused: u64,
    pub under_wrongful: u64,
}

/// What each criticality tier lost in the measured window: its dropped requests over its
/// offered ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierDrops {
    pub critical: f64,
    pub sheddable: f64,
    /// Over both: the bucket's drop ratio as the fleet saw it.
    pub all: f64,
}

impl Metrics {
    pub fn of(scenario: &Scenario, trace: &Trace) -> Metrics {
        let limit = scenario.limit_rps;
        let samples = &trace.samples;
        let rps = |s: &FleetSample| s.admitted as f64 / SAMPLE_S;
        // A token budget's count is a sum of answers of spread sizes: the noise of a Poisson
        // count of answers of `unit` tokens each (`Answers::unit`).
        let unit = scenario.answers.map_or(1.0, |a| a.unit());
        // The surge is over when the load falls, or when the scenario breaks the control plane
        // or a region (what happens then is another question than enforcement).
        let surge_end = [
            Some(scenario.step_to_s),
            scenario.control_down.map(|(from, _)| from),
            scenario.region_loss.map(|(_, at)| at),
            scenario.controller_failover.map(|f| f.at_s),
        ]
        .into_iter()
        .flatten()
        .fold(f64::INFINITY, f64::min);
        let enforcement_delay_s = scenario.surge_at().map(|at| {
            let expected = limit * SAMPLE_S;
            let bound = 1.1 * expected + 3.0 * (expected * unit).sqrt();
            let during: Vec<&FleetSample> = samples
                .iter()
                .filter(|s| s.t_s >= at && s.t_s < surge_end)
                .collect();
            let run = (ENFORCED_FOR_S / SAMPLE_S).round() as usize;
            let held = |i: usize| {
                during[i..]
                    .iter()
                    .take(run)
                    .all(|s| s.admitted as f64 <= bound)
            };
            (0..during.len())
                .find(|&i| held(i))
                .map_or(surge_end - at, |i| during[i].t_s - at)
        });
        let (m0, m1) = scenario.measure;
        let overloaded = scenario.offered_per_s(m0) > limit;
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
        let second_after_first = scenario.surge_at().and_then(|at| {
            let second: Vec<f64> = samples
                .iter()
                .filter(|s| s.t_s >= at + 1.0 - 1e-9 && s.t_s < at + 2.0 - 1e-9)
                .map(rps)
                .collect();
            (!second.is_empty() && at + 2.0 <= surge_end)
                .then(|| (second.iter().sum::<f64>() / second.len() as f64 - limit) / limit)
        });
        let band = |seconds: f64| 3.0 / (limit / unit * seconds).max(1e-9).sqrt();
        let kept = {
            let (offered, admitted) = trace
                .measured
                .iter()
                .fold((0u64, 0u64), |(o, a), (ho, ha)| (o + ho, a + ha));
            (offered > 0).then(|| admitted as f64 / offered as f64)
        };
        let coin_jain = kept.filter(|_| overloaded).map(|p| {
            let hosts: Vec<f64> = trace
                .measured
                .iter()
                .filter(|(offered, _)| *offered >= FAIRNESS_MIN_REQUESTS)
                .map(|(offered, _)| (1.0 - p) / (p.max(1e-9) * *offered as f64))
                .collect();
            let mean = hosts.iter().sum::<f64>() / hosts.len().max(1) as f64;
            1.0 / (1.0 + mean)
        });
        let noise = Noise {
            sample_3sd: band(SAMPLE_S),
            second_3sd: band(1.0),
            window_3sd: band(m1 - m0),
            coin_jain,
        };
        let fractions: Vec<f64> = trace
            .measured
            .iter()
            .filter(|(offered, _)| *offered >= FAIRNESS_MIN_REQUESTS)
            .map(|(offered, admitted)| *admitted as f64 / *offered as f64)
            .collect();
        // Hosts of different tiers are meant to get different shares through: fairness among
        // them is no question when the scenario mixes tiers.
        let jain =
            (!fractions.is_empty() && scenario.sheddable_share == 0.0).then(|| jain(&fractions));
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
        let tier_drops = trace
            .measured_tiers
            .filter(|_| scenario.sheddable_share > 0.0)
            .map(|tiers| {
                let lost = |(offered, admitted): (u64, u64)| {
                    if offered == 0 {
                        0.0
                    } else {
                        1.0 - admitted as f64 / offered as f64
                    }
                };
                let all = tiers.iter().fold((0, 0), |(o, a), &(offered, admitted)| {
                    (o + offered, a + admitted)
                });
                TierDrops {
                    critical: lost(tiers[Criticality::Critical.index()]),
                    sheddable: lost(tiers[Criticality::Sheddable.index()]),
                    all: lost(all),
                }
            });
        let tokens = trace
            .tokens
            .zip(scenario.answers)
            .map(|(t, answers)| TokenFigures {
                admitted: t.window_tokens as f64 / (limit * (m1 - m0)).max(1e-9),
                answers: t.window_answers,
                under_factor: scenario.base_rps * answers.mean() / limit,
                under_offered: t.under_offered,
                under_refused: t.under_refused,
                under_wrongful: t.under_wrongful,
            });
        Metrics {
            tokens,
            tier_drops,
            enforcement_delay_s,
            steady_error,
            peak_overshoot,
            second_after_first,
            noise,
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
