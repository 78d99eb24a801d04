//! A deterministic fleet for the control-loop tests: `HostCore`s, `ZoneCore`s and `RegionCore`s
//! wired by a simulated network on a virtual clock, with simulated clients that offer a constant
//! rate per bucket and admit `offered x (1 - ratio)`. No sockets and no sleeps, so ten simulated
//! seconds take milliseconds and every run is the same run.
//!
//! Time moves in steps of 1 ms. In each step, in this order: the messages due arrive; hosts whose
//! deadline passed mark their tail or report (`HostCore::on_deadline`); every 50 ms the surge
//! guards tick and every 250 ms adaptive shares expire (as the link's housekeeping does);
//! aggregators and controllers poll every hundredth of their interval, at most every 10 ms (as
//! the servers' tickers do);
//! then every client's load flows for the millisecond at the ratio its limiter holds. A message
//! takes its link's delay, plus a seeded jitter if asked, and never overtakes an earlier one on
//! the same link, as on a stream.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use spillway_core::algo::DropRatio;
use spillway_core::config;
use spillway_core::counters::Snapshot;
use spillway_core::surge;
use spillway_loop::{
    DecodeRules, HostCore, HostId, HostStep, HostTime, LinkRules, RegionCore, RegionStep,
    RulesSnapshot, ZoneCore, ZoneStep,
};
use spillway_proto::v1;

/// The simulated clock starts at this Unix time (Nov 2023), in ms: a multiple of every interval
/// the tests use, so the fleet starts on an interval boundary.
pub const START_MS: u64 = 1_700_000_000_000;
const NS_PER_MS: u64 = 1_000_000;
/// The service every test bucket belongs to.
pub const SERVICE: &str = "api";

/// A rules file with the given report interval, TTL and bucket lines (flow-style YAML maps).
pub fn config(interval_ms: u64, ttl_ms: u64, buckets: &[&str]) -> String {
    let lines: String = buckets.iter().map(|b| format!("      - {b}\n")).collect();
    format!(
        "version: 1\ncontrol:\n  report_interval: {interval_ms}ms\n  instruction_ttl: {ttl_ms}ms\nservices:\n  {SERVICE}:\n    buckets:\n{lines}"
    )
}

/// `a` is within `tolerance` of `b`.
pub fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance
}

/// One-way delays of the simulated network, in ms. Each message takes its link's delay plus a
/// draw in `0..=jitter_ms` from a generator seeded with `seed`.
#[derive(Debug, Clone, Copy)]
pub struct Network {
    pub host_zone_ms: u64,
    pub zone_region_ms: u64,
    pub peer_ms: u64,
    pub jitter_ms: u64,
    pub seed: u64,
}

impl Default for Network {
    /// Loopback-like within a region, a cross-region hop between controllers, no jitter.
    fn default() -> Self {
        Self {
            host_zone_ms: 1,
            zone_region_ms: 1,
            peer_ms: 10,
            jitter_ms: 0,
            seed: 1,
        }
    }
}

/// One endpoint of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Node {
    Host(usize),
    Zone(usize),
    Region(usize),
}

/// A message in flight, with what it is for.
#[derive(Debug)]
enum Message {
    Report(v1::Report),
    Instructions(v1::Instructions),
    ZoneReport(v1::ZoneReport),
    ZoneInstructions(v1::ZoneInstructions),
    Sums(v1::RegionSums),
}

/// The simulated network: messages by delivery time, then by the order they were sent.
struct Wire {
    network: Network,
    rng: fastrand::Rng,
    in_flight: BTreeMap<(u64, u64), (Node, Node, Message)>,
    sent: u64,
    /// When the last message on each link arrives, so a later one cannot overtake it.
    last: HashMap<(Node, Node), u64>,
}

impl Wire {
    fn send(&mut self, now_ms: u64, from: Node, to: Node, message: Message) {
        let base = match (from, to) {
            (Node::Host(_), _) | (_, Node::Host(_)) => self.network.host_zone_ms,
            (Node::Region(_), Node::Region(_)) => self.network.peer_ms,
            _ => self.network.zone_region_ms,
        };
        let jitter = self.rng.u64(0..=self.network.jitter_ms);
        let last = self.last.entry((from, to)).or_default();
        let at = (now_ms + (base + jitter).max(1)).max(*last);
        *last = at;
        self.sent += 1;
        self.in_flight.insert((at, self.sent), (from, to, message));
    }

