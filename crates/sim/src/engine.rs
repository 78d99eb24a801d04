//! The discrete-event engine: hosts, aggregators and controllers in simulated time.
//!
//! Time moves in 10 ms ticks. In each tick every live host draws its arrivals (Poisson) and
//! decides them with the core's limiter; messages between tiers are events at their exact
//! delivery instant, with a random delay and a chance of loss. Every control decision is the
//! real code: each host runs `spillway_loop::HostCore` (its reports and tails, instructions,
//! surge guard and share expiry), each aggregator `spillway_loop::ZoneCore`, each controller
//! `spillway_loop::RegionCore`, the very cores the link and the gRPC servers drive; hosts decide
//! with `spillway_core::algo::{DropRatio, AdaptiveTokenBucket}`, and the central counter is the
//! core's `TokenBucket`. This file holds only the network, the clock and the load; a token
//! budget's answers, which reach their hosts' counts only when they end, are in
//! `engine/answers.rs`.
//!
//! How a tick's requests are decided (the only shortcut, and why it changes nothing):
//! - drop-ratio: one `DropRatio::decide_with` call per request with the simulation's seeded
//!   generator (the drop schedule's dither). With the coin instead (`drop-ratio-coin`), up to 32
//!   arrivals are decided one by one and above that the number dropped is one binomial draw
//!   with the ratio `DropRatio::current` returns: each request is an independent coin against
//!   the same ratio, so the number dropped is exactly Binomial(n, ratio).
//! - adaptive token bucket and central counter: one `decide(now, 1)` per request until the first
//!   denial. Time does not move within a tick and a denial leaves the state unchanged, so every
//!   later request of the same instant would be denied too: the calls are skipped, not guessed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_distr::{Binomial, Distribution, Exp, Poisson, StandardNormal};
use spillway_core::algo::{
    AdaptiveTokenBucket, DEFAULT_HISTORY_SECS, DropRatio, Rate, Ratio, TokenBucket,
};
use spillway_core::clock::{NANOS_PER_SEC, Nanos};
use spillway_core::counters::Snapshot;
use spillway_core::criticality::{Criticality, TIERS};
use spillway_core::surge;
use spillway_loop::{
    HostCore, HostId, HostStep, HostTime, RegionCore, RegionStep, RulesSnapshot, SteeredLimiter,
    ZoneCore, ZoneStep,
};
use spillway_proto::v1;

use crate::queue::Queue;
use crate::scenario::Scenario;
use crate::{Algorithm, SimError};

mod answers;
pub use answers::TokenTrace;

/// One tick of simulated time.
pub const TICK_NS: Nanos = 10_000_000;
/// Ticks per sample of the time series (100 ms).
pub const TICKS_PER_SAMPLE: u64 = 10;
/// Simulated time starts here (one hour), so interval numbers are never near zero.
const EPOCH_NS: Nanos = 3_600 * NANOS_PER_SEC;
/// The coin's per-request decisions up to this many arrivals in a tick; a binomial draw above.
const COIN_LIMIT: u64 = 32;
const SERVICE: &str = "api";
const BUCKET: &str = "limited";
/// gRPC puts a 5-byte prefix before every message on a stream.
const GRPC_FRAME: u64 = 5;

/// Delays and losses between the tiers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Network {
    /// Host to its zone's aggregator, one way: base and mean of an exponential extra, in ms.
    pub host_aggregator_ms: (f64, f64),
    /// Aggregator to its region's controller.
    pub aggregator_controller_ms: (f64, f64),
    /// Controller to controller, across regions.
    pub peer_ms: (f64, f64),
    /// Chance that any one control-plane message is lost.
    pub loss: f64,
    /// Round trip from a host to the central counter's store, in its own zone, another zone of
    /// its region, and another region (the store lives in zone 1 of region 1).
    pub store_rtt_ms: (f64, f64, f64),
}

impl Default for Network {
    fn default() -> Self {
        Self {
            host_aggregator_ms: (0.2, 0.3),
            aggregator_controller_ms: (0.5, 0.5),
            peer_ms: (30.0, 5.0),
            loss: 0.001,
            store_rtt_ms: (0.5, 1.5, 70.0),
        }
    }
}

/// The fleet's totals over one 100 ms sample. For a token budget `offered` and `admitted` are
/// tokens (every request's, and those of the answers that ended in the sample), `dropped` is
/// requests.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FleetSample {
    /// Start of the sample, seconds since the start of the run.
    pub t_s: f64,
    pub offered: u64,
    pub admitted: u64,
    /// Requests denied in this sample (for the central counter, when the store decided them).
    pub dropped: u64,
}

/// What a run leaves behind for the metrics.
#[derive(Debug, Clone)]
pub struct Trace {
    pub samples: Vec<FleetSample>,
    /// Per host: offered and admitted within the scenario's measured window.
    pub measured: Vec<(u64, u64)>,
    /// Control-plane bytes over every link, all tiers.
    pub control_bytes: u64,
    /// Requests that paid a round trip, as (round trip in ms, requests).
    pub round_trips: Vec<(f64, u64)>,
    /// Per criticality tier (`Criticality::ALL` order): offered and admitted within the
    /// measured window, over the fleet; `None` for the central counter, whose store decides
    /// requests after they left the host.
    pub measured_tiers: Option<[(u64, u64); TIERS]>,
    /// What a controller's failover took, when the scenario kills one (and the algorithm has a
    /// control plane).
    pub failover: Option<FailoverTrace>,
    /// A token budget's figures, when the scenario's bucket is one.
    pub tokens: Option<TokenTrace>,
}

