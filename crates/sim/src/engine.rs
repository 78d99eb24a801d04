//! The discrete-event engine: hosts, aggregators and controllers in simulated time.
//!
//! Time moves in 10 ms ticks. In each tick every live host draws its arrivals (Poisson) and
//! decides them with the core's limiter; messages between tiers are events at their exact
//! delivery instant, with a random delay and a chance of loss. What each tier computes is the
//! real code: hosts decide with `spillway_core::algo::{DropRatio, AdaptiveTokenBucket}` and
//! tally their reports (with the interval's tail) with `spillway_control::link::Tally`,
//! aggregators close intervals with `spillway_control::sums::Intervals` and split shares with
//! `spillway_control::aggregator::host_shares`, controllers run
//! `spillway_control::controller::RegionCore` (the same state machine the gRPC server drives),
//! and the central counter is the core's `TokenBucket`.
//!
//! How a tick's requests are decided (the only shortcut, and why it changes nothing):
//! - drop-ratio: up to 32 arrivals, one `DropRatio::decide_with` call per request with the
//!   simulation's seeded coin; above that, one binomial draw with the ratio `DropRatio::current`
//!   returns. Each request is an independent coin against the same ratio, so the number dropped
//!   is exactly Binomial(n, ratio).
//! - adaptive token bucket and central counter: one `decide(now, 1)` per request until the first
//!   denial. Time does not move within a tick and a denial leaves the state unchanged, so every
//!   later request of the same instant would be denied too: the calls are skipped, not guessed.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use prost::Message;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_distr::{Binomial, Distribution, Exp, Poisson, StandardNormal};
use spillway_control::aggregator::host_shares;
use spillway_control::controller::{RegionCore, Step};
use spillway_control::link::{BucketReport, Tally};
use spillway_control::sums::{Intervals, Sums};
use spillway_control::timing::Interval;
use spillway_core::algo::{
    AdaptiveTokenBucket, DEFAULT_HISTORY_SECS, DropRatio, Rate, Ratio, TokenBucket,
};
use spillway_core::clock::{NANOS_PER_SEC, Nanos};
use spillway_core::config::{self, Config};
use spillway_core::surge::{self, Instructed, SurgeGuard};
use spillway_proto::v1;

use crate::scenario::Scenario;
use crate::{Algorithm, SimError};

/// One tick of simulated time.
pub const TICK_NS: Nanos = 10_000_000;
/// Ticks per sample of the time series (100 ms).
pub const TICKS_PER_SAMPLE: u64 = 10;
/// Simulated time starts here (one hour), so interval numbers are never near zero.
const EPOCH_NS: Nanos = 3_600 * NANOS_PER_SEC;
/// Per-request decisions up to this many arrivals in a tick; a binomial draw above.
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

/// The fleet's totals over one 100 ms sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
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
    pub samples: Vec<Sample>,
    /// Per host: offered and admitted within the scenario's measured window.
    pub measured: Vec<(u64, u64)>,
    /// Control-plane bytes over every link, all tiers.
    pub control_bytes: u64,
    /// Requests that paid a round trip, as (round trip in ms, requests).
    pub round_trips: Vec<(f64, u64)>,
}

enum Limiter {
    Drop(DropRatio),
    Adaptive {
        // Boxed: the ring of slots is large, and most runs hold the other variants.
        bucket: Box<AdaptiveTokenBucket>,
        expires_at: Nanos,
    },
    Central,
}

struct Host {
    id: String,
    zone: usize,
    region: usize,
    /// Part of the fleet's load.
    weight: f64,
    alive: bool,
    limiter: Limiter,
    /// Counts since the last report or tail mark.
    offered: u64,
    allowed: u64,
    /// The report interval in progress, as the link keeps it: before and within its tail.
    tally: Tally,
    rtt_ms: f64,
    delay_ticks: usize,
    /// The drop-ratio surge guard and what it was offered since its last tick.
    guard: SurgeGuard,
    guard_offered: u64,
}

struct Zone {
    name: String,
    region: usize,
    hosts: Vec<u32>,
    /// Hosts with an open stream: the aggregator waits for their reports.
    members: Vec<u32>,
    window: Intervals<u32, Sums>,
    last_sums: Sums,
    host_last: HashMap<u32, Sums>,
}

