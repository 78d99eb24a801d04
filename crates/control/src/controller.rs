//! The regional controller (G7): sums its zones into region usage, exchanges the sums of global
//! buckets with the other regions' controllers, computes every bucket's drop ratio (and adaptive
//! token bucket shares) and pushes them down through the aggregators once per interval, with the
//! rules when they changed.
//!
//! No controller leads: each sends its region's sums of global buckets to every peer each
//! interval, waits (at most half an interval past the end) for the sums of every live peer, and
//! computes from the same numbers with the same math as its peers, so all regions drop the same
//! share. A peer silent for longer than the instruction TTL falls out of the sum. Worked example:
//! a global limit of 1,000/s, region A offering 900/s and region B 600/s: both controllers see
//! 1,500/s and send a drop ratio of 1/3, so A admits 600/s and B 400/s.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spillway_core::algo::{Kind, Ratio};
use spillway_core::config::{Config, Scope};
use spillway_core::control::{Smoother, target_drop};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status, Streaming};

use crate::admin::{self, AdminView};
use crate::error::ControlError;
use crate::net::{self, Stop, sleep_or_stop};
use crate::rules::RulesSnapshot;
use crate::sums::{BucketKey, Intervals, Sums};
use crate::timing::{Backoff, Interval, now_ms};

/// Where a controller listens, its peers and its rules.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub listen: SocketAddr,
    pub region: String,
    /// The other regions' controllers, for example `http://10.1.0.5:7001`.
    pub peers: Vec<String>,
    pub admin: Option<SocketAddr>,
    pub backoff: Backoff,
    /// The rules in force; a new value is sent down at the next interval.
    pub rules: watch::Receiver<Arc<RulesSnapshot>>,
}

impl ControllerOptions {
    pub fn new(
        listen: SocketAddr,
        region: impl Into<String>,
        rules: watch::Receiver<Arc<RulesSnapshot>>,
    ) -> Self {
        Self {
            listen,
            region: region.into(),
            peers: Vec::new(),
            admin: None,
            backoff: Backoff::default(),
            rules,
        }
    }
}

/// A running controller.
pub struct Controller {
    region: Arc<Region>,
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("addr", &self.addr)
            .field("region", &self.region.region)
            .finish_non_exhaustive()
    }
}

/// One bucket as the controller last computed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketView {
    pub limit_rps: f64,
    /// Offered load over the bucket's scope as this controller sees it (for a zone-scoped
    /// bucket, the sum of the region's zones).
    pub observed_rps: f64,
    /// The ratio sent (for a zone-scoped bucket, the highest of its zones).
    pub drop_ratio: f64,
    /// What the hosts admitted over the same scope and interval, per second (after their ratios
    /// and surge guards).
    pub admitted_rps: f64,
}

/// A host as the controller knows it from its aggregators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    pub host_id: String,
    pub zone: String,
    pub rules_version: u64,
}