/// When a controller's failover happened, in seconds since the start of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FailoverTrace {
    /// The leader died.
    pub killed_s: f64,
    /// The standby took the lease, at epoch `epoch`.
    pub led_s: f64,
    pub epoch: u64,
    /// It sent its first instructions to a zone.
    pub instructed_s: Option<f64>,
    /// Its first instructions reached an aggregator.
    pub reached_zone_s: Option<f64>,
}

enum Limiter {
    Drop(DropRatio),
    // Boxed: the ring of slots is large, and most runs hold the other variants.
    Adaptive(Box<AdaptiveTokenBucket>),
    Central,
}

struct Host {
    zone: usize,
    region: usize,
    /// The part of its requests that is `sheddable` (the rest is `critical`).
    sheddable: f64,
    limiter: Limiter,
    /// The bucket's counters since the start, as the client's striped counters total them.
    totals: Snapshot,
    /// Its control loop (none for the central counter, which has no control plane).
    core: HostCore,
    rtt_ms: f64,
    delay_ticks: usize,
}

/// What every tick reads of every host, apart from the hosts themselves: at 100,000 hosts a
/// tick that walked each host's whole state (its core's tables, its limiter) spent its time on
/// cache misses, where most hosts have no arrival in a tick and nothing due.
struct Lanes {
    alive: Vec<bool>,
    /// Part of the fleet's load.
    weight: Vec<f64>,
    /// The sum of the live hosts' weights, when it is known.
    weights: Option<f64>,
    /// Each live host's arrivals per tick at the fleet's load `arrivals_at` (without the burst),
    /// `None` where it offers nothing.
    arrivals: Vec<Option<Poisson<f64>>>,
    arrivals_at: Option<(f64, f64)>,
    /// When each host's core next has a report or tail due, in ms (its `deadline`).
    due_ms: Vec<u64>,
    /// When each host's core next has a share to expire, or `Nanos::MAX`.
    expires: Vec<Nanos>,
    /// The last surge guard tick each host's core ran. A host whose next tick is quiet
    /// (`HostCore::guard_quiet`) falls behind and runs the ticks it missed, at their own
    /// instants, just before its next arrivals or instructions ([`Engine::guard_catch_up`]).
    guarded: Vec<Nanos>,
    /// Whether each host's next surge guard tick is quiet (`HostCore::guard_quiet` with its
    /// totals), as of the last call into its core or change of its totals: the 50 ms walk over
    /// the fleet reads it here instead of in each host's guard, a cache miss or three per host
    /// at 100,000 hosts. Unused with a token budget, whose answers change the totals elsewhere.
    quiet: Vec<bool>,
}

impl Lanes {
    /// Host `i` is gone: it draws no more arrivals and the live hosts take its load.
    fn leave(&mut self, i: usize) {
        self.alive[i] = false;
        self.weights = None;
        self.arrivals_at = None;
    }

    /// The sum of the live hosts' weights, in host order.
    fn weights(&mut self) -> f64 {
        *self.weights.get_or_insert_with(|| {
            self.alive
                .iter()
                .zip(&self.weight)
                .filter(|(alive, _)| **alive)
                .map(|(_, w)| w)
                .sum()
        })
    }

    /// Host `i`'s arrivals per tick when the fleet offers `total` requests per second (plus
    /// `extra` of its own).
    fn arrivals(weight: f64, weights: f64, total: f64, extra: f64) -> Option<Poisson<f64>> {
        let rps = total * weight / weights + extra;
        let lambda = rps * (TICK_NS as f64 / 1e9);
        (lambda > 0.0).then(|| Poisson::new(lambda).ok()).flatten()
    }
}

struct Zone {
    region: usize,
    core: ZoneCore,
}

struct Region {
    core: RegionCore,
    alive: bool,
    /// Its controller is dead (its aggregators and peers lose it), while the region lives.
    leader_dead: bool,
}

/// A message on its way. Boxed or shared, so the queue moves a few words per event: a zone's
/// instructions to its hosts are one message shared by all of them.
enum Event {
    Report {
        zone: usize,
        report: Box<v1::Report>,
    },
    ZoneReport {
        zone: usize,
        report: Box<v1::ZoneReport>,
    },
    PeerSums {
        region: usize,
        sums: Arc<v1::RegionSums>,
    },
    ZoneInstructions {
        zone: usize,
        instructions: Box<v1::ZoneInstructions>,
    },
    HostInstructions {
        host: u32,
        instructions: Arc<v1::Instructions>,
    },
}

/// The rules every tier runs: one global bucket of the scenario's limit, with the surge guard as
/// the scenario says; a token budget (`cost: { response: ... }`) when the scenario has answers.
pub fn rules(scenario: &Scenario, algorithm: Algorithm) -> Result<RulesSnapshot, SimError> {
    let algorithm = match algorithm {
        Algorithm::AdaptiveTokenBucket => "adaptive-token-bucket",
        _ => "drop-ratio",
    };
    let mut yaml = format!(
        "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\n  surge_guard: {}\nservices:\n  {SERVICE}:\n    buckets:\n      - name: {BUCKET}\n        limit: {}/s\n        scope: global\n        algorithm: {algorithm}\n",
        scenario.surge_guard,
        scenario.limit_rps.round() as u64
    );
    if scenario.answers.is_some() {
        yaml.push_str("        cost: { response: json:usage.total_tokens }\n");
    }
    RulesSnapshot::parse(1, &yaml, "the simulated rules")
        .map_err(|e| SimError::Rules(e.to_string()))
}