    /// The next message due at `now_ms`, if any.
    fn due(&mut self, now_ms: u64) -> Option<(Node, Node, Message)> {
        let entry = self.in_flight.first_entry()?;
        if entry.key().0 > now_ms {
            return None;
        }
        Some(entry.remove())
    }

    /// Everything to or from `node` is lost (its process died with its streams).
    fn cut(&mut self, node: Node) {
        self.in_flight
            .retain(|_, (from, to, _)| *from != node && *to != node);
        self.last
            .retain(|(from, to), _| *from != node && *to != node);
    }
}

/// One bucket of a simulated client: a constant offered rate, what it offered and admitted so
/// far (fractions of a request included), and its limiter as the host core's steps set it.
struct Load {
    rate: f64,
    offered: f64,
    admitted: f64,
    limiter: DropRatio,
    share: Option<f64>,
}

impl Default for Load {
    fn default() -> Self {
        Self {
            rate: 0.0,
            offered: 0.0,
            admitted: 0.0,
            limiter: DropRatio::new(Duration::from_secs(1)),
            share: None,
        }
    }
}

impl Load {
    /// The counters as a real client's would read: whole requests only.
    fn totals(&self) -> Snapshot {
        let allowed = self.admitted.floor() as u64;
        Snapshot {
            allowed,
            dropped: (self.offered.floor() as u64).saturating_sub(allowed),
            ..Snapshot::default()
        }
    }
}

/// A simulated rate-limit client and the host core it drives.
pub struct Host {
    pub id: String,
    pub region: String,
    pub zone: String,
    zone_index: usize,
    core: HostCore,
    /// Its own clock, the fleet's, in ns: what its limiters are read against.
    now: u64,
    /// The configuration it runs: its own file, then each rules version that came down with
    /// its own identity and redis.
    config: config::Config,
    /// By bucket name; a bucket keeps its load across rules changes.
    loads: BTreeMap<String, Load>,
    /// The first drop ratio above 0 each bucket was instructed, and when (ms), until cleared.
    first_drop: HashMap<String, (f64, u64)>,
    /// The instructions being applied answer surge reports (`from_rates_now`): not an
    /// interval's, so they are no [`Host::first_drop`].
    from_rates_now: bool,
}

impl Host {
    fn time(&self) -> HostTime {
        HostTime {
            clock: self.now,
            unix_ns: self.now,
        }
    }

    fn totals(&self) -> Vec<Snapshot> {
        self.core
            .buckets()
            .map(|key| {
                self.loads
                    .get(&key.bucket)
                    .map_or_else(Snapshot::default, Load::totals)
            })
            .collect()
    }

    /// Offers `rps` to `bucket` from now on.
    pub fn set_rate(&mut self, bucket: &str, rps: f64) {
        self.loads.entry(bucket.to_owned()).or_default().rate = rps;
    }

    pub fn rate(&self, bucket: &str) -> f64 {
        self.loads.get(bucket).map_or(0.0, |l| l.rate)
    }

    /// The drop ratio the limiter applies now: the instruction's, or the surge guard's when it
    /// holds and is higher; 0 once the instruction expired.
    pub fn ratio(&self, bucket: &str) -> f64 {
        self.loads
            .get(bucket)
            .and_then(|l| l.limiter.current(self.now))
            .map_or(0.0, |r| r.as_f64())
    }

    /// What this client lets through now, per second: offered x (1 - ratio).
    pub fn admitted(&self, bucket: &str) -> f64 {
        self.rate(bucket) * (1.0 - self.ratio(bucket))
    }

    /// The adaptive share in force (1 after it expired), `None` before the first.
    pub fn share(&self, bucket: &str) -> Option<f64> {
        self.loads.get(bucket).and_then(|l| l.share)
    }

    /// The first drop ratio above 0 instructed for `bucket` by instructions computed from an
    /// interval (not an answer to surge reports) since the last [`Host::clear_first_drop`], and
    /// when it arrived (simulated Unix ms).
    pub fn first_drop(&self, bucket: &str) -> Option<(f64, u64)> {
        self.first_drop.get(bucket).copied()
    }

