//! A token budget's answers: each admitted request's tokens reach its host's counts only when
//! its answer ends, as the client counts a control-plane budget.
//!
//! A host's bucket counts tokens ([`HostCore`](spillway_loop::HostCore) reports what it is
//! given): an answer is counted as offered and admitted at its tokens in the tick it ends, a
//! dropped request at once as offered at the mean of the host's answers so far
//! ([`CostMoments::dropped_cost`]), and the surge guard counts in `E[c^2] / E[c]` of them
//! ([`CostMoments::unit`]), the very sums and rules of the client's budget. Each count adds its
//! square to the host's sum of squares (`Snapshot::squares`, as the client's
//! `BucketCounters::record_cost_tier` does), which its reports carry so that the controller
//! judges noise by the answers' sizes. Until an answer ends, its tokens are in flight:
//! admitted, not yet charged.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use spillway_core::algo::{Gcra, Rate};
use spillway_core::clock::Nanos;
use spillway_core::counters::CostMoments;
use spillway_core::criticality::TIERS;

use spillway_loop::HostStep;

use super::{FleetSample, Host, Limiter, TICK_NS, TICKS_PER_SAMPLE, guard_catch_up};
use crate::SimError;
use crate::scenario::{Answers, Scenario};

/// What a run of a token budget leaves for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenTrace {
    /// Tokens of the answers that ended within the measured window.
    pub window_tokens: u64,
    /// Answers that ended within the measured window.
    pub window_answers: u64,
    /// While the fleet offered under the budget (before the step): requests offered, refused,
    /// and refused while the budget had room (a replay of the budget, below, held a token).
    pub under_offered: u64,
    pub under_refused: u64,
    pub under_wrongful: u64,
}

/// The answers in flight and what the hosts settled.
pub(super) struct Flight {
    answers: Answers,
    /// Tokens and response times, a stream of their own: the arrivals and coins are those of
    /// the same scenario without a budget.
    rng: StdRng,
    /// Answers in flight by the tick they end: (tick, host, tier, tokens).
    ending: BinaryHeap<Reverse<(u64, usize, usize, u64)>>,
    /// Per host: its settled answers.
    moments: Vec<CostMoments>,
    /// The budget replayed exactly (a meter of the limit holding one second of it), charged
    /// each answer's tokens when it ends: what "the budget had room" means for a refusal.
    replay: Gcra,
    pub(super) trace: TokenTrace,
}

impl Flight {
    pub(super) fn new(scenario: &Scenario, seed: u64) -> Result<Option<Self>, SimError> {
        let Some(answers) = scenario.answers else {
            return Ok(None);
        };
        let limit = scenario.limit_rps.round().max(1.0) as u64;
        let invalid = |e: &dyn std::fmt::Display| SimError::Rules(e.to_string());
        let rate = Rate::per_second(limit).map_err(|e| invalid(&e))?;
        Ok(Some(Self {
            answers,
            rng: StdRng::seed_from_u64(seed ^ 0x70_6b65_6e73),
            ending: BinaryHeap::new(),
            moments: vec![CostMoments::default(); scenario.hosts],
            replay: Gcra::new(rate, Some(limit)).map_err(|e| invalid(&e))?,
            trace: TokenTrace::default(),
        }))
    }

    fn tokens(&mut self) -> u64 {
        let (low, high) = self.answers.tokens;
        self.rng.random_range(low..=high)
    }