/// One simulation run.
pub struct Engine<'a> {
    scenario: &'a Scenario,
    algorithm: Algorithm,
    network: Network,
    rules: Arc<RulesSnapshot>,
    hosts: Vec<Host>,
    lanes: Lanes,
    /// Steps of one host at a time, reused.
    steps: Vec<HostStep>,
    zones: Vec<Zone>,
    regions: Vec<Region>,
    events: Queue<Event>,
    /// Arrivals, delays and losses.
    rng: StdRng,
    /// The coin of drop-ratio decisions.
    coin: fastrand::Rng,
    store: Option<TokenBucket>,
    /// Arrivals on their way to the store, by tick of arrival there, and the hosts that have
    /// some in each slot.
    in_flight: Vec<Vec<u64>>,
    in_flight_hosts: Vec<Vec<usize>>,
    control_bytes: u64,
    failover: Option<FailoverTrace>,
    /// A token budget's answers in flight.
    flight: Option<answers::Flight>,
}

impl<'a> Engine<'a> {
    /// Builds the fleet for `scenario` with seed `seed`.
    pub fn new(
        scenario: &'a Scenario,
        algorithm: Algorithm,
        network: Network,
        seed: u64,
    ) -> Result<Self, SimError> {
        if !scenario.runs(algorithm) {
            return Err(SimError::Unsupported {
                scenario: scenario.name,
                algorithm: algorithm.name(),
            });
        }
        let rules = Arc::new(rules(scenario, algorithm)?);
        // The same seed gives the same fleet for every algorithm; each algorithm's own draws
        // come from a stream of its own.
        let mut fleet_rng = StdRng::seed_from_u64(seed);
        let rng = StdRng::seed_from_u64(seed ^ (algorithm as u64 + 1).wrapping_mul(0x9E37_79B9));
        let coin = fastrand::Rng::with_seed(seed.wrapping_add(0x5eed));
        let limit = scenario.limit_rps.round() as u64;
        let rate = Rate::per_second(limit.max(1)).map_err(|e| SimError::Rules(e.to_string()))?;
        let zones_n = scenario.zones();
        let start_ms = EPOCH_NS / 1_000_000;
        let start = HostTime {
            clock: EPOCH_NS,
            unix_ns: EPOCH_NS,
        };
        let zone_name = |z: usize| {
            format!(
                "r{}z{}",
                z / scenario.zones_per_region + 1,
                z % scenario.zones_per_region + 1
            )
        };
        let mut zones: Vec<Zone> = (0..zones_n)
            .map(|z| {
                let region = z / scenario.zones_per_region;
                let mut core = ZoneCore::new(format!("r{}", region + 1), zone_name(z), start_ms);
                // Every aggregator's stream to its controller is open from the start.
                core.upstream_opened();
                Zone { region, core }
            })
            .collect();
        let mut hosts = Vec::with_capacity(scenario.hosts);
        let mut weights = Vec::with_capacity(scenario.hosts);
        for i in 0..scenario.hosts {
            let zone = i % zones_n;
            let region = zones[zone].region;
            let normal: f64 = fleet_rng.sample(StandardNormal);
            let weight = (scenario.weight_sigma * normal).exp();
            let (same_zone, same_region, far) = network.store_rtt_ms;
            let rtt_ms = if zone == 0 {
                same_zone
            } else if region == 0 {
                same_region
            } else {
                far
            } * (1.0 + 0.2 * fleet_rng.random::<f64>());
            // The request reaches the store half a round trip after it arrived at the host.
            let delay_ticks = (rtt_ms / 2.0 * 1e6 / TICK_NS as f64).round() as usize;
            let limiter = match algorithm {
                Algorithm::DropRatio => Limiter::Drop(DropRatio::new(Duration::from_secs(1))),
                Algorithm::DropRatioCoin => {
                    Limiter::Drop(DropRatio::with_coin(Duration::from_secs(1)))
                }
                Algorithm::AdaptiveTokenBucket => Limiter::Adaptive(Box::new(
                    AdaptiveTokenBucket::new(rate, DEFAULT_HISTORY_SECS)
                        .map_err(|e| SimError::Rules(e.to_string()))?,
                )),
                Algorithm::CentralCounter => Limiter::Central,
            };
            let id = host_name(i);
            // Every host's stream to its aggregator is open from the start, counting from then.
            zones[zone].core.join(&id, 0);
            let mut core = HostCore::new(
                HostId {
                    host_id: id,
                    region: format!("r{}", region + 1),
                    zone: zone_name(zone),
                },
                &rules.config,
                rules.version,
            );
            let none = [Snapshot::default()];
            core.start(start, &none);
            core.guard_tick(EPOCH_NS, &none);
            // Half the hosts send twice the fleet's sheddable share, the others the rest, so the
            // split has to come from the whole scope's load, not each host's own.
            let sheddable = if i % 2 == 0 {
                (2.0 * scenario.sheddable_share).min(1.0)
            } else {
                (2.0 * scenario.sheddable_share - 1.0).max(0.0)
            };
            weights.push(weight);
            hosts.push(Host {
                zone,
                region,
                sheddable,
                limiter,
                totals: Snapshot::default(),
                core,
                rtt_ms,
                delay_ticks,
            });
        }
        let regions = (0..scenario.regions)
            .map(|r| {
                let mut core = RegionCore::new(format!("r{}", r + 1), rules.clone(), start_ms);
                for z in (0..zones_n).filter(|z| zones[*z].region == r) {
                    core.join(z as u64, &zone_name(z));
                }
                if scenario.controller_failover.is_some() {
                    // Controllers under a lease: the first leaders hold epoch 1.
                    core.set_epoch(1);
                }
                Region {
                    core,
                    alive: true,
                    leader_dead: false,
                }
            })
            .collect();
        let store = (algorithm == Algorithm::CentralCounter)
            .then(|| TokenBucket::new(rate, Some((limit / 10).max(1))))
            .transpose()
            .map_err(|e| SimError::Rules(e.to_string()))?;
        let max_delay = hosts.iter().map(|h| h.delay_ticks).max().unwrap_or(0);
        let lanes = Lanes {
            alive: vec![true; hosts.len()],
            weight: weights,
            weights: None,
            arrivals: vec![None; hosts.len()],
            arrivals_at: None,
            due_ms: hosts
                .iter()
                .map(|h| match h.limiter {
                    Limiter::Central => u64::MAX,
                    _ => h.core.deadline(),
                })
                .collect(),
            expires: hosts
                .iter()
                .map(|h| h.core.shares_expire_at().unwrap_or(Nanos::MAX))
                .collect(),
            guarded: vec![EPOCH_NS; hosts.len()],
            quiet: hosts
                .iter()
                .map(|h| h.core.guard_quiet(&[h.totals]))
                .collect(),
        };
        Ok(Self {
            scenario,
            algorithm,
            network,
            rules,
            in_flight: vec![vec![0; hosts.len()]; max_delay + 1],
            in_flight_hosts: vec![Vec::new(); max_delay + 1],
            hosts,
            lanes,
            steps: Vec::new(),
            zones,
            regions,
            events: Queue::new(EPOCH_NS, TICK_NS),
            rng,
            coin,
            store,
            control_bytes: 0,
            failover: None,
            flight: answers::Flight::new(scenario, seed)?,
        })
    }

