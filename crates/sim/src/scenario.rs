//! The scenarios: a fleet, a limit, the load over time and what goes wrong when.
//!
//! Every scenario is one global bucket (`api/limited`) over caller hosts spread evenly over
//! regions and zones. The fleet's offered load follows [`Scenario::offered_rps`]; each host takes
//! a fixed part of it by weight, drawn once from the seed. In `tokens` the bucket is a token
//! budget: its limit counts the tokens of the answers ([`Answers`]), not requests.

use crate::{Algorithm, SimError};

/// A burst of one host on top of its usual load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Burst {
    pub host: usize,
    pub from_s: f64,
    pub to_s: f64,
    /// Extra requests per second from that host while the burst lasts.
    pub extra_rps: f64,
}

/// A region's leading controller dies and a standby takes its lease over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Failover {
    /// The region (from 0) whose leader dies.
    pub region: usize,
    /// When it dies (killed: its streams break at once).
    pub at_s: f64,
    /// The lease's TTL: the standby leads this long after the leader's last renewal, at a
    /// higher epoch (the leader renews four times per TTL, so its last renewal is taken to be
    /// the instant it died, the longest takeover).
    pub lease_ttl_s: f64,
}

/// The answers of a token budget (`cost: { response: ... }`): each admitted request's answer
/// costs a number of tokens that the host learns only when the answer ends, and is charged then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Answers {
    /// Each answer's tokens, drawn evenly from this range (both ends included).
    pub tokens: (u64, u64),
    /// The part of the answers that is streamed.
    pub streamed: f64,
    /// A plain answer ends this long after its request was admitted, drawn evenly, in seconds.
    pub plain_s: (f64, f64),
    /// A streamed answer's first token comes this long after admission, in seconds...
    pub first_token_s: f64,
    /// ...and the rest at this many tokens a second: 100 to 2,000 tokens at 200 a second after
    /// 0.5 s end 1.0-10.5 s after admission.
    pub streamed_tokens_per_s: f64,
}

impl Answers {
    /// The mean tokens of an answer.
    pub fn mean(&self) -> f64 {
        (self.tokens.0 + self.tokens.1) as f64 / 2.0
    }

    /// The tokens one answer stands for in the spread of a count of tokens, `E[c^2] / E[c]`
    /// (`spillway_core::counters::CostMoments::unit`): a sum of answers' tokens over a Poisson
    /// count has the variance of a Poisson count of answers of this many tokens each. 1,336 for
    /// 100 to 2,000 tokens (whose mean is 1,050).
    pub fn unit(&self) -> f64 {
        let (a, b) = (self.tokens.0 as f64, self.tokens.1 as f64);
        let n = b - a + 1.0;
        // The mean of c^2 over a..=b: the variance of a discrete uniform plus the mean squared.
        let squares = (n * n - 1.0) / 12.0 + self.mean() * self.mean();
        squares / self.mean()
    }
}

/// A simulated fleet and what happens to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub regions: usize,
    pub zones_per_region: usize,
    pub hosts: usize,
    pub limit_rps: f64,
    pub duration_s: f64,
    /// The fleet's load outside the step.
    pub base_rps: f64,
    /// The fleet's load during `[step_from_s, step_to_s)`.
    pub step_rps: f64,
    pub step_from_s: f64,
    pub step_to_s: f64,
    /// Spread of host weights: each host's weight is `exp(sigma x N(0, 1))`; 0 is an even fleet.
    pub weight_sigma: f64,
    pub burst: Option<Burst>,
    /// Every message between aggregators and controllers, and between controllers, is lost in
    /// this window (and the central counter's store is unreachable).
    pub control_down: Option<(f64, f64)>,
    /// This region (its hosts, aggregators and controller) is lost at this time; its load moves
    /// to the other regions.
    pub region_loss: Option<(usize, f64)>,
    /// A region's leading controller dies and its standby takes over.
    pub controller_failover: Option<Failover>,
    /// This host leaves at this time (its stream to the aggregator ends, as a sidecar's does when
    /// its instance stops); its load moves to the other hosts.
    pub host_leave: Option<(usize, f64)>,
    /// The window in which fairness and steady-state error are measured.
    pub measure: (f64, f64),
    /// Drop-ratio hosts correct a surge of their own between instructions, as the real client
    /// does (`spillway_core::surge`); off, they wait for the control plane.
    pub surge_guard: bool,
    /// The part of the fleet's requests that is `sheddable`, the rest `critical`:
    /// half the hosts send twice this share, the other half the rest.
    pub sheddable_share: f64,
    /// The bucket is a token budget, its limit in tokens a second and its answers these; the
    /// offered load (`base_rps`, `step_rps`) stays in requests a second.
    pub answers: Option<Answers>,
}

