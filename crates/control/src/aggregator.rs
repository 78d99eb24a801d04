//! The zone aggregator (G6): sums its clients' reports per bucket and interval, forwards each
//! interval to the region's controller as soon as it is complete, and relays instructions and
//! rules back down to its clients.
//!
//! An interval is complete when every connected client has reported it, or a grace of a quarter
//! interval after its end has passed: with 1 s reports and one silent client, the zone's sums
//! still leave at 250 ms past the second, and with all clients healthy they leave the moment the
//! last report arrives, so the loop's delay is the network's, not a sum of timers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spillway_core::algo::Ratio;
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tonic::{Request, Response, Status, Streaming};

use crate::admin::{self, AdminView};
use crate::error::ControlError;
use crate::net::{self, Stop, sleep_or_stop};
use crate::sums::{BucketKey, Intervals, Sums};
use crate::timing::{Backoff, Interval, now_ms};

/// Where an aggregator listens, and whom it reports to.
#[derive(Debug, Clone)]
pub struct AggregatorOptions {
    pub listen: SocketAddr,
    pub region: String,
    pub zone: String,
    /// The region's controller, for example `http://127.0.0.1:7001`.
    pub controller: String,
    pub admin: Option<SocketAddr>,
    pub backoff: Backoff,
}

impl AggregatorOptions {
    pub fn new(
        listen: SocketAddr,
        region: impl Into<String>,
        zone: impl Into<String>,
        controller: impl Into<String>,
    ) -> Self {
        Self {
            listen,
            region: region.into(),
            zone: zone.into(),
            controller: controller.into(),
            admin: None,
            backoff: Backoff::default(),
        }
    }
}

/// A running aggregator.
pub struct Aggregator {
    zone: Arc<Zone>,
    addr: SocketAddr,
    admin: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator")
            .field("addr", &self.addr)
            .field("zone", &self.zone.zone)
            .finish_non_exhaustive()
    }
}