    /// Runs to the end, calling `progress` with the simulated seconds done every second.
    pub fn run(mut self, progress: &dyn Fn(u64)) -> Trace {
        let s = self.scenario;
        let ticks = (s.duration_s * 1e9 / TICK_NS as f64).round() as u64;
        // Every request counts in the sample in which it arrived at its host, also when a
        // central store decides it a few ticks later.
        let mut samples: Vec<FleetSample> = (0..ticks.div_ceil(TICKS_PER_SAMPLE))
            .map(|i| FleetSample {
                t_s: (i * TICKS_PER_SAMPLE * TICK_NS) as f64 / 1e9,
                ..FleetSample::default()
            })
            .collect();
        let mut measured = vec![(0u64, 0u64); self.hosts.len()];
        let mut measured_tiers = [(0u64, 0u64); TIERS];
        let mut round_trips: HashMap<usize, (f64, u64)> = HashMap::new();
        let mut lost_region = false;
        let mut host_left = false;
        let tick_s = TICK_NS as f64 / 1e9;
        for tick in 0..ticks {
            let now = EPOCH_NS + tick * TICK_NS;
            let t_s = tick as f64 * tick_s;
            if let Some((region, at)) = s.region_loss
                && !lost_region
                && t_s >= at
            {
                lost_region = true;
                self.lose_region(region);
            }
            if let Some(f) = s.controller_failover
                && self.algorithm != Algorithm::CentralCounter
            {
                if self.failover.is_none() && t_s >= f.at_s {
                    self.kill_leader(f.region, t_s);
                } else if self.regions[f.region].leader_dead && t_s >= f.at_s + f.lease_ttl_s {
                    self.take_over(f.region, now, t_s);
                }
            }
            if let Some((host, at)) = s.host_leave
                && !host_left
                && t_s >= at
            {
                host_left = true;
                self.leave(host, now);
            }
            self.deliver(now);
            if let Some(flight) = &mut self.flight {
                let alive = &self.lanes.alive;
                flight.settle(
                    s,
                    (tick, now),
                    (&mut self.hosts, &mut self.lanes.guarded, &mut self.steps),
                    alive,
                    &mut samples,
                    &mut measured,
                );
            }
            if tick > 0 && (tick * TICK_NS).is_multiple_of(surge::TICK_NS) {
                self.guard_surges(now);
            }
            self.report(now);
            self.poll(now);
            let current = (tick / TICKS_PER_SAMPLE) as usize;
            let down = s.control_down.is_some_and(|(a, b)| (a..b).contains(&t_s));
            let in_window = (s.measure.0..s.measure.1).contains(&t_s);
            let total = s.offered_rps(t_s);
            let weights = self.lanes.weights();
            if self.lanes.arrivals_at != Some((total, weights)) {
                let lanes = &mut self.lanes;
                for (i, arrivals) in lanes.arrivals.iter_mut().enumerate() {
                    *arrivals = lanes.alive[i]
                        .then(|| Lanes::arrivals(lanes.weight[i], weights, total, 0.0))
                        .flatten();
                }
                lanes.arrivals_at = Some((total, weights));
            }
            let burst = s
                .burst
                .filter(|b| self.lanes.alive[b.host] && (b.from_s..b.to_s).contains(&t_s))
                .map(|b| {
                    let w = self.lanes.weight[b.host];
                    (b.host, Lanes::arrivals(w, weights, total, b.extra_rps))
                });
            let slot = (tick as usize) % self.in_flight.len();
            #[allow(clippy::needless_range_loop)] // the loop body borrows self mutably
            for i in 0..self.hosts.len() {
                let arrivals = match burst {
                    Some((host, arrivals)) if host == i => arrivals,
                    _ => self.lanes.arrivals[i],
                };
                let n = arrivals.map_or(0, |p| p.sample(&mut self.rng) as u64);
                if n == 0 {
                    continue;
                }
                if let Limiter::Drop(_) = self.hosts[i].limiter {
                    // The guard ticks it missed come before these arrivals, as they did.
                    guard_catch_up(
                        &mut self.hosts[i],
                        &mut self.lanes.guarded[i],
                        now,
                        &mut self.steps,
                    );
                }
                // Requests per tier: all `critical` unless the host sends sheddable traffic.
                let mut by_tier = [0u64; TIERS];
                let sheddable = match self.hosts[i].sheddable {
                    0.0 => 0,
                    1.0 => n,
                    p => Binomial::new(n, p).map_or(0, |b| b.sample(&mut self.rng)),
                };
                by_tier[Criticality::Sheddable.index()] = sheddable;
                by_tier[Criticality::Critical.index()] = n - sheddable;
                let mut allowed_by_tier = by_tier;
                let allowed = match &self.hosts[i].limiter {
                    Limiter::Drop(d) => {
                        for tier in Criticality::ALL {
                            let n = by_tier[tier.index()];
                            if n == 0 {
                                continue;
                            }
                            allowed_by_tier[tier.index()] = if d.scheduled() || n <= COIN_LIMIT {
                                (0..n)
                                    .filter(|_| d.decide_with(now, tier, &mut self.coin).is_allow())
                                    .count() as u64
                            } else {
                                match d.current_for(now, tier) {
                                    Some(r) if r != Ratio::ZERO => {
                                        n - Binomial::new(n, r.as_f64())
                                            .map_or(0, |b| b.sample(&mut self.rng))
                                    }
                                    _ => n,
                                }
                            };
                        }
                        allowed_by_tier.iter().sum()
                    }
                    Limiter::Adaptive(bucket) => (0..n)
                        .take_while(|_| bucket.decide(now, 1).is_allow())
                        .count() as u64,
                    Limiter::Central => {
                        let at = (tick as usize + self.hosts[i].delay_ticks) % self.in_flight.len();
                        if self.in_flight[at][i] == 0 {
                            self.in_flight_hosts[at].push(i);
                        }
                        self.in_flight[at][i] += n;
                        let rtt = self.hosts[i].rtt_ms;
                        let entry = round_trips.entry(i).or_insert((rtt, 0));
                        entry.1 += n;
                        0
                    }
                };
                if !matches!(self.hosts[i].limiter, Limiter::Drop(_)) {
                    // Limiters without tiers admit either tier alike.
                    let shed = Criticality::Sheddable.index();
                    allowed_by_tier[shed] = allowed * by_tier[shed] / n;
                    allowed_by_tier[Criticality::Critical.index()] =
                        allowed - allowed_by_tier[shed];
                }
                if let Some(flight) = &mut self.flight {
                    let sample = &mut samples[current];
                    let measured = in_window.then_some(&mut measured[i]);
                    let host = (i, &mut self.hosts[i]);
                    flight.decided(
                        s,
                        host,
                        (tick, now),
                        &by_tier,
                        &allowed_by_tier,
                        sample,
                        measured,
                    );
                    continue;
                }
                let host = &mut self.hosts[i];
                host.totals.allowed += allowed;
                host.totals.dropped += n - allowed;
                for (t, (&n, &allowed)) in by_tier.iter().zip(&allowed_by_tier).enumerate() {
                    host.totals.tiers[t].allowed += allowed;
                    host.totals.tiers[t].dropped += n - allowed;
                    if in_window {
                        measured_tiers[t].0 += n;
                        measured_tiers[t].1 += allowed;
                    }
                }
                let sample = &mut samples[current];
                sample.offered += n;
                if !matches!(self.hosts[i].limiter, Limiter::Central) {
                    sample.admitted += allowed;
                    sample.dropped += n - allowed;
                }
                if in_window {
                    measured[i].0 += n;
                    measured[i].1 += allowed;
                }
                if let Limiter::Drop(_) = self.hosts[i].limiter {
                    // Offered more since its guard's last tick: that tick is quiet only without
                    // a guard.
                    self.lanes.quiet[i] = !self.rules.config.control.surge_guard;
                }
            }
            if let Some(store) = &self.store {
                // The store decides what reaches it this tick, callers in a fresh random order
                // (they race for the same tokens).
                let mut order = std::mem::take(&mut self.in_flight_hosts[slot]);
                order.sort_unstable();
                order.shuffle(&mut self.rng);
                for i in order {
                    let n = std::mem::take(&mut self.in_flight[slot][i]);
                    // Unreachable store: fail open, as the control plane's clients do.
                    let allowed = if down {
                        n
                    } else {
                        (0..n)
                            .take_while(|_| store.decide(now, 1).is_allow())
                            .count() as u64
                    };
                    let arrived = tick.saturating_sub(self.hosts[i].delay_ticks as u64);
                    let sample = &mut samples[(arrived / TICKS_PER_SAMPLE) as usize];
                    sample.admitted += allowed;
                    sample.dropped += n - allowed;
                    let arrived_s = arrived as f64 * tick_s;
                    if (s.measure.0..s.measure.1).contains(&arrived_s) {
                        measured[i].1 += allowed;
                    }
                }
            }
            if (tick + 1) % 100 == 0 {
                progress(1);
            }
        }
        if self.algorithm == Algorithm::CentralCounter {
            // A request to the store and its answer, as RESP: EVALSHA of the token-bucket script
            // on the bucket's key with a cost of 1, and an integer reply.
            let request = resp(&[
                "EVALSHA",
                &"0".repeat(40),
                "1",
                "rl:global:api:limited",
                "1",
            ]);
            let per_request = request + ":1\r\n".len() as u64;
            let requests: u64 = round_trips.values().map(|(_, n)| n).sum();
            self.control_bytes = requests * per_request;
        }
        let mut round_trips: Vec<(f64, u64)> = round_trips.into_values().collect();
        round_trips.sort_by(|a, b| a.0.total_cmp(&b.0));
        Trace {
            samples,
            measured,
            control_bytes: self.control_bytes,
            round_trips,
            measured_tiers: (self.algorithm != Algorithm::CentralCounter).then_some(measured_tiers),
            failover: self.failover,
            tokens: self.flight.map(|f| f.trace),
        }
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        self.events.schedule(at, event);
    }

