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
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spillway_core::algo::{Kind, Ratio};
use spillway_core::config::Scope;
use spillway_core::control::{Smoother, target_drop};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::admin::{self, AdminView};
use crate::error::ControlError;
use crate::net::{self, Stop, sleep_or_stop};
use crate::rules::RulesSnapshot;
use crate::sums::{BucketKey, Sums};
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
        let admin = match options.admin {
            Some(at) => {
                let (local, task) = admin::start(at, region.clone(), stop_rx.clone()).await?;
                tasks.push(task);
                Some(local)
            }
            None => None,
        };
        let service = v1::controller_server::ControllerServer::new(Service {
            region: region.clone(),
            stop: stop_rx.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let mut server_stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            let result = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = server_stop.changed().await;
                })
                .await;
            if let Err(err) = result {
                tracing::error!("controller server failed: {err}");
            }
        }));
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
        self.region.lock().view.clone()
    }

    /// Hosts of this region with the rules version each runs.
    pub fn hosts(&self) -> Vec<HostView> {
        self.region.hosts()
    }

    /// Peer regions heard from within the TTL.
    pub fn live_peers(&self) -> Vec<String> {
        let state = self.region.lock();
        let ttl = state.rules.config.control.instruction_ttl;
        let mut live: Vec<String> = state
            .peers
            .iter()
            .filter(|(_, p)| p.last_heard.elapsed() < ttl)
            .map(|(r, _)| r.clone())
            .collect();
        live.sort();
        live
    }

    /// Stops accepting, ends every stream and waits (at most 5 s) for the tasks.
    pub async fn shutdown(self) {
        self.stop.send_replace(true);
        for task in self.tasks {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
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
    pending: BTreeMap<u64, Pending>,
    closed_through: u64,
    /// Closed intervals waiting for the peers' sums, with their deadline (Unix ms).
    awaiting: BTreeMap<u64, (HashMap<String, Sums>, u64)>,
    peers: HashMap<String, Peer>,
    peer_txs: HashMap<u64, mpsc::Sender<Result<v1::RegionSums, Status>>>,
    smoothers: HashMap<(BucketKey, Option<String>), Smoother>,
    view: HashMap<BucketKey, BucketView>,
}

struct ZoneConn {
    zone: String,
    tx: mpsc::Sender<Result<v1::ZoneInstructions, Status>>,
    hosts: HashMap<String, u64>,
    sent_rules: u64,
}

#[derive(Default)]
struct Pending {
    /// Sums per zone name.
    zones: HashMap<String, Sums>,
    reported: HashSet<u64>,
}

struct Peer {
    last_heard: Instant,
    sums: BTreeMap<u64, Sums>,
}

impl Region {
    fn new(region: &str, rules: Arc<RulesSnapshot>) -> Self {
        let interval = Interval::new(rules.config.control.report_interval);
        Self {
            region: region.to_owned(),
            state: Mutex::new(RegionState {
                rules,
                zones: HashMap::new(),
                pending: BTreeMap::new(),
                closed_through: interval.sequence_at(now_ms()).saturating_sub(1),
                awaiting: BTreeMap::new(),
                peers: HashMap::new(),
                peer_txs: HashMap::new(),
                smoothers: HashMap::new(),
                view: HashMap::new(),
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
        if report.interval_ms != interval.ms() || report.sequence <= state.closed_through {
            return;
        }
        let pending = state.pending.entry(report.sequence).or_default();
        pending
            .zones
            .entry(report.zone)
            .or_default()
            .add_wire(&report.buckets);
        pending.reported.insert(conn);
        self.poll(&mut state, now_ms());
    }

    fn on_peer_sums(&self, sums: v1::RegionSums) {
        if sums.region == self.region || sums.region.is_empty() {
            return;
        }
        let mut state = self.lock();
        let interval = Interval::new(state.rules.config.control.report_interval);
        let ttl = state.rules.config.control.instruction_ttl;
        let keep = (ttl.as_millis() as u64 / interval.ms()).max(1) + 2;
        let peer = state.peers.entry(sums.region).or_insert_with(|| Peer {
            last_heard: Instant::now(),
            sums: BTreeMap::new(),
        });
        peer.last_heard = Instant::now();
        if sums.interval_ms == interval.ms() {
            peer.sums
                .insert(sums.sequence, Sums::from_wire(&sums.buckets));
            while peer.sums.len() as u64 > keep {
                peer.sums.pop_first();
            }
        }
        self.poll(&mut state, now_ms());
    }

    /// Moves intervals along: closes the region's intervals that are complete or overdue (and
    /// sends their global sums to the peers), then computes and pushes those whose peers' sums
    /// are all in or whose deadline passed.
    fn poll(&self, state: &mut RegionState, now: u64) {
        let interval = Interval::new(state.rules.config.control.report_interval);
        let grace = interval.grace_ms();
        let ended = interval
            .sequence_at(now.saturating_sub(grace))
            .saturating_sub(1);
        if ended > state.closed_through && !state.pending.contains_key(&ended) {
            state.pending.insert(ended, Pending::default());
        }
        while let Some((&sequence, pending)) = state.pending.first_key_value() {
            let complete =
                !state.zones.is_empty() && state.zones.keys().all(|c| pending.reported.contains(c));
            // Aggregators wait up to one grace for their clients: wait up to two for them.
            let overdue = now >= interval.end_of(sequence) + 2 * grace;
            if !(complete || overdue) {
                break;
            }
            let Some((sequence, pending)) = state.pending.pop_first() else {
                break;
            };
            state.closed_through = sequence;
            self.announce(state, sequence, interval, &pending.zones);
            state.awaiting.insert(
                sequence,
                (pending.zones, interval.end_of(sequence) + 3 * grace),
            );
        }
        let ttl = state.rules.config.control.instruction_ttl;
        while let Some((&sequence, &(_, deadline))) = state.awaiting.first_key_value() {
            let all_in = state
                .peers
                .values()
                .filter(|p| p.last_heard.elapsed() < ttl)
                .all(|p| p.sums.contains_key(&sequence));
            if !(all_in || now >= deadline) {
                break;
            }
            let Some((sequence, (zones, _))) = state.awaiting.pop_first() else {
                break;
            };
            self.compute(state, sequence, interval, &zones, now);
        }
    }

    /// Sends this region's sums of its global buckets for `sequence` to every peer.
    fn announce(
        &self,
        state: &mut RegionState,
        sequence: u64,
        interval: Interval,
        zones: &HashMap<String, Sums>,
    ) {
        let mut region = Sums::default();
        for sums in zones.values() {
            region.add(sums);
        }
        let global: HashSet<BucketKey> = state
            .rules
            .config
            .buckets()
            .filter(|(_, b)| b.scope == Scope::Global)
            .map(|(s, b)| BucketKey::new(&s.name, &b.name))
            .collect();
        region.0.retain(|k, _| global.contains(k));
        let message = v1::RegionSums {
            region: self.region.clone(),
            sequence,
            interval_ms: interval.ms(),
            buckets: region.to_wire(),
        };
        for tx in state.peer_txs.values() {
            let _ = tx.try_send(Ok(message.clone()));
        }
    }

    fn compute(
        &self,
        state: &mut RegionState,
        sequence: u64,
        interval: Interval,
        zones: &HashMap<String, Sums>,
        now: u64,
    ) {
        let secs = interval.secs();
        let ttl = state.rules.config.control.instruction_ttl;
        let rules = state.rules.clone();
        // Every connected zone gets instructions, even one that reported nothing this time.
        let mut zone_sums: HashMap<String, Sums> = zones.clone();
        for z in state.zones.values().filter(|z| !z.zone.is_empty()) {
            zone_sums.entry(z.zone.clone()).or_default();
        }
        let mut region = Sums::default();
        for sums in zone_sums.values() {
            region.add(sums);
        }
        let mut peers = Sums::default();
        for peer in state.peers.values() {
            if peer.last_heard.elapsed() >= ttl {
                continue;
            }
            // This interval's sums, or the latest before it when the peer was late.
            if let Some((_, sums)) = peer.sums.range(..=sequence).next_back() {
                peers.add(sums);
            }
        }
        let mut per_zone: HashMap<String, Vec<v1::BucketInstruction>> = HashMap::new();
        let mut view = HashMap::new();
        let mut live_keys = HashSet::new();
        for (service, bucket) in rules.config.buckets() {
            if !matches!(
                bucket.algorithm,
                Kind::DropRatio | Kind::AdaptiveTokenBucket
            ) {
                continue;
            }
            let key = BucketKey::new(&service.name, &bucket.name);
            let limit = bucket.limit.per_second();
            let adaptive = bucket.algorithm == Kind::AdaptiveTokenBucket;
            let mut instruction = |zone: &str, ratio: f64, share: f64, scope_offered: f64| {
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
                    });
            };
            let mut smoother = |zone: Option<&str>, target: f64| {
                live_keys.insert((key.clone(), zone.map(str::to_owned)));
                state
                    .smoothers
                    .entry((key.clone(), zone.map(str::to_owned)))
                    .or_default()
                    .update(target)
            };
            let zones_count = zone_sums.len().max(1) as f64;
            match bucket.scope {
                Scope::Zone => {
                    let mut observed = 0.0;
                    let mut highest: f64 = 0.0;
                    for (zone, sums) in &zone_sums {
                        let offered = sums.offered(&key) as f64 / secs;
                        let ratio = smoother(Some(zone), target_drop(limit, offered));
                        instruction(zone, ratio, 1.0, offered);
                        observed += offered;
                        highest = highest.max(ratio);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: observed,
                            drop_ratio: highest,
                        },
                    );
                }
                Scope::Region | Scope::Global => {
                    let mut scope = region.offered(&key) as f64 / secs;
                    if bucket.scope == Scope::Global {
                        scope += peers.offered(&key) as f64 / secs;
                    }
                    let ratio = smoother(None, target_drop(limit, scope));
                    for (zone, sums) in &zone_sums {
                        let share = if scope > 0.0 {
                            sums.offered(&key) as f64 / secs / scope
                        } else {
                            1.0 / zones_count
                        };
                        instruction(zone, ratio, share, scope);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: scope,
                            drop_ratio: ratio,
                        },
                    );
                }
            }
        }
        // Buckets that left the rules take their smoothing state with them.
        state.smoothers.retain(|k, _| live_keys.contains(k));
        state.view = view;
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
            state.pending.clear();
            state.awaiting.clear();
            state.closed_through = new.sequence_at(now_ms()).saturating_sub(1);
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
        for (key, view) in &state.view {
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
        peers.set(
            i64::try_from(
                state
                    .peers
                    .values()
                    .filter(|p| p.last_heard.elapsed() < ttl)
                    .count(),
            )
            .unwrap_or(i64::MAX),
        );
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

    fn json(&self, path: &str) -> Option<String> {
        if path != "/v1/hosts" {
            return None;
        }
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
        Some(
            serde_json::json!({
                "region": self.region,
                "rules_version": version,
                "converged": converged,
                "hosts": map,
            })
            .to_string(),
        )
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