impl Controller {
    /// Binds the listeners, dials the peers and starts computing.
    pub async fn start(options: ControllerOptions) -> Result<Self, ControlError> {
        let peers = options
            .peers
            .iter()
            .map(|url| net::endpoint(url).map(|e| (url.clone(), e)))
            .collect::<Result<Vec<_>, _>>()?;
        let listener =
            TcpListener::bind(options.listen)
                .await
                .map_err(|source| ControlError::Bind {
                    addr: options.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ControlError::Bind {
            addr: options.listen,
            source,
        })?;
        let (stop, stop_rx) = watch::channel(false);
        let region = Arc::new(Region::new(&options.region, options.rules.borrow().clone()));
        let mut tasks = Vec::new();
        let admin =
            admin::start_if(options.admin, region.clone(), stop_rx.clone(), &mut tasks).await?;
        let service = v1::controller_server::ControllerServer::new(Service {
            region: region.clone(),
            stop: stop_rx.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
        tasks.push(net::serve(
            tonic::transport::Server::builder().add_service(service),
            listener,
            stop_rx.clone(),
            "controller",
        ));
        for (url, endpoint) in peers {
            tasks.push(tokio::spawn(peer_link(
                region.clone(),
                url,
                endpoint,
                options.backoff.clone(),
                stop_rx.clone(),
            )));
        }
        tasks.push(tokio::spawn(follow_rules(
            region.clone(),
            options.rules.clone(),
            stop_rx.clone(),
        )));
        tasks.push(tokio::spawn(ticker(region.clone(), stop_rx)));
        tracing::info!(%addr, region = %options.region, peers = options.peers.len(), "controller started");
        Ok(Self {
            region,
            addr,
            admin,
            stop,
            tasks,
        })
    }

    /// Where aggregators and peers connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// Every control-plane bucket as last computed.
    pub fn buckets(&self) -> HashMap<BucketKey, BucketView> {
        self.region.lock().core.view().clone()
    }

    /// Hosts of this region with the rules version each runs.
    pub fn hosts(&self) -> Vec<HostView> {
        self.region.hosts()
    }

    /// Peer regions heard from within the TTL.
    pub fn live_peers(&self) -> Vec<String> {
        let state = self.region.lock();
        let ttl = state.rules.config.control.instruction_ttl;
        state.core.live_peers(now_ms(), ttl)
    }

    /// Stops accepting, ends every stream and waits (at most 5 s) for the tasks.
    pub async fn shutdown(self) {
        net::stop_and_join(&self.stop, self.tasks).await;
    }
}

struct Region {
    region: String,
    state: Mutex<RegionState>,
    next_conn: AtomicU64,
    computed: AtomicU64,
}

struct RegionState {
    rules: Arc<RulesSnapshot>,
    zones: HashMap<u64, ZoneConn>,
    peer_txs: HashMap<u64, mpsc::Sender<Result<v1::RegionSums, Status>>>,
    /// Everything that decides what to send, without I/O.
    core: RegionCore,
}

struct ZoneConn {
    zone: String,
    tx: mpsc::Sender<Result<v1::ZoneInstructions, Status>>,
    hosts: HashMap<String, u64>,
    sent_rules: u64,
}

/// What the controller's state machine asks its owner to send.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// This region's sums of its global buckets, for every peer controller.
    Announce(v1::RegionSums),
    /// The instructions of one computed interval, per zone name.
    Instruct {
        sequence: u64,
        per_zone: HashMap<String, Vec<v1::BucketInstruction>>,
    },
}

/// A peer region as this controller knows it.
#[derive(Debug, Clone)]
struct Peer {
    /// When its sums last arrived, in the owner's milliseconds.
    last_heard_ms: u64,
    sums: BTreeMap<u64, Sums>,
}

/// The regional controller as a sans-IO state machine: zone sums and peer sums go in with the
/// time, [`Step`]s come out. The gRPC server drives it with Unix milliseconds, the simulator
/// with simulated ones, so both run the same closing rules and the same drop-ratio math.
///
/// An interval closes when every zone reported it or two graces after its end (aggregators wait
/// up to one grace for their clients); its global sums are then announced to the peers, and it
/// is computed when every live peer's sums for it are in, or three graces after its end. With 1 s
/// intervals: interval 7 is computed at 8.750 s at the latest.
#[derive(Debug, Clone)]
pub struct RegionCore {
    region: String,
    window: Intervals<u64, HashMap<String, Sums>>,
    /// Closed intervals waiting for the peers' sums, with their deadline (ms).
    awaiting: BTreeMap<u64, (HashMap<String, Sums>, u64)>,
    peers: HashMap<String, Peer>,
    smoothers: HashMap<(BucketKey, Option<String>), Smoother>,
    view: HashMap<BucketKey, BucketView>,
}

impl RegionCore {
    /// A controller for `region` that counts intervals up to `closed_through` as closed.
    pub fn new(region: impl Into<String>, closed_through: u64) -> Self {
        Self {
            region: region.into(),
            window: Intervals::new(closed_through),
            awaiting: BTreeMap::new(),
            peers: HashMap::new(),
            smoothers: HashMap::new(),
            view: HashMap::new(),
        }
    }

    /// Every control-plane bucket as last computed.
    pub fn view(&self) -> &HashMap<BucketKey, BucketView> {
        &self.view
    }

    /// Peer regions heard from within `ttl` of `now_ms`, sorted.
    pub fn live_peers(&self, now_ms: u64, ttl: Duration) -> Vec<String> {
        let mut live: Vec<String> = self
            .peers
            .iter()
            .filter(|(_, p)| is_live(p, now_ms, ttl))
            .map(|(r, _)| r.clone())
            .collect();
        live.sort();
        live
    }

    /// The interval length changed: forget every open interval.
    pub fn reset(&mut self, closed_through: u64) {
        self.window.reset(closed_through);
        self.awaiting.clear();
    }

    /// Zone `zone`'s sums of interval `sequence`, from member `member` (one aggregator stream).
    /// False when the interval is already closed.
    pub fn on_zone_sums(
        &mut self,
        member: u64,
        zone: &str,
        sequence: u64,
        buckets: &[v1::BucketCounts],
    ) -> bool {
        match self.window.accept(sequence, member) {
            Some(zones) => {
                zones.entry(zone.to_owned()).or_default().add_wire(buckets);
                true
            }
            None => false,
        }
    }

    /// A peer's sums, at `now_ms`. Keeps enough intervals per peer to cover the TTL.
    pub fn on_peer_sums(&mut self, config: &Config, sums: v1::RegionSums, now_ms: u64) {
        if sums.region == self.region || sums.region.is_empty() {
            return;
        }
        let interval = Interval::new(config.control.report_interval);
        let ttl = config.control.instruction_ttl;
        let keep = (ttl.as_millis() as u64 / interval.ms()).max(1) + 2;
        let peer = self.peers.entry(sums.region).or_insert_with(|| Peer {
            last_heard_ms: now_ms,
            sums: BTreeMap::new(),
        });
        peer.last_heard_ms = now_ms;
        // Sums of intervals the clock has not reached are bogus; kept, they would push the
        // peer's real ones out of its window.
        let current = interval.sequence_at(now_ms);
        if sums.interval_ms == interval.ms() && sums.sequence <= current.saturating_add(1) {
            peer.sums
                .insert(sums.sequence, Sums::from_wire(&sums.buckets));
            while peer.sums.len() as u64 > keep {
                peer.sums.pop_first();
            }
        }
    }

    /// Moves intervals along at `now_ms`: closes the region's intervals that every one of
    /// `members` reported or that are overdue (announcing their global sums), then computes
    /// those whose live peers' sums are all in or whose deadline passed. `zones` are the names of
    /// the connected zones: each gets instructions, even one that reported nothing.
    pub fn poll<'a>(
        &mut self,
        config: &Config,
        members: impl Iterator<Item = &'a u64> + Clone,
        zones: impl Iterator<Item = &'a str> + Clone,
        now_ms: u64,
    ) -> Vec<Step> {
        let interval = Interval::new(config.control.report_interval);
        let grace = interval.grace_ms();
        let mut steps = Vec::new();
        for (sequence, zone_sums, _) in
            self.window
                .close_ready(now_ms, interval, 2 * grace, members)
        {
            steps.push(Step::Announce(v1::RegionSums {
                region: self.region.clone(),
                sequence,
                interval_ms: interval.ms(),
                buckets: global_sums(config, &zone_sums).to_wire(),
            }));
            self.awaiting
                .insert(sequence, (zone_sums, interval.end_of(sequence) + 3 * grace));
        }
        let ttl = config.control.instruction_ttl;
        while let Some((&sequence, &(_, deadline))) = self.awaiting.first_key_value() {
            let all_in = self
                .peers
                .values()
                .filter(|p| is_live(p, now_ms, ttl))
                .all(|p| p.sums.contains_key(&sequence));
            if !(all_in || now_ms >= deadline) {
                break;
            }
            let Some((sequence, (mut zone_sums, _))) = self.awaiting.pop_first() else {
                break;
            };
            for zone in zones.clone().filter(|z| !z.is_empty()) {
                zone_sums.entry(zone.to_owned()).or_default();
            }
            let mut peers = Sums::default();
            for peer in self.peers.values().filter(|p| is_live(p, now_ms, ttl)) {
                // This interval's sums, or the latest before it when the peer was late.
                if let Some((_, sums)) = peer.sums.range(..=sequence).next_back() {
                    peers.add(sums);
                }
            }
            let per_zone = self.compute(config, &zone_sums, &peers, interval);
            steps.push(Step::Instruct { sequence, per_zone });
        }
        steps
    }

    /// One interval's instructions per zone from the zones' sums and the live peers' sums: a
    /// smoothed drop ratio per bucket and scope (G8), and each zone's share of the scope's load
    /// for adaptive token buckets (G10).
    ///
    /// The ratio's target comes from the scope's offered load, or from its tail when that shows
    /// a surge that started within the interval ([`crate::sums::Counts::offered_for_rise`]): the first
    /// instruction after the surge already carries its whole ratio, one interval earlier than
    /// the offered count alone would give it. Shares and the offered load sent down stay the
    /// interval's own.
    fn compute(
        &mut self,
        config: &Config,
        zone_sums: &HashMap<String, Sums>,
        peers: &Sums,
        interval: Interval,
    ) -> HashMap<String, Vec<v1::BucketInstruction>> {
        let secs = interval.secs();
        let mut region = Sums::default();
        for sums in zone_sums.values() {
            region.add(sums);
        }
        let mut per_zone: HashMap<String, Vec<v1::BucketInstruction>> = HashMap::new();
        let mut view = HashMap::new();
        let mut live_keys = HashSet::new();
        for (service, bucket) in config.buckets() {
            if !matches!(
                bucket.algorithm,
                Kind::DropRatio | Kind::AdaptiveTokenBucket
            ) {
                continue;
            }
            let key = BucketKey::new(&service.name, &bucket.name);
            let limit = bucket.limit.per_second();
            let adaptive = bucket.algorithm == Kind::AdaptiveTokenBucket;
            let mut instruction =
                |zone: &str, ratio: f64, share: f64, scope_offered: f64, scope_hosts: u64| {
                    per_zone
                        .entry(zone.to_owned())
                        .or_default()
                        .push(v1::BucketInstruction {
                            service: key.service.clone(),
                            bucket: key.bucket.clone(),
                            drop_ratio: if adaptive {
                                0
                            } else {
                                Ratio::from_f64(ratio).raw()
                            },
                            share: adaptive.then(|| Ratio::from_f64(share).raw()),
                            scope_offered_rps: scope_offered,
                            scope_hosts,
                        });
                };
            let mut smoother = |zone: Option<&str>, target: f64| {
                live_keys.insert((key.clone(), zone.map(str::to_owned)));
                self.smoothers
                    .entry((key.clone(), zone.map(str::to_owned)))
                    .or_default()
                    .update(target)
            };
            let zones_count = zone_sums.len().max(1) as f64;
            match bucket.scope {
                Scope::Zone => {
                    let mut observed = 0.0;
                    let mut admitted = 0.0;
                    let mut highest: f64 = 0.0;
                    for (zone, sums) in zone_sums {
                        let counts = sums.counts(&key);
                        let offered = counts.offered as f64 / secs;
                        admitted += counts.allowed as f64 / secs;
                        let rise = counts.offered_for_rise() as f64 / secs;
                        let ratio = smoother(Some(zone), target_drop(limit, rise));
                        instruction(zone, ratio, 1.0, offered, counts.hosts);
                        observed += offered;
                        highest = highest.max(ratio);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: observed,
                            drop_ratio: highest,
                            admitted_rps: admitted,
                        },
                    );
                }
                Scope::Region | Scope::Global => {
                    let mut counts = region.counts(&key);
                    if bucket.scope == Scope::Global {
                        counts += peers.counts(&key);
                    }
                    let scope = counts.offered as f64 / secs;
                    let rise = counts.offered_for_rise() as f64 / secs;
                    let ratio = smoother(None, target_drop(limit, rise));
                    for (zone, sums) in zone_sums {
                        let share = if scope > 0.0 {
                            sums.offered(&key) as f64 / secs / scope
                        } else {
                            1.0 / zones_count
                        };
                        instruction(zone, ratio, share, scope, counts.hosts);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: scope,
                            drop_ratio: ratio,
                            admitted_rps: counts.allowed as f64 / secs,
                        },
                    );
                }
            }
        }
        // Buckets that left the rules take their smoothing state with them.
        self.smoothers.retain(|k, _| live_keys.contains(k));
        self.view = view;
        per_zone
    }
}