    /// A message over a link with delay `(base, mean extra)` ms: delivered later, or lost.
    fn send(&mut self, now: Nanos, link: (f64, f64), bytes: u64, event: Event) {
        self.control_bytes += bytes + GRPC_FRAME;
        if self.rng.random::<f64>() < self.network.loss {
            return;
        }
        let extra: f64 = Exp::new(1.0 / link.1.max(1e-9)).map_or(0.0, |e| e.sample(&mut self.rng));
        let delay = ((link.0 + extra) * 1e6) as Nanos;
        self.schedule(now + delay.max(1), event);
    }

    fn control_down(&self, now: Nanos) -> bool {
        let t_s = (now - EPOCH_NS) as f64 / 1e9;
        self.scenario
            .control_down
            .is_some_and(|(a, b)| (a..b).contains(&t_s))
    }

    /// A tick of every live drop-ratio host's surge guard (every 50 ms), as the link's
    /// housekeeping runs it.
    /// A host whose guard engaged says so at once: its surge report goes to its aggregator.
    ///
    /// Only hosts whose tick may engage their guard tick now. A host whose tick is quiet
    /// (`HostCore::guard_quiet`: nothing offered over the guard's window, so it cannot engage)
    /// falls behind, and stays behind without being looked at until its next arrivals or
    /// instructions, which first run the ticks it missed ([`guard_catch_up`]). At 100,000 hosts
    /// most hosts see a request every few seconds: their ticks run a second's worth at a time,
    /// with their state in the cache, where a walk over every host's guard every 50 ms missed
    /// the cache for each of them. What every host's limiter and guard hold when they are next
    /// read, and every surge report and its order, are what ticking every host gave.
    fn guard_surges(&mut self, now: Nanos) {
        if !matches!(
            self.algorithm,
            Algorithm::DropRatio | Algorithm::DropRatioCoin
        ) {
            return;
        }
        let mut reports = Vec::new();
        let steps = &mut self.steps;
        let lanes = &mut self.lanes;
        // A token budget's answers change the totals outside the engine's sight.
        let cached = self.flight.is_none();
        for (i, host) in self.hosts.iter_mut().enumerate() {
            // Behind already: quiet since, as no arrival caught it up.
            if !lanes.alive[i] || lanes.guarded[i] + surge::TICK_NS < now {
                continue;
            }
            let quiet = if cached {
                lanes.quiet[i]
            } else {
                host.core.guard_quiet(&[host.totals])
            };
            if quiet {
                continue;
            }
            steps.clear();
            host.core.guard_tick_into(now, &[host.totals], steps);
            lanes.guarded[i] = now;
            apply(host, now, steps);
            if let Some(report) = host.core.take_surge_report() {
                reports.push((host.zone, report));
            }
            lanes.due_ms[i] = host.core.deadline();
            lanes.quiet[i] = host.core.guard_quiet(&[host.totals]);
        }
        for (zone, report) in reports {
            self.send_report(now, zone, report);
        }
    }