impl Aggregator {
    /// Binds the listeners and starts serving and reporting.
    pub async fn start(options: AggregatorOptions) -> Result<Self, ControlError> {
        let endpoint = net::endpoint(&options.controller)?;
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
        let zone = Arc::new(Zone::new(&options));
        let mut tasks = Vec::new();
        let admin =
            admin::start_if(options.admin, zone.clone(), stop_rx.clone(), &mut tasks).await?;
        let service = v1::aggregator_server::AggregatorServer::new(Service {
            zone: zone.clone(),
            stop: stop_rx.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
        tasks.push(net::serve(
            tonic::transport::Server::builder().add_service(service),
            listener,
            stop_rx.clone(),
            "aggregator",
        ));
        tasks.push(tokio::spawn(upstream(
            zone.clone(),
            endpoint,
            options.backoff.clone(),
            stop_rx.clone(),
        )));
        tasks.push(tokio::spawn(ticker(zone.clone(), stop_rx)));
        tracing::info!(%addr, zone = %options.zone, region = %options.region, controller = %options.controller, "aggregator started");
        Ok(Self {
            zone,
            addr,
            admin,
            stop,
            tasks,
        })
    }

    /// Where clients connect.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the admin listener is, if any.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// True while the stream to the controller is open.
    pub fn connected(&self) -> bool {
        self.zone.connected.load(Ordering::Relaxed)
    }

    /// Clients with an open stream.
    pub fn clients(&self) -> usize {
        self.zone.lock().clients.len()
    }

    /// Stops accepting, ends every stream and waits (at most 5 s) for the tasks.
    pub async fn shutdown(self) {
        net::stop_and_join(&self.stop, self.tasks).await;
    }
}

/// The aggregator's shared state.
struct Zone {
    region: String,
    zone: String,
    state: Mutex<ZoneState>,
    connected: AtomicBool,
    next_conn: AtomicU64,
    late_reports: AtomicU64,
    forwarded: AtomicU64,
}

struct ZoneState {
    /// The controller's interval once it spoke; before that, the clients'.
    interval: Interval,
    interval_from_controller: bool,
    clients: HashMap<String, ClientEntry>,
    /// The zone's sums of the intervals still open, by reporting host.
    window: Intervals<String, Sums>,
    upstream: Option<Upstream>,
    rules: Option<v1::Rules>,
    /// The zone's sums of the last closed interval, to split shares among hosts.
    last_sums: Sums,
}

struct ClientEntry {
    conn: u64,
    rules_version: u64,
    tx: mpsc::Sender<Result<v1::Instructions, Status>>,
    /// This host's counts in its latest report.
    last: Sums,
    /// The rules version last sent on this stream.
    sent_rules: u64,
}

struct Upstream {
    tx: mpsc::Sender<v1::ZoneReport>,
    /// Hosts and versions the controller knows from this stream.
    sent_hosts: HashMap<String, u64>,
}

impl Zone {
    fn new(options: &AggregatorOptions) -> Self {
        let interval = Interval::new(Duration::from_secs(1));
        Self {
            region: options.region.clone(),
            zone: options.zone.clone(),
            state: Mutex::new(ZoneState {
                interval,
                interval_from_controller: false,
                clients: HashMap::new(),
                window: Intervals::new(interval.sequence_at(now_ms()).saturating_sub(1)),
                upstream: None,
                rules: None,
                last_sums: Sums::default(),
            }),
            connected: AtomicBool::new(false),
            next_conn: AtomicU64::new(1),
            late_reports: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ZoneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn on_report(
        &self,
        conn: u64,
        report: v1::Report,
        tx: &mpsc::Sender<Result<v1::Instructions, Status>>,
    ) {
        let mut state = self.lock();
        if !state.interval_from_controller && report.interval_ms > 0 {
            let interval = Interval::from_ms(report.interval_ms);
            if interval != state.interval {
                state.interval = interval;
                state
                    .window
                    .reset(interval.sequence_at(now_ms()).saturating_sub(1));
            }
        }
        let sums = Sums::from_wire(&report.buckets);
        let entry = state
            .clients
            .entry(report.host_id.clone())
            .or_insert_with(|| ClientEntry {
                conn,
                rules_version: report.rules_version,
                tx: tx.clone(),
                last: Sums::default(),
                sent_rules: 0,
            });
        if entry.conn != conn {
            // The host reconnected before its old stream ended: the new stream wins.
            entry.conn = conn;
            entry.tx = tx.clone();
            entry.sent_rules = 0;
        }
        entry.rules_version = report.rules_version;
        entry.last = sums.clone();
        let needs_rules = state
            .rules
            .as_ref()
            .is_some_and(|r| r.version != report.rules_version);
        if needs_rules {
            // A host that joins between two instruction sets gets the rules at once.
            self.send_rules(&mut state, &report.host_id);
        }
        let accepted = report.interval_ms == state.interval.ms()
            && state
                .window
                .accept(report.sequence, report.host_id)
                .map(|pending| pending.add(&sums))
                .is_some();
        if !accepted {
            self.late_reports.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.close_ready(&mut state, now_ms());
    }

    fn send_rules(&self, state: &mut ZoneState, host: &str) {
        let Some(rules) = state.rules.clone() else {
            return;
        };
        let Some(client) = state.clients.get_mut(host) else {
            return;
        };
        if client.sent_rules == rules.version {
            return;
        }
        let message = v1::Instructions {
            rules_version: rules.version,
            rules: Some(rules.clone()),
            interval_ms: state.interval.ms(),
            ..Default::default()
        };
        if client.tx.try_send(Ok(message)).is_ok() {
            client.sent_rules = rules.version;
        }
    }

    fn remove(&self, host: &str, conn: u64) {
        let mut state = self.lock();
        if state.clients.get(host).is_some_and(|c| c.conn == conn) {
            state.clients.remove(host);
            // The interval no longer waits for this host.
            self.close_ready(&mut state, now_ms());
        }
    }

    /// Closes, in order, every interval that every client reported or whose grace passed, and
    /// forwards each; an interval with no report at all is still forwarded, so the controller
    /// keeps answering.
    fn close_ready(&self, state: &mut ZoneState, now: u64) {
        let interval = state.interval;
        let ZoneState {
            window, clients, ..
        } = &mut *state;
        let closed = window.close_ready(now, interval, interval.grace_ms(), clients.keys());
        for (sequence, sums, reported) in closed {
            self.forward(state, sequence, sums, reported);
        }
    }

    fn forward(&self, state: &mut ZoneState, sequence: u64, sums: Sums, reported: usize) {
        let report = v1::ZoneReport {
            zone: self.zone.clone(),
            region: self.region.clone(),
            sequence,
            interval_ms: state.interval.ms(),
            buckets: sums.to_wire(),
            clients: u32::try_from(reported).unwrap_or(u32::MAX),
            hosts: Vec::new(),
            gone: Vec::new(),
        };
        state.last_sums = sums;
        let ZoneState {
            clients, upstream, ..
        } = state;
        let Some(upstream) = upstream else {
            return;
        };
        let mut report = report;
        for (host, client) in clients.iter() {
            if upstream.sent_hosts.get(host) != Some(&client.rules_version) {
                report.hosts.push(v1::HostStatus {
                    host_id: host.clone(),
                    rules_version: client.rules_version,
                });
            }
        }
        let gone: Vec<String> = upstream
            .sent_hosts
            .keys()
            .filter(|h| !clients.contains_key(*h))
            .cloned()
            .collect();
        report.gone = gone;
        let hosts = report.hosts.clone();
        let gone = report.gone.clone();
        if upstream.tx.try_send(report).is_ok() {
            for h in hosts {
                upstream.sent_hosts.insert(h.host_id, h.rules_version);
            }
            for h in gone {
                upstream.sent_hosts.remove(&h);
            }
            self.forwarded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Relays the controller's instructions to every client, with each host's share of the
    /// zone's share for adaptive token buckets, and the rules to hosts that run another version.
    fn relay(&self, zone_instructions: v1::ZoneInstructions) {
        let Some(instructions) = zone_instructions.instructions else {
            return;
        };
        let mut state = self.lock();
        if instructions.interval_ms > 0 {
            let interval = Interval::from_ms(instructions.interval_ms);
            if interval != state.interval {
                state.interval = interval;
                state
                    .window
                    .reset(interval.sequence_at(now_ms()).saturating_sub(1));
            }
            state.interval_from_controller = true;
        }
        if let Some(rules) = &instructions.rules {
            state.rules = Some(rules.clone());
        }
        let ZoneState {
            clients,
            rules,
            last_sums,
            ..
        } = &mut *state;
        let hosts = clients.len();
        for client in clients.values_mut() {
            let mut message = instructions.clone();
            message.rules = None;
            host_shares(&mut message.buckets, last_sums, &client.last, hosts);
            if let Some(rules) = rules
                && client.rules_version != rules.version
                && client.sent_rules != rules.version
            {
                message.rules = Some(rules.clone());
            }
            let sent_rules = message.rules.as_ref().map(|r| r.version);
            // A client too slow to take one message per interval misses this one; its
            // instructions expire if it keeps missing them.
            if client.tx.try_send(Ok(message)).is_ok()
                && let Some(version) = sent_rules
            {
                client.sent_rules = version;
            }
        }
    }
}

/// Splits the zone's adaptive-token-bucket shares among its hosts, in place: each host gets the
/// zone's share times its part of the zone's offered load in the last closed interval (an equal
/// part of `hosts` when the zone offered nothing). Drop ratios pass through unchanged.
///
/// A zone holding 0.5 of a global bucket, whose 400 req/s came 300 from host A and 100 from host
/// B, gives A a share of 0.375 and B 0.125.
pub fn host_shares(
    buckets: &mut [v1::BucketInstruction],
    zone_last: &Sums,
    host_last: &Sums,
    hosts: usize,
) {
    let hosts = hosts.max(1) as f64;
    for b in buckets {
        if let Some(zone_share) = b.share {
            let key = BucketKey::new(&b.service, &b.bucket);
            let zone_share = Ratio::from_raw(zone_share).as_f64();
            let zone_offered = zone_last.offered(&key) as f64;
            let share = if zone_offered > 0.0 {
                zone_share * host_last.offered(&key) as f64 / zone_offered
            } else {
                zone_share / hosts
            };
            b.share = Some(Ratio::from_f64(share).raw());
        }
    }
}

impl AdminView for Zone {
    fn ready(&self) -> Result<String, String> {
        if self.connected.load(Ordering::Relaxed) {
            Ok(format!("zone {} linked to its controller", self.zone))
        } else {
            Err("no stream to the controller".into())
        }
    }

    fn metrics(&self) -> String {
        let state = self.lock();
        let mut registry = Registry::default();
        let connected = Gauge::<i64>::default();
        connected.set(i64::from(self.connected.load(Ordering::Relaxed)));
        registry.register(
            "spillway_control_plane_connected",
            "1 while the stream to the region's controller is open",
            connected,
        );
        let clients = Gauge::<i64>::default();
        clients.set(i64::try_from(state.clients.len()).unwrap_or(i64::MAX));
        registry.register(
            "spillway_aggregator_clients",
            "Clients with an open stream",
            clients,
        );
        let version = Gauge::<i64>::default();
        version.set(
            state
                .rules
                .as_ref()
                .map_or(0, |r| i64::try_from(r.version).unwrap_or(i64::MAX)),
        );
        registry.register(
            "spillway_rules_version",
            "Version of the rules the controller sends down",
            version,
        );
        let late = Counter::<u64>::default();
        late.inc_by(self.late_reports.load(Ordering::Relaxed));
        registry.register(
            "spillway_aggregator_late_reports",
            "Reports that arrived after their interval was forwarded",
            late,
        );
        let forwarded = Counter::<u64>::default();
        forwarded.inc_by(self.forwarded.load(Ordering::Relaxed));
        registry.register(
            "spillway_aggregator_intervals_forwarded",
            "Zone sums sent to the controller",
            forwarded,
        );
        drop(state);
        let mut out = String::new();
        let _ = encode(&mut out, &registry);
        out
    }
}

struct Service {
    zone: Arc<Zone>,
    stop: Stop,
}

#[tonic::async_trait]
impl v1::aggregator_server::Aggregator for Service {
    type LinkStream = ReceiverStream<Result<v1::Instructions, Status>>;

    async fn link(
        &self,
        request: Request<Streaming<v1::Report>>,
    ) -> Result<Response<Self::LinkStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let zone = self.zone.clone();
        let mut stop = self.stop.clone();
        let conn = zone.next_conn.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut host: Option<String> = None;
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(report)) => {
                            if host.as_deref() != Some(report.host_id.as_str()) {
                                if let Some(old) = host.take() {
                                    zone.remove(&old, conn);
                                }
                                host = Some(report.host_id.clone());
                            }
                            zone.on_report(conn, report, &tx);
                        }
                        _ => break,
                    },
                    _ = stop.changed() => break,
                }
            }
            if let Some(host) = host {
                zone.remove(&host, conn);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Closes overdue intervals between reports, about ten times per interval.
async fn ticker(zone: Arc<Zone>, mut stop: Stop) {
    loop {
        let period = {
            let mut state = zone.lock();
            zone.close_ready(&mut state, now_ms());
            Duration::from_millis((state.interval.ms() / 10).clamp(2, 50))
        };
        if sleep_or_stop(period, &mut stop).await {
            return;
        }
    }
}

/// The stream to the controller, reopened with backoff whenever it breaks.
async fn upstream(zone: Arc<Zone>, endpoint: Endpoint, mut backoff: Backoff, mut stop: Stop) {
    loop {
        if net::stopped(&stop) {
            return;
        }
        let result = upstream_session(&zone, &endpoint, &mut backoff, &mut stop).await;
        zone.lock().upstream = None;
        zone.connected.store(false, Ordering::Relaxed);
        match result {
            Ok(()) => return,
            Err(reason) => tracing::warn!(zone = %zone.zone, "controller link down: {reason}"),
        }
        if sleep_or_stop(backoff.next_delay(), &mut stop).await {
            return;
        }
    }
}

async fn upstream_session(
    zone: &Zone,
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
    let (tx, rx) = mpsc::channel(16);
    let mut inbound = client
        .link_zone(ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("the controller refused the stream: {}", s.message()))?
        .into_inner();
    zone.lock().upstream = Some(Upstream {
        tx,
        sent_hosts: HashMap::new(),
    });
    zone.connected.store(true, Ordering::Relaxed);
    backoff.reset();
    tracing::info!(zone = %zone.zone, "controller link up");
    loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(instructions)) => zone.relay(instructions),
                Ok(None) => return Err("the controller ended the stream".into()),
                Err(status) => return Err(format!("stream error: {}", status.message())),
            },
            _ = stop.changed() => return Ok(()),
        }
    }
}