/// The names of every scenario, in the order `--scenario all` runs them.
pub const NAMES: [&str; 10] = [
    "surge-15x",
    "overload-1.5x",
    "many-callers",
    "host-burst",
    "control-plane-down",
    "region-loss",
    "criticality",
    "sidecar-leaves",
    "controller-failover",
    "tokens",
];

impl Scenario {
    /// The scenario called `name`, lasting `duration_s` seconds instead of its default when given
    /// (phases keep their start and end relative to the end, see each scenario).
    pub fn named(name: &str, duration_s: Option<f64>) -> Result<Scenario, SimError> {
        let mut s = match name {
            // GRL's published case: 22K to 367K RPS, 1,000 caller hosts, 3 regions x 3
            // zones, against a limit a little above the usual load.
            "surge-15x" => Scenario {
                name: "surge-15x",
                about: "22K to 367K RPS over 1,000 hosts in 3 regions x 3 zones, limit 25K/s",
                hosts: 1000,
                limit_rps: 25_000.0,
                duration_s: 80.0,
                base_rps: 22_000.0,
                step_rps: 367_000.0,
                step_from_s: 20.0,
                step_to_s: 70.0,
                measure: (30.0, 70.0),
                ..Scenario::base()
            },
            "overload-1.5x" => Scenario {
                name: "overload-1.5x",
                about: "300 hosts step from 8K to 15K RPS against a limit of 10K/s",
                hosts: 300,
                limit_rps: 10_000.0,
                duration_s: 60.0,
                base_rps: 8_000.0,
                step_rps: 15_000.0,
                step_from_s: 20.0,
                step_to_s: 60.0,
                measure: (30.0, 60.0),
                ..Scenario::base()
            },
            // More callers than the limit has requests per second: 2,000 hosts of very uneven
            // sizes share 500/s, most of them sending under one request per second.
            "many-callers" => Scenario {
                name: "many-callers",
                about: "2,000 uneven callers offer 1,500 RPS against a limit of 500/s",
                hosts: 2000,
                limit_rps: 500.0,
                duration_s: 100.0,
                base_rps: 400.0,
                step_rps: 1_500.0,
                step_from_s: 20.0,
                step_to_s: 100.0,
                weight_sigma: 1.0,
                measure: (40.0, 100.0),
                ..Scenario::base()
            },
            // One host bursts 50x for 3 s while the fleet stays under its limit.
            "host-burst" => Scenario {
                name: "host-burst",
                about: "100 hosts offer 6K RPS, limit 10K/s; host 0 adds 3K RPS from 25 s to 28 s",
                hosts: 100,
                limit_rps: 10_000.0,
                duration_s: 40.0,
                base_rps: 6_000.0,
                step_rps: 6_000.0,
                step_from_s: 0.0,
                step_to_s: 40.0,
                burst: Some(Burst {
                    host: 0,
                    from_s: 25.0,
                    to_s: 28.0,
                    extra_rps: 3_000.0,
                }),
                measure: (20.0, 35.0),
                ..Scenario::base()
            },
            "control-plane-down" => Scenario {
                name: "control-plane-down",
                about: "1.5x overload; aggregators lose their controllers from 35 s to 55 s",
                hosts: 300,
                limit_rps: 10_000.0,
                duration_s: 80.0,
                base_rps: 8_000.0,
                step_rps: 15_000.0,
                step_from_s: 20.0,
                step_to_s: 80.0,
                control_down: Some((35.0, 55.0)),
                measure: (25.0, 35.0),
                ..Scenario::base()
            },
            "region-loss" => Scenario {
                name: "region-loss",
                about: "1.5x overload over 900 hosts; region 3 is lost at 35 s, its load fails over",
                hosts: 900,
                limit_rps: 10_000.0,
                duration_s: 70.0,
                base_rps: 8_000.0,
                step_rps: 15_000.0,
                step_from_s: 20.0,
                step_to_s: 70.0,
                region_loss: Some((2, 35.0)),
                measure: (45.0, 70.0),
                ..Scenario::base()
            },
            // The leader of region 1 is killed under a 1.5x overload; its standby takes the lease
            // after its TTL (3 s, the default with 1 s intervals) at the next epoch, while the
            // hosts hold their last instructions (TTL 5 s).
            "controller-failover" => Scenario {
                name: "controller-failover",
                about: "1.5x overload over 900 hosts; region 1's leading controller is killed at 35 s, its standby leads after the 3 s lease",
                hosts: 900,
                limit_rps: 10_000.0,
                duration_s: 60.0,
                base_rps: 8_000.0,
                step_rps: 15_000.0,
                step_from_s: 20.0,
                step_to_s: 60.0,
                controller_failover: Some(Failover {
                    region: 0,
                    at_s: 35.0,
                    lease_ttl_s: 3.0,
                }),
                measure: (45.0, 60.0),
                ..Scenario::base()
            },
            // the same 1.5x overload, 40% of it sheddable. The third to drop is 5/6 of
            // the sheddable traffic, and no critical request.
            "criticality" => Scenario {
                name: "criticality",
                about: "1.5x overload of which 40% is sheddable: 8K to 15K RPS, limit 10K/s",
                hosts: 300,
                limit_rps: 10_000.0,
                duration_s: 60.0,
                base_rps: 8_000.0,
                step_rps: 15_000.0,
                step_from_s: 20.0,
                step_to_s: 60.0,
                measure: (30.0, 60.0),
                sheddable_share: 0.4,
                ..Scenario::base()
            },
            // The demo's fleet (`spillway demo`), so real processes and the simulator can run the
            // same shape (bench/control): four hosts in two zones step 15x over the limit, then
            // one leaves and its load moves to the other three.
            "sidecar-leaves" => Scenario {
                name: "sidecar-leaves",
                about: "4 hosts in 2 zones step from 120 to 1,800 RPS, limit 200/s; host 4 leaves at 9 s",
                regions: 1,
                zones_per_region: 2,
                hosts: 4,
                limit_rps: 200.0,
                duration_s: 15.0,
                base_rps: 120.0,
                step_rps: 1_800.0,
                step_from_s: 3.0,
                step_to_s: 15.0,
                weight_sigma: 0.0,
                host_leave: Some((3, 9.0)),
                measure: (5.0, 9.0),
                ..Scenario::base()
            },
            // The control-plane token budget's benchmark (docs/token-budgets.md): four sidecars
            // share one global budget of 10,000 tokens a second; answers of 100 to 2,000
            // tokens (1,050 on average), half of them streamed. They offer half the budget in
            // tokens for 30 s (what the budget refuses then, it refuses wrongly), then 4 times
            // it; the measured window starts 10 s after the step, when every answer admitted
            // before it has ended.
            "tokens" => {
                let answers = Answers {
                    tokens: (100, 2_000),
                    streamed: 0.5,
                    plain_s: (0.2, 1.0),
                    first_token_s: 0.5,
                    streamed_tokens_per_s: 200.0,
                };
                let limit = 10_000.0;
                Scenario {
                    name: "tokens",
                    about: "4 hosts share a budget of 10,000 tokens/s; answers of 100-2,000 tokens, half streamed, charged when they end; 0.5x the budget in tokens, then 4x from 30 s",
                    regions: 1,
                    zones_per_region: 1,
                    hosts: 4,
                    limit_rps: limit,
                    duration_s: 90.0,
                    base_rps: 0.5 * limit / answers.mean(),
                    step_rps: 4.0 * limit / answers.mean(),
                    step_from_s: 30.0,
                    step_to_s: 90.0,
                    weight_sigma: 0.0,
                    measure: (40.0, 90.0),
                    answers: Some(answers),
                    ..Scenario::base()
                }
            }
            other => {
                return Err(SimError::UnknownScenario {
                    name: other.to_owned(),
                });
            }
        };
        if let Some(d) = duration_s {
            if !(d >= 5.0 && d.is_finite()) {
                return Err(SimError::Duration(d));
            }
            s.stretch(d);
        }
        Ok(s)
    }