    /// A host's report (or surge report) to the aggregator of `zone`.
    fn send_report(&mut self, now: Nanos, zone: usize, report: v1::Report) {
        let bytes = report.encoded_len() as u64;
        self.send(
            now,
            self.network.host_aggregator_ms,
            bytes,
            Event::Report {
                zone,
                report: Box::new(report),
            },
        );
    }

    /// Every live host whose tail or report is due: the report goes to its aggregator.
    fn report(&mut self, now: Nanos) {
        if self.algorithm == Algorithm::CentralCounter {
            return;
        }
        let at = HostTime {
            clock: now,
            unix_ns: now,
        };
        for i in 0..self.hosts.len() {
            if !self.lanes.alive[i] || now / 1_000_000 < self.lanes.due_ms[i] {
                continue;
            }
            let host = &mut self.hosts[i];
            let report = host.core.on_deadline(at, &[host.totals]);
            self.lanes.due_ms[i] = host.core.deadline();
            let Some(report) = report else {
                continue;
            };
            let zone = host.zone;
            self.send_report(now, zone, report);
        }
    }

    /// The aggregators' and controllers' tickers, and the expiry of adaptive shares.
    fn poll(&mut self, now: Nanos) {
        if self.algorithm == Algorithm::CentralCounter {
            return;
        }
        let now_ms = now / 1_000_000;
        for z in 0..self.zones.len() {
            if self.regions[self.zones[z].region].alive {
                let steps = self.zones[z].core.poll(now_ms);
                self.zone_steps(z, now, steps);
            }
        }
        for r in 0..self.regions.len() {
            if self.regions[r].alive && !self.regions[r].leader_dead {
                let steps = self.regions[r].core.poll(now_ms);
                self.region_steps(r, now, steps);
            }
        }
        for (i, host) in self.hosts.iter_mut().enumerate() {
            if self.lanes.alive[i] && now >= self.lanes.expires[i] {
                let steps = host.core.expire_shares(now);
                apply(host, now, &steps);
                self.lanes.expires[i] = host.core.shares_expire_at().unwrap_or(Nanos::MAX);
            }
        }
    }

    fn deliver(&mut self, now: Nanos) {
        self.events.start_tick(now);
        while let Some((at, event)) = self.events.next() {
            self.handle(at, event);
        }
    }