struct Region {
    core: RegionCore,
    zones: Vec<usize>,
    members: Vec<u64>,
    zone_names: Vec<String>,
    alive: bool,
}

enum Event {
    Report {
        host: u32,
        sequence: u64,
        sums: Sums,
    },
    ZoneReport {
        zone: usize,
        sequence: u64,
        buckets: Vec<v1::BucketCounts>,
    },
    PeerSums {
        region: usize,
        sums: v1::RegionSums,
    },
    ZoneInstructions {
        zone: usize,
        instructions: v1::Instructions,
    },
    HostInstructions {
        host: u32,
        buckets: Vec<v1::BucketInstruction>,
        ttl_ms: u64,
        /// The end of the interval the instructions came from, in milliseconds.
        ended_ms: u64,
    },
}

struct Scheduled {
    at: Nanos,
    order: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        // Reversed: the heap pops the earliest first, ties in scheduling order.
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// The rules every controller runs: one global bucket of the scenario's limit.
pub fn rules(scenario: &Scenario, algorithm: Algorithm) -> Result<Config, SimError> {
    let algorithm = match algorithm {
        Algorithm::AdaptiveTokenBucket => "adaptive-token-bucket",
        _ => "drop-ratio",
    };
    let yaml = format!(
        "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\nservices:\n  {SERVICE}:\n    buckets:\n      - name: {BUCKET}\n        limit: {}/s\n        scope: global\n        algorithm: {algorithm}\n",
        scenario.limit_rps.round() as u64
    );
    config::load_str(&yaml, "the simulated rules").map_err(|e| SimError::Rules(e.to_string()))
}

/// One simulation run.
pub struct Engine<'a> {
    scenario: &'a Scenario,
    algorithm: Algorithm,
    network: Network,
    config: Config,
    interval: Interval,
    ttl_ms: u64,
    hosts: Vec<Host>,
    zones: Vec<Zone>,
    regions: Vec<Region>,
    events: BinaryHeap<Scheduled>,
    order: u64,
    /// Arrivals, delays and losses.
    rng: StdRng,
    /// The coin of drop-ratio decisions.
    coin: fastrand::Rng,
    store: Option<TokenBucket>,
    /// Arrivals on their way to the store, by tick of arrival there.
    in_flight: Vec<Vec<u64>>,
    control_bytes: u64,
}