    pub fn clear_first_drop(&mut self) {
        self.first_drop.clear();
    }

    pub fn rules_version(&self) -> u64 {
        self.core.rules_version()
    }

    /// Whether it runs the control section and the services of the file `yaml`.
    pub fn runs_rules_of(&self, yaml: &str) -> bool {
        let file = config::load_str(yaml, "expected").unwrap();
        self.config.services == file.services && self.config.control == file.control
    }

    /// When instructions last arrived (simulated Unix ms, 0: never).
    pub fn last_instructions_ms(&self) -> u64 {
        self.core.last_instructions_ms()
    }

    /// Applies what the core asks for, as a real client does: rules are validated before they
    /// are taken, and the instructions that came with them follow.
    fn apply(&mut self, steps: Vec<HostStep>) {
        let now = self.time();
        for step in steps {
            let bucket = match &step {
                HostStep::Rules { version, rules } => {
                    let applied = LinkRules::decode(rules)
                        .and_then(|r| r.with_own(&self.config, "control-plane rules"));
                    let more = match applied {
                        Ok(config) => {
                            let more = self.core.rules_applied(now, *version, &config);
                            self.config = config;
                            more
                        }
                        Err(_) => self.core.rules_refused(now),
                    };
                    self.apply(more);
                    continue;
                }
                HostStep::DropRatio { bucket, .. }
                | HostStep::Surge { bucket, .. }
                | HostStep::Share { bucket, .. }
                | HostStep::ShareExpired { bucket } => self.core.bucket(*bucket).bucket.clone(),
            };
            let load = self.loads.entry(bucket.clone()).or_default();
            match step {
                HostStep::DropRatio { ratio, ttl, .. } => {
                    if ratio.as_f64() > 0.0 && !self.from_rates_now {
                        self.first_drop
                            .entry(bucket)
                            .or_insert((ratio.as_f64(), self.now / NS_PER_MS));
                    }
                    load.limiter.set_for(ratio, self.now, ttl);
                }
                HostStep::Surge { ratio, until, .. } => load.limiter.set_surge(ratio, until),
                HostStep::Share { share, .. } => load.share = Some(share.as_f64()),
                HostStep::ShareExpired { .. } => load.share = Some(1.0),
                HostStep::Rules { .. } => unreachable!("taken above"),
            }
        }
    }

    /// One millisecond of load at the ratios in force.
    fn flow(&mut self) {
        for load in self.loads.values_mut() {
            let ratio = load.limiter.current(self.now).map_or(0.0, |r| r.as_f64());
            let offered = load.rate / 1000.0;
            load.offered += offered;
            load.admitted += offered * (1.0 - ratio);
        }
    }
}

/// A zone's aggregator, always up.
struct Zone {
    region: usize,
    core: ZoneCore,
}

/// A region's controller: `None` while it is dead.
struct Region {
    name: String,
    zones: Vec<usize>,
    core: Option<RegionCore>,
}

/// The whole fleet on one virtual clock.
pub struct Fleet {
    now_ms: u64,
    rules: Arc<RulesSnapshot>,
    pub clients: Vec<Host>,
    zones: Vec<Zone>,
    regions: Vec<Region>,
    wire: Wire,
    /// Regions cut off from the others: their controllers' sums go nowhere and none reach them.
    partitioned: HashSet<usize>,
}

impl Fleet {
    /// `regions` regions of `zones` zones of `clients` clients each on the default network, all
    /// linked from the start, run until every controller knows all its hosts. Every tier starts
    /// on `yaml`: the controllers as version 1, the clients as their own file (version 0), so
    /// the controllers send it down once.
    pub fn start(yaml: &str, regions: usize, zones: usize, clients: usize) -> Fleet {
        Fleet::start_on(Network::default(), yaml, regions, zones, clients)
    }