    fn handle(&mut self, now: Nanos, event: Event) {
        let now_ms = now / 1_000_000;
        match event {
            Event::Report { zone, report } => {
                if !self.regions[self.zones[zone].region].alive {
                    return;
                }
                let steps = self.zones[zone].core.on_report(now_ms, 0, *report);
                self.zone_steps(zone, now, steps);
            }
            Event::ZoneReport { zone, report } => {
                let r = self.zones[zone].region;
                if !self.regions[r].alive || self.regions[r].leader_dead || self.control_down(now) {
                    return;
                }
                let steps = self.regions[r]
                    .core
                    .on_zone_report(zone as u64, *report, now_ms);
                self.region_steps(r, now, steps);
            }
            Event::PeerSums { region, sums } => {
                if !self.regions[region].alive
                    || self.regions[region].leader_dead
                    || self.control_down(now)
                {
                    return;
                }
                let sums = Arc::unwrap_or_clone(sums);
                let steps = self.regions[region].core.on_peer_sums(sums, now_ms);
                self.region_steps(region, now, steps);
            }
            Event::ZoneInstructions { zone, instructions } => {
                if !self.regions[self.zones[zone].region].alive || self.control_down(now) {
                    return;
                }
                if let Some(f) = &mut self.failover
                    && f.reached_zone_s.is_none()
                    && instructions
                        .instructions
                        .as_ref()
                        .is_some_and(|i| i.epoch == f.epoch)
                {
                    f.reached_zone_s = Some((now - EPOCH_NS) as f64 / 1e9);
                }
                let mut sends = Vec::new();
                self.zones[zone].core.on_instructions_with(
                    now_ms,
                    *instructions,
                    |host, message| {
                        if let Some(host) = host_index(host) {
                            sends.push((host, message));
                        }
                    },
                );
                self.relay(now, sends);
            }
            Event::HostInstructions {
                host: i,
                instructions,
            } => {
                let i = i as usize;
                let host = &mut self.hosts[i];
                if !self.lanes.alive[i] {
                    return;
                }
                let at = HostTime {
                    clock: now,
                    unix_ns: now,
                };
                let steps = &mut self.steps;
                if let Limiter::Drop(_) = host.limiter {
                    // The guard ticks before the instructions' instant: those at it come after.
                    guard_catch_up(host, &mut self.lanes.guarded[i], now - 1, steps);
                }
                steps.clear();
                host.core.on_shared_instructions(at, &instructions, steps);
                if let Some(HostStep::Rules { version, .. }) = steps.first() {
                    // The simulated hosts run the simulated rules, whatever their version.
                    *steps = host.core.rules_applied(at, *version, &self.rules.config);
                }
                apply(host, now, steps);
                if !matches!(host.limiter, Limiter::Central) {
                    self.lanes.due_ms[i] = host.core.deadline();
                }
                self.lanes.quiet[i] = host.core.guard_quiet(&[host.totals]);
                self.lanes.expires[i] = host.core.shares_expire_at().unwrap_or(Nanos::MAX);
            }
        }
    }

    /// Sends what aggregator `z` asks for.
    fn zone_steps(&mut self, z: usize, now: Nanos, steps: Vec<ZoneStep>) {
        for step in steps {
            match step {
                ZoneStep::Forward(report) => {
                    let bytes = report.encoded_len() as u64;
                    self.send(
                        now,
                        self.network.aggregator_controller_ms,
                        bytes,
                        Event::ZoneReport {
                            zone: z,
                            report: Box::new(report),
                        },
                    );
                }
                ZoneStep::Send { host, instructions } => {
                    if let Some(host) = host_index(&host) {
                        self.relay(now, vec![(host, Arc::new(instructions))]);
                    }
                }
            }
        }
    }

    /// Sends each host its instructions, in order; hosts that share a message share its size.
    fn relay(&mut self, now: Nanos, sends: Vec<(u32, Arc<v1::Instructions>)>) {
        let mut sized: Option<(*const v1::Instructions, u64)> = None;
        for (host, instructions) in sends {
            let bytes = match sized {
                Some((at, bytes)) if std::ptr::eq(at, Arc::as_ptr(&instructions)) => bytes,
                _ => {
                    let bytes = instructions.encoded_len() as u64;
                    sized = Some((Arc::as_ptr(&instructions), bytes));
                    bytes
                }
            };
            self.send(
                now,
                self.network.host_aggregator_ms,
                bytes,
                Event::HostInstructions { host, instructions },
            );
        }
    }

    /// Sends what the controller of region `r` asks for.
    fn region_steps(&mut self, r: usize, now: Nanos, steps: Vec<RegionStep>) {
        for step in steps {
            match step {
                RegionStep::Announce(sums) => {
                    let bytes = sums.encoded_len() as u64;
                    let sums = Arc::new(sums);
                    for peer in 0..self.regions.len() {
                        if peer != r && self.regions[peer].alive {
                            self.send(
                                now,
                                self.network.peer_ms,
                                bytes,
                                Event::PeerSums {
                                    region: peer,
                                    sums: sums.clone(),
                                },
                            );
                        }
                    }
                }
                // The simulator's controllers never share their instructions; should one, each
                // zone's go as a whole message.
                RegionStep::SendShared {
                    member,
                    instructions,
                } => {
                    let whole = RegionStep::Send {
                        member,
                        instructions: instructions.to_message(),
                    };
                    self.region_steps(r, now, vec![whole]);
                }
                RegionStep::Send {
                    member,
                    instructions,
                } => {
                    if let Some(f) = &mut self.failover
                        && f.instructed_s.is_none()
                        && instructions
                            .instructions
                            .as_ref()
                            .is_some_and(|i| i.epoch == f.epoch)
                    {
                        f.instructed_s = Some((now - EPOCH_NS) as f64 / 1e9);
                    }
                    let bytes = instructions.encoded_len() as u64;
                    self.send(
                        now,
                        self.network.aggregator_controller_ms,
                        bytes,
                        Event::ZoneInstructions {
                            zone: member as usize,
                            instructions: Box::new(instructions),
                        },
                    );
                }
            }
        }
    }