    fn base() -> Scenario {
        Scenario {
            name: "",
            about: "",
            regions: 3,
            zones_per_region: 3,
            hosts: 0,
            limit_rps: 0.0,
            duration_s: 0.0,
            base_rps: 0.0,
            step_rps: 0.0,
            step_from_s: 0.0,
            step_to_s: 0.0,
            weight_sigma: 0.5,
            burst: None,
            control_down: None,
            region_loss: None,
            controller_failover: None,
            host_leave: None,
            measure: (0.0, 0.0),
            surge_guard: true,
            sheddable_share: 0.0,
            answers: None,
        }
    }

    /// Changes the duration: instants in the first half of the default run keep their time,
    /// those in the second half keep their distance to the end (the surge of `surge-15x`, 20 s
    /// to 70 s of 80 s, runs from 20 s to 590 s of 600 s).
    fn stretch(&mut self, duration_s: f64) {
        let old = self.duration_s;
        let tail = |t: f64| {
            if t > old / 2.0 {
                (duration_s - (old - t)).max(old / 2.0).min(duration_s)
            } else {
                t.min(duration_s)
            }
        };
        self.step_to_s = tail(self.step_to_s);
        self.measure.1 = tail(self.measure.1);
        if let Some((_, at)) = &mut self.host_leave {
            *at = tail(*at);
        }
        self.measure.0 = self.measure.0.min(self.measure.1);
        self.duration_s = duration_s;
    }