    /// The same on `network`.
    pub fn start_on(
        network: Network,
        yaml: &str,
        regions: usize,
        zones: usize,
        clients: usize,
    ) -> Fleet {
        let rules = Arc::new(RulesSnapshot::parse(1, yaml, "rules.yaml").unwrap());
        let mut fleet = Fleet {
            now_ms: START_MS,
            rules: rules.clone(),
            clients: Vec::new(),
            zones: Vec::new(),
            regions: Vec::new(),
            partitioned: HashSet::new(),
            wire: Wire {
                network,
                rng: fastrand::Rng::with_seed(network.seed),
                in_flight: BTreeMap::new(),
                sent: 0,
                last: HashMap::new(),
            },
        };
        for r in 0..regions {
            let name = format!("r{}", r + 1);
            let mut region = Region {
                name: name.clone(),
                zones: Vec::new(),
                core: None,
            };
            for z in 0..zones {
                let zone_name = format!("{name}z{}", z + 1);
                let mut core = ZoneCore::new(&name, &zone_name, START_MS);
                core.upstream_opened();
                for c in 0..clients {
                    fleet.link_host(&mut core, &name, &zone_name, c);
                }
                region.zones.push(fleet.zones.len());
                fleet.zones.push(Zone { region: r, core });
            }
            fleet.regions.push(region);
            fleet.restart_controller(r);
        }
        fleet.wait_linked();
        fleet
    }

    /// Client `c` of a zone, with its stream to the aggregator open.
    fn link_host(&mut self, zone: &mut ZoneCore, region: &str, zone_name: &str, c: usize) {
        let id = format!("{zone_name}h{}", c + 1);
        let config = &self.rules.config;
        let mut host = Host {
            id: id.clone(),
            region: region.to_owned(),
            zone: zone_name.to_owned(),
            zone_index: self.zones.len(),
            core: HostCore::new(
                HostId {
                    host_id: id.clone(),
                    region: region.to_owned(),
                    zone: zone_name.to_owned(),
                },
                config,
                0,
            ),
            now: self.now_ms * NS_PER_MS,
            config: (**config).clone(),
            loads: BTreeMap::new(),
            first_drop: HashMap::new(),
            from_rates_now: false,
        };
        let totals = host.totals();
        host.core.start(host.time(), &totals);
        zone.join(&id, self.clients.len() as u64);
        self.clients.push(host);
    }

    /// Simulated Unix time, in ms.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The rules the controllers run.
    pub fn rules(&self) -> &Arc<RulesSnapshot> {
        &self.rules
    }

    /// The controller of region `r` (0-based); panics while it is dead.
    pub fn controller(&self, r: usize) -> &RegionCore {
        self.regions[r].core.as_ref().expect("a live controller")
    }

    pub fn aggregators(&self) -> impl Iterator<Item = &ZoneCore> {
        self.zones.iter().map(|z| &z.core)
    }

    pub fn clients_of<'a>(&'a self, region: &'a str) -> impl Iterator<Item = &'a Host> {
        self.clients.iter().filter(move |c| c.region == region)
    }

    /// Every client drops `ratio` of `bucket` now, to within 0.03.
    pub fn all_drop(&self, bucket: &str, ratio: f64) -> bool {
        self.clients
            .iter()
            .all(|c| close(c.ratio(bucket), ratio, 0.03))
    }

    /// Sum of what every client admits now.
    pub fn admitted(&self, bucket: &str) -> f64 {
        self.clients.iter().map(|c| c.admitted(bucket)).sum()
    }

    /// Region `r`'s controller dies: it receives and sends nothing more, what was in flight to or
    /// from it is lost, and its aggregators see their upstream stream end.
    pub fn kill_controller(&mut self, r: usize) {
        self.regions[r].core = None;
        self.wire.cut(Node::Region(r));
        for &z in &self.regions[r].zones {
            self.zones[z].core.upstream_closed();
        }
    }

    /// Region `r` is cut off from the other regions (`true`) or joins them again: the sums its
    /// controller announces from now on reach no other region, and theirs do not reach it.
    /// What is in flight arrives.
    pub fn partition(&mut self, r: usize, cut: bool) {
        if cut {
            self.partitioned.insert(r);
        } else {
            self.partitioned.remove(&r);
        }
    }

    /// Region `r`'s controller starts afresh on the current rules, and its aggregators' streams
    /// to it open again at once.
    pub fn restart_controller(&mut self, r: usize) {
        let region = &mut self.regions[r];
        let mut core = RegionCore::new(&region.name, self.rules.clone(), self.now_ms);
        for &z in &region.zones {
            core.join(z as u64, self.zones[z].core.zone());
            self.zones[z].core.upstream_opened();
        }
        region.core = Some(core);
    }