    /// Host `i` leaves as a stopping sidecar does: its last report (what it counted of the
    /// interval so far), then the end of its stream, both at once and in that order; its load
    /// moves to the live hosts.
    fn leave(&mut self, i: usize, now: Nanos) {
        let Some(host) = self.hosts.get_mut(i) else {
            return;
        };
        self.lanes.leave(i);
        let zone = host.zone;
        let now_ms = now / 1_000_000;
        let mut steps = Vec::new();
        if self.algorithm != Algorithm::CentralCounter {
            let at = HostTime {
                clock: now,
                unix_ns: now,
            };
            let last = host.core.flush(at, &[host.totals]);
            steps = self.zones[zone].core.on_report(now_ms, 0, last);
        }
        steps.extend(
            self.zones[zone]
                .core
                .on_stream_end(now_ms, &host_name(i), 0),
        );
        self.zone_steps(zone, now, steps);
    }

    /// The leading controller of region `r` dies: its aggregators' streams to it break, and its
    /// peers hear no more from it.
    fn kill_leader(&mut self, r: usize, t_s: f64) {
        self.regions[r].leader_dead = true;
        for zone in self.zones.iter_mut().filter(|z| z.region == r) {
            zone.core.upstream_closed();
        }
        self.failover = Some(FailoverTrace {
            killed_s: t_s,
            epoch: self.regions[r].core.epoch() + 1,
            ..FailoverTrace::default()
        });
    }

    /// The standby of region `r` takes the lease at the next epoch: a controller that knows
    /// nothing of the intervals before, to which the aggregators' streams open now.
    fn take_over(&mut self, r: usize, now: Nanos, t_s: f64) {
        let Some(failover) = &mut self.failover else {
            return;
        };
        failover.led_s = t_s;
        let now_ms = now / 1_000_000;
        let mut core = RegionCore::new(format!("r{}", r + 1), self.rules.clone(), now_ms);
        core.set_epoch(failover.epoch);
        for (z, zone) in self.zones.iter_mut().enumerate() {
            if zone.region == r {
                core.join(z as u64, zone.core.zone());
                zone.core.upstream_opened();
            }
        }
        self.regions[r].core = core;
        self.regions[r].leader_dead = false;
    }

    /// Region `r` is gone: its hosts stop, its aggregators and controller fall silent, and the
    /// load they carried moves to the other regions (the weights of the live hosts).
    fn lose_region(&mut self, r: usize) {
        self.regions[r].alive = false;
        for (i, host) in self.hosts.iter().enumerate() {
            if host.region == r {
                self.lanes.leave(i);
            }
        }
    }
}

/// The name of host `i`, as its aggregator knows it.
fn host_name(i: usize) -> String {
    format!("host-{i:05}")
}

/// The host of a name from [`host_name`]: its digits, read by hand (at 100,000 hosts a zone's
/// every instruction names 11,000 of them, and `str::parse` took a fiftieth of the run).
fn host_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("host-")?.as_bytes();
    if digits.is_empty() || digits.len() > 9 {
        return None;
    }
    digits.iter().try_fold(0u32, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
    })
}

/// Runs the surge guard ticks a quiet host missed after `guarded`, up to `upto`, each at its
/// own instant with the totals it had then (unchanged: it had no arrivals since), and applies
/// their steps to its limiter: what ticking it every 50 ms would have left.
///
/// Only the last tick's steps reach the limiter: a tick's only steps are its guard's ratios
/// (`HostStep::Surge`), each of which replaces the one before whole, and nothing reads the
/// limiter between the ticks. The ticks run in one call (`HostCore::guard_quiet_ticks_into`),
/// which leaves what as many calls of `guard_tick_into` leave: one tick at a time, a fifth of a
/// drop-ratio run at 100,000 hosts went to catching up, most of it passes over each guard's
/// window.
fn guard_catch_up(host: &mut Host, guarded: &mut Nanos, upto: Nanos, steps: &mut Vec<HostStep>) {
    if *guarded + surge::TICK_NS > upto {
        return;
    }
    // The ticks it missed, all quiet, in one call.
    let missed = (upto - *guarded) / surge::TICK_NS;
    debug_assert!(
        host.core.guard_quiet(&[host.totals]),
        "a host fell behind on a tick that was not quiet"
    );
    steps.clear();
    host.core
        .guard_quiet_ticks_into(*guarded + surge::TICK_NS, missed, &[host.totals], steps);
    *guarded += missed * surge::TICK_NS;
    debug_assert!(
        steps.iter().all(|s| matches!(s, HostStep::Surge { .. })),
        "a guard tick steps only its ratio"
    );
    debug_assert!(
        host.core.take_surge_report().is_none(),
        "a quiet guard tick engaged"
    );
    apply(host, *guarded, steps);
}

/// Applies a host core's steps to the host's limiter at `now`, as a client's link does.
fn apply(host: &mut Host, now: Nanos, steps: &[HostStep]) {
    let limiter = match &host.limiter {
        Limiter::Drop(d) => SteeredLimiter::DropRatio(d),
        Limiter::Adaptive(bucket) => SteeredLimiter::Adaptive(bucket),
        Limiter::Central => return,
    };
    for step in steps {
        step.apply_to(limiter, now);
    }
}

/// Bytes of a RESP array of bulk strings.
fn resp(parts: &[&str]) -> u64 {
    let header = format!("*{}\r\n", parts.len()).len();
    let body: usize = parts
        .iter()
        .map(|p| format!("${}\r\n", p.len()).len() + p.len() + 2)
        .sum();
    (header + body) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_counts_every_byte() {
        // *1\r\n$4\r\nPING\r\n
        assert_eq!(resp(&["PING"]), 14);
    }

    #[test]
    fn rules_hold_one_global_bucket_of_the_limit() {
        let s = Scenario::named("overload-1.5x", None).unwrap();
        let rules = rules(&s, Algorithm::AdaptiveTokenBucket).unwrap();
        let (_, bucket) = rules.config.buckets().next().unwrap();
        assert_eq!(bucket.limit.per_second(), 10_000.0);
    }
}