impl<'a> Engine<'a> {
    /// Builds the fleet for `scenario` with seed `seed`.
    pub fn new(
        scenario: &'a Scenario,
        algorithm: Algorithm,
        network: Network,
        seed: u64,
    ) -> Result<Self, SimError> {
        let config = rules(scenario, algorithm)?;
        let interval = Interval::new(config.control.report_interval);
        let ttl_ms = u64::try_from(config.control.instruction_ttl.as_millis()).unwrap_or(u64::MAX);
        // The same seed gives the same fleet for every algorithm; each algorithm's own draws
        // come from a stream of its own.
        let mut fleet_rng = StdRng::seed_from_u64(seed);
        let rng = StdRng::seed_from_u64(seed ^ (algorithm as u64 + 1).wrapping_mul(0x9E37_79B9));
        let coin = fastrand::Rng::with_seed(seed.wrapping_add(0x5eed));
        let limit = scenario.limit_rps.round() as u64;
        let rate = Rate::per_second(limit.max(1)).map_err(|e| SimError::Rules(e.to_string()))?;
        let zones_n = scenario.zones();
        let closed = interval.sequence_at(EPOCH_NS / 1_000_000).saturating_sub(1);
        let mut zones: Vec<Zone> = (0..zones_n)
            .map(|z| Zone {
                name: format!(
                    "r{}z{}",
                    z / scenario.zones_per_region + 1,
                    z % scenario.zones_per_region + 1
                ),
                region: z / scenario.zones_per_region,
                hosts: Vec::new(),
                members: Vec::new(),
                window: Intervals::new(closed),
                last_sums: Sums::default(),
                host_last: HashMap::new(),
            })
            .collect();
        let mut hosts = Vec::with_capacity(scenario.hosts);
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
                Algorithm::AdaptiveTokenBucket => Limiter::Adaptive {
                    bucket: Box::new(
                        AdaptiveTokenBucket::new(rate, DEFAULT_HISTORY_SECS)
                            .map_err(|e| SimError::Rules(e.to_string()))?,
                    ),
                    expires_at: 0,
                },
                Algorithm::CentralCounter => Limiter::Central,
            };
            zones[zone].hosts.push(i as u32);
            zones[zone].members.push(i as u32);
            hosts.push(Host {
                id: format!("host-{i:05}"),
                zone,
                region,
                weight,
                alive: true,
                limiter,
                offered: 0,
                allowed: 0,
                tally: Tally::new(EPOCH_NS / 1_000_000),
                rtt_ms,
                delay_ticks,
                guard: SurgeGuard::new(),
                guard_offered: 0,
            });
        }
        let regions = (0..scenario.regions)
            .map(|r| {
                let zone_ids: Vec<usize> = (0..zones_n).filter(|z| zones[*z].region == r).collect();
                Region {
                    core: RegionCore::new(format!("r{}", r + 1), closed),
                    members: zone_ids.iter().map(|z| *z as u64).collect(),
                    zone_names: zone_ids.iter().map(|z| zones[*z].name.clone()).collect(),
                    zones: zone_ids,
                    alive: true,
                }
            })
            .collect();
        let store = (algorithm == Algorithm::CentralCounter)
            .then(|| TokenBucket::new(rate, Some((limit / 10).max(1))))
            .transpose()
            .map_err(|e| SimError::Rules(e.to_string()))?;
        let max_delay = hosts.iter().map(|h| h.delay_ticks).max().unwrap_or(0);
        Ok(Self {
            scenario,
            algorithm,
            network,
            config,
            interval,
            ttl_ms,
            in_flight: vec![vec![0; hosts.len()]; max_delay + 1],
            hosts,
            zones,
            regions,
            events: BinaryHeap::new(),
            order: 0,
            rng,
            coin,
            store,
            control_bytes: 0,
        })
    }

    /// Runs to the end, calling `progress` with the simulated seconds done every second.
    pub fn run(mut self, progress: &dyn Fn(u64)) -> Trace {
        let s = self.scenario;
        let ticks = (s.duration_s * 1e9 / TICK_NS as f64).round() as u64;
        // Every request counts in the sample in which it arrived at its host, also when a
        // central store decides it a few ticks later.
        let mut samples: Vec<Sample> = (0..ticks.div_ceil(TICKS_PER_SAMPLE))
            .map(|i| Sample {
                t_s: (i * TICKS_PER_SAMPLE * TICK_NS) as f64 / 1e9,
                ..Sample::default()
            })
            .collect();
        let mut measured = vec![(0u64, 0u64); self.hosts.len()];
        let mut round_trips: HashMap<usize, (f64, u64)> = HashMap::new();
        let mut lost_region = false;
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
            self.deliver(now);
            if tick > 0 && (tick * TICK_NS).is_multiple_of(surge::TICK_NS) {
                self.guard_surges(now);
            }
            let now_ms = now / 1_000_000;
            if now_ms.is_multiple_of(self.interval.ms()) {
                self.report(now);
            } else if now_ms == Tally::tail_start(self.interval, self.interval.sequence_at(now_ms))
            {
                self.mark_tails(now);
            }
            if tick % TICKS_PER_SAMPLE == 0 {
                self.poll(now);
            }
            let current = (tick / TICKS_PER_SAMPLE) as usize;
            let down = s.control_down.is_some_and(|(a, b)| (a..b).contains(&t_s));
            let in_window = (s.measure.0..s.measure.1).contains(&t_s);
            let total = s.offered_rps(t_s);
            let weights: f64 = self
                .hosts
                .iter()
                .filter(|h| h.alive)
                .map(|h| h.weight)
                .sum();
            let slot = (tick as usize) % self.in_flight.len();
            #[allow(clippy::needless_range_loop)] // the loop body borrows self mutably
            for i in 0..self.hosts.len() {
                let host = &self.hosts[i];
                if !host.alive {
                    continue;
                }
                let mut rps = total * host.weight / weights;
                if let Some(b) = s.burst
                    && b.host == i
                    && (b.from_s..b.to_s).contains(&t_s)
                {
                    rps += b.extra_rps;
                }
                let lambda = rps * tick_s;
                let n = if lambda > 0.0 {
                    Poisson::new(lambda).map_or(0, |p| p.sample(&mut self.rng) as u64)
                } else {
                    0
                };
                if n == 0 {
                    continue;
                }
                let allowed = match &self.hosts[i].limiter {
                    Limiter::Drop(d) => {
                        if n <= COIN_LIMIT {
                            (0..n)
                                .filter(|_| d.decide_with(now, &mut self.coin).is_allow())
                                .count() as u64
                        } else {
                            match d.current(now) {
                                Some(r) if r != Ratio::ZERO => {
                                    n - Binomial::new(n, r.as_f64())
                                        .map_or(0, |b| b.sample(&mut self.rng))
                                }
                                _ => n,
                            }
                        }
                    }
                    Limiter::Adaptive { bucket, .. } => (0..n)
                        .take_while(|_| bucket.decide(now, 1).is_allow())
                        .count() as u64,
                    Limiter::Central => {
                        let at = (tick as usize + self.hosts[i].delay_ticks) % self.in_flight.len();
                        self.in_flight[at][i] += n;
                        let rtt = self.hosts[i].rtt_ms;
                        let entry = round_trips.entry(i).or_insert((rtt, 0));
                        entry.1 += n;
                        0
                    }
                };
                let host = &mut self.hosts[i];
                host.offered += n;
                host.guard_offered += n;
                host.allowed += allowed;
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
            }
            if let Some(store) = &self.store {
                // The store decides what reaches it this tick, callers in a fresh random order
                // (they race for the same tokens).
                let mut order: Vec<usize> = (0..self.hosts.len())
                    .filter(|i| self.in_flight[slot][*i] > 0)
                    .collect();
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
                    self.hosts[i].allowed += allowed;
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
        }
    }

    fn schedule(&mut self, at: Nanos, event: Event) {
        self.order += 1;
        self.events.push(Scheduled {
            at,
            order: self.order,
            event,
        });
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

    /// Every live host's counts since the last call, as its link's report source returns them.
    fn counted(host: &mut Host) -> Vec<BucketReport> {
        vec![BucketReport {
            service: SERVICE.to_owned(),
            bucket: BUCKET.to_owned(),
            offered: std::mem::take(&mut host.offered),
            allowed: std::mem::take(&mut host.allowed),
            shadow_dropped: 0,
        }]
    }

    /// A tick of every live drop-ratio host's surge guard (every 50 ms), as the client's
    /// housekeeping runs it.
    fn guard_surges(&mut self, now: Nanos) {
        if !self.scenario.surge_guard {
            return;
        }
        for host in self.hosts.iter_mut().filter(|h| h.alive) {
            let offered = std::mem::take(&mut host.guard_offered);
            if let Limiter::Drop(d) = &host.limiter {
                let ratio = host.guard.tick(offered, now);
                d.set_surge(ratio, now + 2 * surge::TICK_NS);
            }
        }
    }

    /// The last quarter of the interval starts: every live host marks its tail.
    fn mark_tails(&mut self, now: Nanos) {
        if self.algorithm == Algorithm::CentralCounter {
            return;
        }
        for host in self.hosts.iter_mut().filter(|h| h.alive) {
            let counted = Self::counted(host);
            host.tally.mark_tail(counted, now / 1_000_000);
        }
    }

    /// Every live host reports the interval that just ended.
    fn report(&mut self, now: Nanos) {
        if self.algorithm == Algorithm::CentralCounter {
            return;
        }
        let sequence = self.interval.sequence_at(now / 1_000_000).saturating_sub(1);
        for i in 0..self.hosts.len() {
            let host = &mut self.hosts[i];
            if !host.alive {
                continue;
            }
            let counted = Self::counted(host);
            let buckets = host.tally.close(counted, now / 1_000_000, self.interval);
            let sums = Sums::from_wire(&buckets);
            let wire = v1::Report {
                host_id: host.id.clone(),
                zone: self.zones[host.zone].name.clone(),
                region: format!("r{}", host.region + 1),
                rules_version: 1,
                sequence,
                interval_ms: self.interval.ms(),
                buckets,
            };
            let bytes = wire.encoded_len() as u64;
            self.send(
                now,
                self.network.host_aggregator_ms,
                bytes,
                Event::Report {
                    host: i as u32,
                    sequence,
                    sums,
                },
            );
        }
    }

    /// The aggregators' and controllers' tickers, and fail-open of adaptive shares.
    fn poll(&mut self, now: Nanos) {
        if self.algorithm == Algorithm::CentralCounter {
            return;
        }
        for z in 0..self.zones.len() {
            self.close_zone(z, now);
        }
        for r in 0..self.regions.len() {
            self.poll_region(r, now);
        }
        for host in &mut self.hosts {
            if let Limiter::Adaptive { bucket, expires_at } = &mut host.limiter
                && *expires_at != 0
                && now >= *expires_at
            {
                // Instructions expired: the share returns to the whole limit (fail-open, G9).
                bucket.set_share(now, Ratio::ONE);
                *expires_at = 0;
            }
        }
    }

    fn deliver(&mut self, now: Nanos) {
        while self.events.peek().is_some_and(|e| e.at <= now) {
            let Some(Scheduled { at, event, .. }) = self.events.pop() else {
                break;
            };
            self.handle(at, event);
        }
    }

    fn handle(&mut self, now: Nanos, event: Event) {
        match event {
            Event::Report {
                host,
                sequence,
                sums,
            } => {
                let zone = &mut self.zones[self.hosts[host as usize].zone];
                if !self.regions[zone.region].alive {
                    return;
                }
                if let Some(pending) = zone.window.accept(sequence, host) {
                    pending.add(&sums);
                }
                zone.host_last.insert(host, sums);
                let z = self.hosts[host as usize].zone;
                self.close_zone(z, now);
            }
            Event::ZoneReport {
                zone,
                sequence,
                buckets,
            } => {
                let r = self.zones[zone].region;
                if !self.regions[r].alive || self.control_down(now) {
                    return;
                }
                let name = self.zones[zone].name.clone();
                self.regions[r]
                    .core
                    .on_zone_sums(zone as u64, &name, sequence, &buckets);
                self.poll_region(r, now);
            }
            Event::PeerSums { region, sums } => {
                if !self.regions[region].alive || self.control_down(now) {
                    return;
                }
                self.regions[region]
                    .core
                    .on_peer_sums(&self.config, sums, now / 1_000_000);
                self.poll_region(region, now);
            }
            Event::ZoneInstructions { zone, instructions } => {
                if !self.regions[self.zones[zone].region].alive || self.control_down(now) {
                    return;
                }
                let members = self.zones[zone].members.clone();
                for host in members {
                    let z = &self.zones[zone];
                    let mut buckets = instructions.buckets.clone();
                    let empty = Sums::default();
                    let last = z.host_last.get(&host).unwrap_or(&empty);
                    host_shares(&mut buckets, &z.last_sums, last, z.members.len());
                    let message = v1::Instructions {
                        buckets,
                        ..instructions.clone()
                    };
                    let bytes = message.encoded_len() as u64;
                    self.send(
                        now,
                        self.network.host_aggregator_ms,
                        bytes,
                        Event::HostInstructions {
                            host,
                            buckets: message.buckets,
                            ttl_ms: message.ttl_ms,
                            ended_ms: self.interval.end_of(message.sequence),
                        },
                    );
                }
            }
            Event::HostInstructions {
                host,
                buckets,
                ttl_ms,
                ended_ms,
            } => {
                let guarded = self.scenario.surge_guard;
                let limit_rps = self.scenario.limit_rps;
                let interval_ns = self.interval.ms() * 1_000_000;
                let host = &mut self.hosts[host as usize];
                if !host.alive {
                    return;
                }
                let ttl = Duration::from_millis(ttl_ms);
                for b in buckets {
                    match &mut host.limiter {
                        Limiter::Drop(d) => {
                            d.set_for(Ratio::from_raw(b.drop_ratio), now, ttl);
                            if guarded {
                                let instructed = Instructed {
                                    ratio: Ratio::from_raw(b.drop_ratio).as_f64(),
                                    limit_rps,
                                    scope_offered_rps: b.scope_offered_rps,
                                    scope_hosts: b.scope_hosts,
                                    interval_ns,
                                    interval_ended_ago_ns: now.saturating_sub(ended_ms * 1_000_000),
                                    expires_at: now + ttl_ms * 1_000_000,
                                };
                                host.guard.instruct(instructed, now);
                            }
                        }
                        Limiter::Adaptive { bucket, expires_at } => {
                            if let Some(share) = b.share {
                                bucket.set_share(now, Ratio::from_raw(share));
                                *expires_at = now + ttl_ms * 1_000_000;
                            }
                        }
                        Limiter::Central => {}
                    }
                }
            }
        }
    }

    /// The aggregator of zone `z` closes what is complete or overdue and forwards it.
    fn close_zone(&mut self, z: usize, now: Nanos) {
        let zone = &mut self.zones[z];
        if !self.regions[zone.region].alive {
            return;
        }
        let grace = self.interval.grace_ms();
        let closed =
            zone.window
                .close_ready(now / 1_000_000, self.interval, grace, zone.members.iter());
        for (sequence, sums, reported) in closed {
            self.zones[z].last_sums = sums.clone();
            let wire = v1::ZoneReport {
                zone: self.zones[z].name.clone(),
                region: format!("r{}", self.zones[z].region + 1),
                sequence,
                interval_ms: self.interval.ms(),
                buckets: sums.to_wire(),
                clients: reported as u32,
                hosts: Vec::new(),
                gone: Vec::new(),
            };
            let bytes = wire.encoded_len() as u64;
            let buckets = wire.buckets;
            self.send(
                now,
                self.network.aggregator_controller_ms,
                bytes,
                Event::ZoneReport {
                    zone: z,
                    sequence,
                    buckets,
                },
            );
        }
    }

    /// The controller of region `r` moves intervals along and sends what it computed.
    fn poll_region(&mut self, r: usize, now: Nanos) {
        let region = &mut self.regions[r];
        if !region.alive {
            return;
        }
        let steps = region.core.poll(
            &self.config,
            region.members.iter(),
            region.zone_names.iter().map(String::as_str),
            now / 1_000_000,
        );
        for step in steps {
            match step {
                Step::Announce(sums) => {
                    let bytes = sums.encoded_len() as u64;
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
                Step::Instruct { sequence, per_zone } => {
                    for z in self.regions[r].zones.clone() {
                        let instructions = v1::Instructions {
                            issued_at_ms: now / 1_000_000,
                            ttl_ms: self.ttl_ms,
                            interval_ms: self.interval.ms(),
                            sequence,
                            buckets: per_zone
                                .get(&self.zones[z].name)
                                .cloned()
                                .unwrap_or_default(),
                            rules_version: 1,
                            rules: None,
                        };
                        let bytes = v1::ZoneInstructions {
                            instructions: Some(instructions.clone()),
                        }
                        .encoded_len() as u64;
                        self.send(
                            now,
                            self.network.aggregator_controller_ms,
                            bytes,
                            Event::ZoneInstructions {
                                zone: z,
                                instructions,
                            },
                        );
                    }
                }
            }
        }
    }

    /// Region `r` is gone: its hosts stop, its aggregators and controller fall silent, and the
    /// load they carried moves to the other regions (the weights of the live hosts).
    fn lose_region(&mut self, r: usize) {
        self.regions[r].alive = false;
        for host in &mut self.hosts {
            if host.region == r {
                host.alive = false;
            }
        }
        for zone in &mut self.zones {
            if zone.region == r {
                zone.members.clear();
            }
        }
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
        let config = rules(&s, Algorithm::AdaptiveTokenBucket).unwrap();
        let (_, bucket) = config.buckets().next().unwrap();
        assert_eq!(bucket.limit.per_second(), 10_000.0);
    }
}