    /// The rules change to `yaml` on every live controller at once (each watches the same file);
    /// returns the new version.
    pub fn set_rules(&mut self, yaml: &str) -> u64 {
        let version = self.rules.version + 1;
        self.rules = Arc::new(RulesSnapshot::parse(version, yaml, "rules.yaml").unwrap());
        for region in &mut self.regions {
            if let Some(core) = &mut region.core {
                core.set_rules(self.rules.clone(), self.now_ms);
            }
        }
        version
    }

    /// Runs until simulated Unix time `at_ms`.
    pub fn run_until(&mut self, at_ms: u64) {
        while self.now_ms < at_ms {
            self.step();
        }
    }

    /// Runs until `condition` holds, checked before every step, and returns the simulated time
    /// that took; panics naming `what` if it does not hold within `limit` of simulated time.
    pub fn wait_for(
        &mut self,
        limit: Duration,
        what: &str,
        mut condition: impl FnMut(&Fleet) -> bool,
    ) -> Duration {
        let start = self.now_ms;
        loop {
            let took = Duration::from_millis(self.now_ms - start);
            if condition(self) {
                return took;
            }
            assert!(
                took < limit,
                "not within {limit:?} of simulated time: {what}"
            );
            self.step();
        }
    }

    /// Runs until every live controller knows all the hosts of its region.
    fn wait_linked(&mut self) {
        let per_region = self.clients.len() / self.regions.len();
        let limit = 10 * self.rules.config.control.report_interval;
        self.wait_for(limit, "every host known to its controller", |fleet| {
            fleet
                .regions
                .iter()
                .filter_map(|r| r.core.as_ref())
                .all(|core| core.hosts().len() == per_region)
        });
    }

    /// One millisecond of simulated time.
    pub fn step(&mut self) {
        let now = self.now_ms;
        while let Some((from, to, message)) = self.wire.due(now) {
            self.deliver(from, to, message);
        }
        for h in 0..self.clients.len() {
            let host = &mut self.clients[h];
            if now < host.core.deadline() {
                continue;
            }
            let totals = host.totals();
            if let Some(report) = host.core.on_deadline(host.time(), &totals) {
                let zone = host.zone_index;
                self.wire.send(
                    now,
                    Node::Host(h),
                    Node::Zone(zone),
                    Message::Report(report),
                );
            }
        }
        let since_start = now - START_MS;
        if since_start.is_multiple_of(surge::TICK_NS / NS_PER_MS) {
            let expire = since_start.is_multiple_of(5 * surge::TICK_NS / NS_PER_MS);
            for h in 0..self.clients.len() {
                let host = &mut self.clients[h];
                let totals = host.totals();
                let mut steps = host.core.guard_tick(host.now, &totals);
                if expire {
                    steps.extend(host.core.expire_shares(host.now));
                }
                host.apply(steps);
                // A guard that engaged says so at once, as the link does.
                if let Some(report) = host.core.take_surge_report() {
                    let zone = host.zone_index;
                    self.wire.send(
                        now,
                        Node::Host(h),
                        Node::Zone(zone),
                        Message::Report(report),
                    );
                }
            }
        }
        for z in 0..self.zones.len() {
            if now.is_multiple_of(ticker_ms(self.zones[z].core.interval().ms())) {
                let steps = self.zones[z].core.poll(now);
                self.zone_steps(z, steps);
            }
        }
        for r in 0..self.regions.len() {
            if let Some(core) = &mut self.regions[r].core
                && now.is_multiple_of(ticker_ms(core.interval().ms()))
            {
                let steps = core.poll(now);
                self.region_steps(r, steps);
            }
        }
        self.now_ms += 1;
        for host in &mut self.clients {
            host.flow();
            host.now = self.now_ms * NS_PER_MS;
        }
    }