    /// Host `i` decided `by_tier` requests at tick `tick`, admitting `allowed_by_tier`: each
    /// admitted one is answered later, each dropped one is counted now at the host's mean.
    /// `sample` and `measured` are the run's figures in tokens (offered: every request's
    /// tokens, drawn also for those never answered), `sample.dropped` in requests.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decided(
        &mut self,
        scenario: &Scenario,
        (i, host): (usize, &mut Host),
        (tick, now): (u64, Nanos),
        by_tier: &[u64; TIERS],
        allowed_by_tier: &[u64; TIERS],
        sample: &mut FleetSample,
        measured: Option<&mut (u64, u64)>,
    ) {
        let dropped_cost = self.moments[i].dropped_cost(1);
        let mut offered = 0;
        let mut refused = 0;
        for (tier, (&n, &allowed)) in by_tier.iter().zip(allowed_by_tier).enumerate() {
            let dropped = n - allowed;
            host.totals.dropped += dropped * dropped_cost;
            host.totals.tiers[tier].dropped += dropped * dropped_cost;
            host.totals.squares = host
                .totals
                .squares
                .wrapping_add(dropped * dropped_cost * dropped_cost);
            refused += dropped;
            for _ in 0..dropped {
                offered += self.tokens();
            }
            for _ in 0..allowed {
                let tokens = self.tokens();
                offered += tokens;
                let a = &self.answers;
                let after_s = if self.rng.random::<f64>() < a.streamed {
                    a.first_token_s + tokens as f64 / a.streamed_tokens_per_s
                } else {
                    self.rng.random_range(a.plain_s.0..=a.plain_s.1)
                };
                let ticks = (after_s * 1e9 / TICK_NS as f64).round().max(1.0) as u64;
                self.ending.push(Reverse((tick + ticks, i, tier, tokens)));
            }
        }
        sample.offered += offered;
        sample.dropped += refused;
        if let Some(measured) = measured {
            measured.0 += offered;
        }
        let t_s = (tick * TICK_NS) as f64 / 1e9;
        if t_s < scenario.step_from_s {
            let t = &mut self.trace;
            t.under_offered += by_tier.iter().sum::<u64>();
            t.under_refused += refused;
            if refused > 0 && self.replay.quota(now).remaining >= 1 {
                t.under_wrongful += refused;
            }
        }
    }

    /// The answers that end at tick `tick`: each is counted by its host as offered and
    /// admitted at its tokens, and charged to the replayed budget. Hosts that left settle
    /// nothing (their streams ended with them). A host whose guard fell behind while it was
    /// quiet first runs the ticks it missed with the totals it had then, as before an arrival
    /// (`guard_catch_up`): an answer that ends changes its counts as an arrival does.
    pub(super) fn settle(
        &mut self,
        scenario: &Scenario,
        (tick, now): (u64, Nanos),
        (hosts, guarded, steps): (&mut [Host], &mut [Nanos], &mut Vec<HostStep>),
        alive: &[bool],
        samples: &mut [FleetSample],
        measured: &mut [(u64, u64)],
    ) {
        let t_s = (tick * TICK_NS) as f64 / 1e9;
        let in_window = (scenario.measure.0..scenario.measure.1).contains(&t_s);
        let sample = (tick / TICKS_PER_SAMPLE) as usize;
        while let Some(&Reverse((at, i, tier, tokens))) = self.ending.peek() {
            if at > tick {
                break;
            }
            self.ending.pop();
            if !alive[i] {
                continue;
            }
            let host = &mut hosts[i];
            if let Limiter::Drop(_) = host.limiter {
                // The ticks before this instant: the one at it comes after, with the answer.
                guard_catch_up(host, &mut guarded[i], now - 1, steps);
            }
            host.totals.allowed += tokens;
            host.totals.tiers[tier].allowed += tokens;
            host.totals.squares = host.totals.squares.wrapping_add(tokens * tokens);
            self.moments[i].add(tokens);
            // The link reads the unit before every guard tick; it changes only here.
            host.core.set_units(&[self.moments[i].unit()]);
            self.replay.settle(now, 0, tokens);
            if let Some(s) = samples.get_mut(sample) {
                s.admitted += tokens;
            }
            if in_window {
                measured[i].1 += tokens;
                self.trace.window_tokens += tokens;
                self.trace.window_answers += 1;
            }
        }
    }
}