fn is_live(peer: &Peer, now_ms: u64, ttl: Duration) -> bool {
    (now_ms.saturating_sub(peer.last_heard_ms) as u128) < ttl.as_millis()
}

/// The region's sums of its global buckets only: what peers need, and all they get.
pub fn global_sums(config: &Config, zones: &HashMap<String, Sums>) -> Sums {
    let mut region = Sums::default();
    for sums in zones.values() {
        region.add(sums);
    }
    let global: HashSet<BucketKey> = config
        .buckets()
        .filter(|(_, b)| b.scope == Scope::Global)
        .map(|(s, b)| BucketKey::new(&s.name, &b.name))
        .collect();
    region.0.retain(|k, _| global.contains(k));
    region
}

impl Region {
    fn new(region: &str, rules: Arc<RulesSnapshot>) -> Self {
        let interval = Interval::new(rules.config.control.report_interval);
        Self {
            region: region.to_owned(),
            state: Mutex::new(RegionState {
                rules,
                zones: HashMap::new(),
                peer_txs: HashMap::new(),
                core: RegionCore::new(region, interval.sequence_at(now_ms()).saturating_sub(1)),
            }),
            next_conn: AtomicU64::new(1),
            computed: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RegionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn hosts(&self) -> Vec<HostView> {
        let state = self.lock();
        let mut hosts: Vec<HostView> = state
            .zones
            .values()
            .flat_map(|z| {
                z.hosts.iter().map(|(host, version)| HostView {
                    host_id: host.clone(),
                    zone: z.zone.clone(),
                    rules_version: *version,
                })
            })
            .collect();
        hosts.sort_by(|a, b| a.host_id.cmp(&b.host_id));
        hosts
    }

    fn on_zone_report(&self, conn: u64, report: v1::ZoneReport) {
        let mut state = self.lock();
        if let Some(zone) = state.zones.get_mut(&conn) {
            zone.zone.clone_from(&report.zone);
            for h in &report.hosts {
                zone.hosts.insert(h.host_id.clone(), h.rules_version);
            }
            for h in &report.gone {
                zone.hosts.remove(h);
            }
        }
        let interval = Interval::new(state.rules.config.control.report_interval);
        if report.interval_ms != interval.ms()
            || !state
                .core
                .on_zone_sums(conn, &report.zone, report.sequence, &report.buckets)
        {
            return;
        }
        self.poll(&mut state, now_ms());
    }

    fn on_peer_sums(&self, sums: v1::RegionSums) {
        let mut state = self.lock();
        let RegionState { rules, core, .. } = &mut *state;
        core.on_peer_sums(&rules.config, sums, now_ms());
        self.poll(&mut state, now_ms());
    }

    /// Runs the state machine at `now` and sends what it asks for.
    fn poll(&self, state: &mut RegionState, now: u64) {
        let RegionState {
            rules, zones, core, ..
        } = &mut *state;
        let steps = core.poll(
            &rules.config,
            zones.keys(),
            zones.values().map(|z| z.zone.as_str()),
            now,
        );
        for step in steps {
            match step {
                Step::Announce(message) => {
                    for tx in state.peer_txs.values() {
                        let _ = tx.try_send(Ok(message.clone()));
                    }
                }
                Step::Instruct { sequence, per_zone } => {
                    self.send_instructions(state, sequence, &per_zone, now);
                }
            }
        }
    }

    fn send_instructions(
        &self,
        state: &mut RegionState,
        sequence: u64,
        per_zone: &HashMap<String, Vec<v1::BucketInstruction>>,
        now: u64,
    ) {
        let rules = state.rules.clone();
        let interval = Interval::new(rules.config.control.report_interval);
        let ttl = rules.config.control.instruction_ttl;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        for zone in state.zones.values_mut() {
            let send_rules = zone.sent_rules != rules.version;
            let message = v1::ZoneInstructions {
                instructions: Some(v1::Instructions {
                    issued_at_ms: now,
                    ttl_ms,
                    interval_ms: interval.ms(),
                    sequence,
                    buckets: per_zone.get(&zone.zone).cloned().unwrap_or_default(),
                    rules_version: rules.version,
                    rules: send_rules.then(|| v1::Rules {
                        version: rules.version,
                        yaml: rules.yaml.to_string(),
                    }),
                }),
            };
            if zone.tx.try_send(Ok(message)).is_ok() && send_rules {
                zone.sent_rules = rules.version;
            }
        }
        self.computed.fetch_add(1, Ordering::Relaxed);
    }

    fn set_rules(&self, rules: Arc<RulesSnapshot>) {
        let mut state = self.lock();
        let old = Interval::new(state.rules.config.control.report_interval);
        let new = Interval::new(rules.config.control.report_interval);
        if old != new {
            state
                .core
                .reset(new.sequence_at(now_ms()).saturating_sub(1));
        }
        state.rules = rules;
    }
}

impl AdminView for Region {
    fn ready(&self) -> Result<String, String> {
        let state = self.lock();
        Ok(format!(
            "region {}, rules version {}, {} zone(s)",
            self.region,
            state.rules.version,
            state.zones.len()
        ))
    }

    fn metrics(&self) -> String {
        type Labels = Vec<(&'static str, String)>;
        type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
        let state = self.lock();
        let mut registry = Registry::default();
        let limit = Family::<Labels, FloatGauge>::default();
        let observed = Family::<Labels, FloatGauge>::default();
        let ratio = Family::<Labels, FloatGauge>::default();
        for (key, view) in state.core.view() {
            let labels = vec![
                ("service", key.service.clone()),
                ("bucket", key.bucket.clone()),
            ];
            limit.get_or_create(&labels).set(view.limit_rps);
            observed.get_or_create(&labels).set(view.observed_rps);
            ratio.get_or_create(&labels).set(view.drop_ratio);
        }
        registry.register(
            "spillway_bucket_limit_rps",
            "The bucket's limit as a rate per second",
            limit,
        );
        registry.register(
            "spillway_bucket_observed_rps",
            "Offered load over the bucket's scope in the last interval, per second",
            observed,
        );
        registry.register(
            "spillway_drop_ratio",
            "Drop ratio sent for the bucket (a zone-scoped bucket: its highest zone)",
            ratio,
        );
        let version = Gauge::<i64>::default();
        version.set(i64::try_from(state.rules.version).unwrap_or(i64::MAX));
        registry.register(
            "spillway_rules_version",
            "Version of the rules this controller sends down",
            version,
        );
        let zones = Gauge::<i64>::default();
        zones.set(i64::try_from(state.zones.len()).unwrap_or(i64::MAX));
        registry.register(
            "spillway_controller_zones",
            "Aggregators with an open stream",
            zones,
        );
        let ttl = state.rules.config.control.instruction_ttl;
        let peers = Gauge::<i64>::default();
        peers.set(i64::try_from(state.core.live_peers(now_ms(), ttl).len()).unwrap_or(i64::MAX));
        registry.register(
            "spillway_controller_live_peers",
            "Peer regions heard from within the instruction TTL",
            peers,
        );
        drop(state);
        let mut out = String::new();
        let _ = encode(&mut out, &registry);
        out
    }

    fn json_paths(&self) -> &'static [&'static str] {
        &["/v1/hosts", "/v1/buckets"]
    }

    fn dashboard(&self) -> Option<&'static str> {
        Some(DASHBOARD)
    }

    fn json(&self, path: &str) -> Option<String> {
        match path {
            "/v1/hosts" => Some(self.hosts_json()),
            "/v1/buckets" => Some(self.buckets_json()),
            _ => None,
        }
    }
}

/// The live page on `/` of a controller's admin listener: its buckets (limit, offered, drop
/// ratio, two minutes of history drawn in the page) and which host runs which rules version,
/// from `/v1/buckets` and `/v1/hosts`, refreshed every second.
const DASHBOARD: &str = include_str!("dashboard.html");

impl Region {
    /// `/v1/buckets`: every control-plane bucket as last computed, in configuration order.
    fn buckets_json(&self) -> String {
        let state = self.lock();
        let view = state.core.view();
        let interval = Interval::new(state.rules.config.control.report_interval);
        let buckets: Vec<serde_json::Value> = state
            .rules
            .config
            .buckets()
            .filter_map(|(service, bucket)| {
                let key = BucketKey::new(&service.name, &bucket.name);
                let v = view.get(&key)?;
                Some(serde_json::json!({
                    "service": key.service,
                    "bucket": key.bucket,
                    "scope": bucket.scope,
                    "limit_rps": v.limit_rps,
                    "offered_rps": v.observed_rps,
                    "admitted_rps": v.admitted_rps,
                    "drop_ratio": v.drop_ratio,
                }))
            })
            .collect();
        serde_json::json!({
            "region": self.region,
            "rules_version": state.rules.version,
            "interval_ms": interval.ms(),
            "buckets": buckets,
        })
        .to_string()
    }