    /// Splits the scenario over `hosts` hosts: the fleet's load, its limit and its phases stay, and
    /// each host takes a smaller part of the load (100,000 hosts of `surge-15x` offer 3.7 RPS
    /// each in the surge). `sidecar-leaves` is the demo's four sidecars and keeps them.
    pub fn set_hosts(&mut self, hosts: usize) -> Result<(), SimError> {
        if self.name == "sidecar-leaves" {
            return Err(SimError::FixedFleet { name: self.name });
        }
        let least = self.zones().max(self.burst.map_or(0, |b| b.host + 1));
        if hosts < least {
            return Err(SimError::Hosts { hosts, least });
        }
        self.hosts = hosts;
        Ok(())
    }

    /// The fleet's offered load at `t_s` (without the burst).
    pub fn offered_rps(&self, t_s: f64) -> f64 {
        if (self.step_from_s..self.step_to_s).contains(&t_s) {
            self.step_rps
        } else {
            self.base_rps
        }
    }

    /// The fleet's offered load at `t_s` in the limit's units: requests a second, or for a
    /// token budget tokens a second (requests times an answer's mean tokens).
    pub fn offered_per_s(&self, t_s: f64) -> f64 {
        self.offered_rps(t_s) * self.unit_mean()
    }

    /// The instant the load steps above the limit, when it does.
    pub fn surge_at(&self) -> Option<f64> {
        let (base, step) = (
            self.base_rps * self.unit_mean(),
            self.step_rps * self.unit_mean(),
        );
        (step > self.limit_rps && base <= self.limit_rps).then_some(self.step_from_s)
    }

    /// What a request counts for in the limit, on average: 1, or an answer's mean tokens.
    fn unit_mean(&self) -> f64 {
        self.answers.map_or(1.0, |a| a.mean())
    }

    /// Whether `algorithm` can run the scenario: a token budget is a drop-ratio bucket of the
    /// control plane (or a bucket of a local or Redis store, which the simulator does not run).
    pub fn runs(&self, algorithm: Algorithm) -> bool {
        self.answers.is_none()
            || matches!(algorithm, Algorithm::DropRatio | Algorithm::DropRatioCoin)
    }

    /// Zones in all.
    pub fn zones(&self) -> usize {
        self.regions * self.zones_per_region
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_builds_and_unknown_names_are_refused() {
        for name in NAMES {
            let s = Scenario::named(name, None).unwrap();
            assert_eq!(s.name, name);
            assert!(s.measure.0 < s.measure.1);
        }
        assert!(Scenario::named("surge", None).is_err());
    }

    #[test]
    fn tokens_offers_half_its_budget_then_four_times_it_and_runs_only_drop_ratio() {
        let s = Scenario::named("tokens", None).unwrap();
        let answers = s.answers.unwrap();
        assert_eq!(answers.mean(), 1_050.0);
        // E[c^2] / E[c] of 100..=2,000 drawn evenly.
        assert!((answers.unit() - 1_336.5).abs() < 1.0, "{}", answers.unit());
        assert!((s.offered_per_s(0.0) / s.limit_rps - 0.5).abs() < 1e-9);
        assert!((s.offered_per_s(s.step_from_s) / s.limit_rps - 4.0).abs() < 1e-9);
        assert_eq!(s.surge_at(), Some(s.step_from_s));
        assert!(s.runs(Algorithm::DropRatio) && s.runs(Algorithm::DropRatioCoin));
        assert!(!s.runs(Algorithm::AdaptiveTokenBucket) && !s.runs(Algorithm::CentralCounter));
        let mut more = s.clone();
        more.set_hosts(40).unwrap();
        assert_eq!((more.hosts, more.step_rps), (40, s.step_rps));
    }

    #[test]
    fn a_host_count_splits_the_same_load_and_fixed_fleets_refuse_one() {
        let mut s = Scenario::named("surge-15x", None).unwrap();
        s.set_hosts(100_000).unwrap();
        assert_eq!(
            (s.hosts, s.step_rps, s.limit_rps),
            (100_000, 367_000.0, 25_000.0)
        );
        assert_eq!(
            s.set_hosts(8),
            Err(SimError::Hosts { hosts: 8, least: 9 }),
            "one host per zone at least"
        );
        let mut demo = Scenario::named("sidecar-leaves", None).unwrap();
        assert!(matches!(
            demo.set_hosts(100),
            Err(SimError::FixedFleet { .. })
        ));
        assert_eq!(demo.hosts, 4);
    }

    #[test]
    fn stretching_keeps_the_surge_to_the_end() {
        let s = Scenario::named("surge-15x", Some(600.0)).unwrap();
        assert_eq!(s.step_from_s, 20.0);
        assert_eq!((s.step_to_s, s.measure.1), (590.0, 590.0));
        let o = Scenario::named("overload-1.5x", Some(600.0)).unwrap();
        assert_eq!((o.step_to_s, o.measure.1), (600.0, 600.0));
        assert_eq!(o.offered_rps(599.0), 15_000.0);
    }
}