    /// Hands a message to its receiver. Stream ids are the sender's index: a host's stream to
    /// its aggregator, an aggregator's to its controller.
    fn deliver(&mut self, from: Node, to: Node, message: Message) {
        let now = self.now_ms;
        match (from, to, message) {
            (_, Node::Host(h), Message::Instructions(instructions)) => {
                let host = &mut self.clients[h];
                host.from_rates_now = instructions.from_rates_now;
                let steps = host.core.on_instructions(host.time(), instructions);
                host.apply(steps);
                host.from_rates_now = false;
            }
            (Node::Host(h), Node::Zone(z), Message::Report(report)) => {
                let steps = self.zones[z].core.on_report(now, h as u64, report);
                self.zone_steps(z, steps);
            }
            (_, Node::Zone(z), Message::ZoneInstructions(instructions)) => {
                let steps = self.zones[z].core.on_instructions(now, instructions);
                self.zone_steps(z, steps);
            }
            (Node::Zone(z), Node::Region(r), Message::ZoneReport(report)) => {
                let Some(core) = &mut self.regions[r].core else {
                    return;
                };
                let steps = core.on_zone_report(z as u64, report, now);
                self.region_steps(r, steps);
            }
            (_, Node::Region(r), Message::Sums(sums)) => {
                let Some(core) = &mut self.regions[r].core else {
                    return;
                };
                let steps = core.on_peer_sums(sums, now);
                self.region_steps(r, steps);
            }
            (from, to, message) => panic!("{message:?} cannot go from {from:?} to {to:?}"),
        }
    }

    /// Sends what aggregator `z` asks for; sums for a dead controller go nowhere, as an
    /// aggregator without its upstream stream drops them.
    fn zone_steps(&mut self, z: usize, steps: Vec<ZoneStep>) {
        let now = self.now_ms;
        let region = self.zones[z].region;
        for step in steps {
            match step {
                ZoneStep::Forward(report) => {
                    if self.regions[region].core.is_some() {
                        let message = Message::ZoneReport(report);
                        self.wire
                            .send(now, Node::Zone(z), Node::Region(region), message);
                    }
                }
                ZoneStep::Send { host, instructions } => {
                    let h = self.clients.iter().position(|c| c.id == host);
                    let h = h.expect("instructions for a known host");
                    let message = Message::Instructions(instructions);
                    self.wire.send(now, Node::Zone(z), Node::Host(h), message);
                }
            }
        }
    }

    /// Sends what the controller of region `r` asks for: sums to every live peer, instructions
    /// to the zone of the stream they name.
    fn region_steps(&mut self, r: usize, steps: Vec<RegionStep>) {
        let now = self.now_ms;
        for step in steps {
            match step {
                RegionStep::Announce(sums) => {
                    let apart = |a: usize, b: usize| {
                        self.partitioned.contains(&a) != self.partitioned.contains(&b)
                    };
                    for peer in 0..self.regions.len() {
                        if peer != r && self.regions[peer].core.is_some() && !apart(r, peer) {
                            let message = Message::Sums(sums.clone());
                            self.wire
                                .send(now, Node::Region(r), Node::Region(peer), message);
                        }
                    }
                }
                RegionStep::SendShared {
                    member,
                    instructions,
                } => {
                    let to = Node::Zone(member as usize);
                    let message = Message::ZoneInstructions(instructions.to_message());
                    self.wire.send(now, Node::Region(r), to, message);
                }
                RegionStep::Send {
                    member,
                    instructions,
                } => {
                    let to = Node::Zone(member as usize);
                    let message = Message::ZoneInstructions(instructions);
                    self.wire.send(now, Node::Region(r), to, message);
                }
            }
        }
    }
}

/// How often the servers' tickers poll their core: a tenth of the interval, 2 to 50 ms.
fn ticker_ms(interval_ms: u64) -> u64 {
    (interval_ms / 100).clamp(2, 10)
}

/// Zone `zone`'s report of interval `sequence` (1 s) in region r1: `offered` requests of
/// bucket api/all, all allowed, from `hosts` hosts.
pub fn zone_counts(zone: &str, sequence: u64, offered: u64, hosts: u32) -> v1::ZoneReport {
    v1::ZoneReport {
        zone: zone.into(),
        region: "r1".into(),
        sequence,
        interval_ms: 1_000,
        buckets: vec![v1::BucketCounts {
            service: "api".into(),
            bucket: "all".into(),
            offered,
            allowed: offered,
            offered_tail: Some(offered / 4),
            hosts: Some(u64::from(hosts)),
            ..Default::default()
        }],
        clients: hosts,
        ..Default::default()
    }
}