    /// `/v1/hosts`: which host runs which rules version, and whether all run the current one.
    fn hosts_json(&self) -> String {
        let version = self.lock().rules.version;
        let hosts = self.hosts();
        let converged = hosts.iter().all(|h| h.rules_version == version);
        let map: serde_json::Map<String, serde_json::Value> = hosts
            .into_iter()
            .map(|h| {
                (
                    h.host_id,
                    serde_json::json!({ "zone": h.zone, "rules_version": h.rules_version }),
                )
            })
            .collect();
        serde_json::json!({
            "region": self.region,
            "rules_version": version,
            "converged": converged,
            "hosts": map,
        })
        .to_string()
    }
}

struct Service {
    region: Arc<Region>,
    stop: Stop,
}

#[tonic::async_trait]
impl v1::controller_server::Controller for Service {
    type LinkZoneStream = ReceiverStream<Result<v1::ZoneInstructions, Status>>;
    type ExchangeStream = ReceiverStream<Result<v1::RegionSums, Status>>;

    async fn link_zone(
        &self,
        request: Request<Streaming<v1::ZoneReport>>,
    ) -> Result<Response<Self::LinkZoneStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let region = self.region.clone();
        let mut stop = self.stop.clone();
        let conn = region.next_conn.fetch_add(1, Ordering::Relaxed);
        region.lock().zones.insert(
            conn,
            ZoneConn {
                zone: String::new(),
                tx,
                hosts: HashMap::new(),
                sent_rules: 0,
            },
        );
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(report)) => region.on_zone_report(conn, report),
                        _ => break,
                    },
                    _ = stop.changed() => break,
                }
            }
            let mut state = region.lock();
            state.zones.remove(&conn);
            region.poll(&mut state, now_ms());
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn exchange(
        &self,
        request: Request<Streaming<v1::RegionSums>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let region = self.region.clone();
        let mut stop = self.stop.clone();
        let conn = region.next_conn.fetch_add(1, Ordering::Relaxed);
        region.lock().peer_txs.insert(conn, tx);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(sums)) => region.on_peer_sums(sums),
                        _ => break,
                    },
                    _ = stop.changed() => break,
                }
            }
            region.lock().peer_txs.remove(&conn);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Moves intervals along between events, about ten times per interval.
async fn ticker(region: Arc<Region>, mut stop: Stop) {
    loop {
        let period = {
            let mut state = region.lock();
            region.poll(&mut state, now_ms());
            let interval = Interval::new(state.rules.config.control.report_interval);
            Duration::from_millis((interval.ms() / 10).clamp(2, 50))
        };
        if sleep_or_stop(period, &mut stop).await {
            return;
        }
    }
}

async fn follow_rules(
    region: Arc<Region>,
    mut rules: watch::Receiver<Arc<RulesSnapshot>>,
    mut stop: Stop,
) {
    loop {
        tokio::select! {
            changed = rules.changed() => {
                if changed.is_err() {
                    return;
                }
                let snapshot = rules.borrow_and_update().clone();
                tracing::info!(version = snapshot.version, "sending new rules down");
                region.set_rules(snapshot);
            }
            _ = stop.changed() => return,
        }
    }
}

/// A stream to one peer controller, reopened with backoff whenever it breaks. Sums flow both
/// ways on it, so one side listing the other as a peer is enough.
async fn peer_link(
    region: Arc<Region>,
    url: String,
    endpoint: Endpoint,
    mut backoff: Backoff,
    mut stop: Stop,
) {
    loop {
        if net::stopped(&stop) {
            return;
        }
        let conn = region.next_conn.fetch_add(1, Ordering::Relaxed);
        let result = peer_session(&region, conn, &endpoint, &mut backoff, &mut stop).await;
        region.lock().peer_txs.remove(&conn);
        match result {
            Ok(()) => return,
            Err(reason) => tracing::warn!(peer = %url, "peer link down: {reason}"),
        }
        if sleep_or_stop(backoff.next_delay(), &mut stop).await {
            return;
        }
    }
}

async fn peer_session(
    region: &Region,
    conn: u64,
    endpoint: &Endpoint,
    backoff: &mut Backoff,
    stop: &mut Stop,
) -> Result<(), String> {
    let channel = tokio::select! {
        c = endpoint.connect() => c.map_err(|e| format!("cannot connect: {e}"))?,
        _ = stop.changed() => return Ok(()),
    };
    let mut client = v1::controller_client::ControllerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<Result<v1::RegionSums, Status>>(16);
    let outbound = ReceiverStream::new(rx).filter_map(Result::ok);
    let mut inbound = client
        .exchange(outbound)
        .await
        .map_err(|s| format!("the peer refused the stream: {}", s.message()))?
        .into_inner();
    region.lock().peer_txs.insert(conn, tx);
    backoff.reset();
    loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(sums)) => region.on_peer_sums(sums),
                Ok(None) => return Err("the peer ended the stream".into()),
                Err(status) => return Err(format!("stream error: {}", status.message())),
            },
            _ = stop.changed() => return Ok(()),
        }
    }
}
