//! Envoy's Rate Limit Quota Service v3 (`StreamRateLimitQuotas`) on the aggregator: each RLQS
//! host is a host of the aggregator's zone ([`ZoneClients`]), whose usage
//! reports are offered load and whose assignments follow the bucket's drop ratio
//! ([`crate::quota`]).
//!
//! **One identity, one host.** A host is the authenticated peer, its client certificate's URI
//! SAN (its SPIFFE id) when the listener has TLS, or else the connection (its remote address and
//! port). Every stream of one host feeds one [`Instance`] and one client of the zone: one report
//! per interval sums them, and the zone's plausibility bound compares it with the other hosts as
//! one host. A client that opens 40 streams on one connection is one host offering their sum,
//! not 40 hosts vouching for each other. Streams per host are capped
//! ([`RlqsLimits::streams_per_host`]), and so are bucket ids per stream, per host and in total
//! ([`Caps`]); what a cap refuses ends in `RESOURCE_EXHAUSTED`, counted in
//! `spillway_control_plane_rejected_total{reason}` and logged at most once per interval per host.
//!
//! A host's state lives while it has a stream: its driver task reports for it once per interval
//! and fans the zone's instructions out to every stream; the last stream to close ends it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use spillway_core::clock::{Clock, SystemClock};
use spillway_link::{InstructionsRx, LocalRefusal, ZoneClient, ZoneClients, now_unix_ns};
use spillway_loop::{HostId, HostTime};
use spillway_tls::SanPolicy;
use spillway_tls::server::PeerInfo;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::peer::refusal;
use crate::quota::{Actions, BadUsage, Caps, Instance, response};

/// Envoy's generated RLQS messages and service (`envoy-types`).
pub mod pb {
    pub use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
    pub use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::{
        BucketAction, bucket_action,
    };
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
        RateLimitQuotaService, RateLimitQuotaServiceServer,
    };
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    };
}

/// The largest usage report a stream takes: 4 MiB, tonic's default, about 30,000 bucket ids.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// What one RLQS host may hold (`spillway aggregator --rlqs-max-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlqsLimits {
    /// Streams open at once per host: 16 (an Envoy opens one per filter and domain).
    pub streams_per_host: usize,
    /// Bucket ids per host, all its streams together: 10,000.
    pub buckets_per_host: usize,
    /// Bucket ids of every host of the aggregator together: 50,000.
    pub buckets: usize,
}

impl Default for RlqsLimits {
    fn default() -> Self {
        Self {
            streams_per_host: 16,
            buckets_per_host: crate::quota::MAX_BUCKETS,
            buckets: 50_000,
        }
    }
}

/// `RateLimitQuotaService` on a running aggregator's zone.
#[derive(Clone)]
pub struct Rlqs {
    clients: Arc<dyn ZoneClients>,
    allow: SanPolicy,
    clock: SystemClock,
    limits: RlqsLimits,
    caps: Caps,
    hosts: Arc<Mutex<HashMap<String, Arc<Host>>>>,
    next: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
    stopper: Arc<watch::Sender<bool>>,
    /// Gives freed memory back to the system, called a second after a host ends
    /// ([`Rlqs::with_release`]).
    release: Option<fn()>,
    releasing: Arc<std::sync::atomic::AtomicBool>,
}

/// How long after a host ends freed memory is given back: the hosts that end together (a client's
/// connections, a crowd of streams) are given back at once.
const RELEASE_AFTER: Duration = Duration::from_secs(1);

impl Rlqs {
    /// Hosts become hosts of the zone `clients` attach to.
    pub fn new(clients: impl ZoneClients) -> Self {
        let clients: Arc<dyn ZoneClients> = Arc::new(clients);
        let (stopper, stop) = watch::channel(false);
        let limits = RlqsLimits::default();
        Self {
            clients,
            allow: SanPolicy::default(),
            clock: SystemClock::new(),
            limits,
            caps: Caps::new(limits.buckets_per_host, limits.buckets),
            hosts: Arc::default(),
            next: Arc::new(AtomicU64::new(1)),
            stop,
            stopper: Arc::new(stopper),
            release: None,
            releasing: Arc::default(),
        }
    }

    /// `release` gives the memory the process freed back to the system (the allocator's
    /// `malloc_trim`): a second after a host ends, at most once a second. Without it the bucket
    /// ids and decoded reports of hosts gone stay in the allocator's free lists, counted in the
    /// process's RSS until it reuses them.
    pub fn with_release(mut self, release: fn()) -> Self {
        self.release = Some(release);
        self
    }

    /// Schedules [`Rlqs::with_release`]'s call, unless one is scheduled already.
    fn release_soon(&self) {
        let Some(release) = self.release else {
            return;
        };
        if self.releasing.swap(true, Ordering::Relaxed) {
            return;
        }
        let releasing = self.releasing.clone();
        tokio::spawn(async move {
            tokio::time::sleep(RELEASE_AFTER).await;
            releasing.store(false, Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(release).await;
        });
    }

    /// Streams only from clients whose certificate has a URI SAN that `allow` matches
    /// (`--allow-client-san`); others get `PERMISSION_DENIED`.
    pub fn with_allowed_sans(mut self, allow: SanPolicy) -> Self {
        self.allow = allow;
        self
    }

    /// The caps on streams and bucket ids (before any stream opens).
    pub fn with_limits(mut self, limits: RlqsLimits) -> Self {
        self.limits = limits;
        self.caps = Caps::new(limits.buckets_per_host, limits.buckets);
        self
    }

    /// What ends every open stream (for [`crate::serve_rlqs`]'s shutdown).
    pub(crate) fn stopper(&self) -> watch::Sender<bool> {
        (*self.stopper).clone()
    }

    fn now(&self) -> HostTime {
        HostTime {
            clock: self.clock.now(),
            unix_ns: now_unix_ns(),
        }
    }

    fn hosts(&self) -> MutexGuard<'_, HashMap<String, Arc<Host>>> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stream `n` joins the host `name`, which starts with it if it has no other stream; `None`
    /// when the host holds its most streams already.
    fn join(&self, name: &str, n: u64, tx: Tx) -> Option<Arc<Host>> {
        let mut hosts = self.hosts();
        let host = match hosts.get(name) {
            // A host whose zone let it go ends with its streams; a new stream starts it again.
            Some(host) if !*host.ended.borrow() => host.clone(),
            _ => {
                let host = Host::start(self, name);
                hosts.insert(name.to_owned(), host.clone());
                host
            }
        };
        let mut state = host.state();
        if state.streams.len() >= self.limits.streams_per_host {
            return None;
        }
        state.streams.insert(n, tx);
        state.instance.open_stream(n);
        drop(state);
        Some(host)
    }

    /// Stream `n` of `host` ended; the host ends with its last stream.
    fn leave(&self, host: &Arc<Host>, n: u64) {
        let mut hosts = self.hosts();
        let mut state = host.state();
        state.streams.remove(&n);
        state.instance.close_stream(self.now(), n);
        if state.streams.is_empty() {
            if hosts.get(&host.name).is_some_and(|h| Arc::ptr_eq(h, host)) {
                hosts.remove(&host.name);
                // A crowd of hosts came and went: give the map's memory back.
                if hosts.capacity() > 64 && hosts.len() < hosts.capacity() / 4 {
                    hosts.shrink_to_fit();
                }
            }
            host.ended.send_replace(true);
            drop(state);
            drop(hosts);
            self.release_soon();
        }
    }
}

/// Who a stream's host is: the client certificate's first URI SAN (its SPIFFE id) with TLS, else
/// the connection's remote address and port.
fn identity<T>(request: &Request<T>) -> String {
    if let Some(peer) = request.extensions().get::<PeerInfo>() {
        if let Some(uri) = peer.uris.first() {
            return uri.clone();
        }
        if let Some(addr) = peer.remote {
            return addr.to_string();
        }
    }
    match request.remote_addr() {
        Some(addr) => addr.to_string(),
        None => "an unknown peer".to_owned(),
    }
}

/// Logs at most once per interval per host: a refusal, with how many went unlogged since.
#[derive(Default)]
struct Quiet {
    logged_ms: AtomicU64,
    unlogged: AtomicU64,
}

impl Quiet {
    /// Whether to log now (`every_ms` since the last line), and how many were not logged since.
    fn due(&self, every_ms: u64) -> Option<u64> {
        let now = now_unix_ns() / 1_000_000;
        let last = self.logged_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= every_ms
            && self
                .logged_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.unlogged.swap(0, Ordering::Relaxed));
        }
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// One RLQS host: its instance, its streams, and what ends its driver.
struct Host {
    name: String,
    state: Mutex<HostState>,
    /// True once the host has ended (its last stream closed, or its zone let it go).
    ended: watch::Sender<bool>,
    quiet: Quiet,
}

struct HostState {
    instance: Instance,
    /// Each stream's outbound side.
    streams: HashMap<u64, Tx>,
}

impl Host {
    /// A host named `name` of `rlqs`'s zone, with its driver running.
    fn start(rlqs: &Rlqs, name: &str) -> Arc<Host> {
        let host_id = format!("envoy-{name}");
        let (client, instructions) = rlqs.clients.attach(host_id.clone());
        let id = HostId {
            host_id: host_id.clone(),
            region: rlqs.clients.region().to_owned(),
            zone: rlqs.clients.zone().to_owned(),
        };
        let instance = Instance::with_caps(
            id,
            rlqs.clients.rules().as_ref(),
            rlqs.now(),
            rlqs.caps.clone(),
        );
        let host = Arc::new(Host {
            name: name.to_owned(),
            state: Mutex::new(HostState {
                instance,
                streams: HashMap::new(),
            }),
            ended: watch::channel(false).0,
            quiet: Quiet::default(),
        });
        tracing::info!(host = %host_id, "RLQS host joined the zone");
        tokio::spawn(drive(rlqs.clone(), host.clone(), client, instructions));
        host
    }

    fn state(&self) -> MutexGuard<'_, HostState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs a refusal of this host at most once per report interval.
    fn refused(&self, what: &str) {
        let every = self.state().instance.interval().as_millis() as u64;
        if let Some(unlogged) = self.quiet.due(every.max(1_000)) {
            tracing::warn!(
                host = %self.name,
                unlogged,
                "RLQS refused: {what}"
            );
        }
    }
}

impl HostState {
    /// Each stream's response among `actions`, with where it goes.
    fn fan_out(&self, actions: Actions) -> Vec<(Tx, pb::RateLimitQuotaResponse)> {
        actions
            .into_iter()
            .filter_map(|(n, actions)| Some((self.streams.get(&n)?.clone(), response(actions)?)))
            .collect()
    }
}

/// Hands responses to their streams without waiting: a stream too slow to take them misses
/// these, and every assignment is sent again at the next interval.
fn deliver(out: Vec<(Tx, pb::RateLimitQuotaResponse)>) {
    for (tx, message) in out {
        let _ = tx.try_send(Ok(message));
    }
}

/// A host's driver: its report once per interval, and the zone's instructions to its streams.
async fn drive(
    rlqs: Rlqs,
    host: Arc<Host>,
    client: Box<dyn ZoneClient>,
    mut instructions: InstructionsRx,
) {
    let mut ended = host.ended.subscribe();
    let mut stop = rlqs.stop.clone();
    loop {
        let wait = host
            .state()
            .instance
            .deadline()
            .saturating_sub(now_unix_ns() / 1_000_000);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {
                let (report, out) = {
                    let mut state = host.state();
                    let (report, actions) = state.instance.on_deadline(rlqs.now());
                    (report, state.fan_out(actions))
                };
                if let Some(report) = report {
                    client.report(report);
                }
                deliver(out);
            }
            instructions = instructions.recv() => match instructions {
                Some(Ok(instructions)) => {
                    let out = {
                        let mut state = host.state();
                        let actions = state.instance.on_instructions(rlqs.now(), instructions);
                        state.fan_out(actions)
                    };
                    deliver(out);
                }
                _ => break,
            },
            _ = until_ended(&mut ended) => break,
            _ = stop.changed() => break,
        }
    }
    host.ended.send_replace(true);
    tracing::info!(host = %host.name, "RLQS host left the zone");
    drop(client);
}

/// Returns once the host has ended.
async fn until_ended(ended: &mut watch::Receiver<bool>) {
    let _ = ended.wait_for(|ended| *ended).await;
}

#[tonic::async_trait]
impl pb::RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<pb::RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<pb::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        if let Some(refused) = refusal(&self.allow, &request, "RLQS stream") {
            return Err(refused);
        }
        let name = identity(&request);
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        // Few responses wait per stream: each can hold an assignment for every bucket id (10,000
        // of 200 bytes are 4 MB), and every interval sends them all again.
        let (tx, rx) = mpsc::channel(2);
        let Some(host) = self.join(&name, n, tx.clone()) else {
            self.clients.refused(LocalRefusal::RlqsStreams);
            let max = self.limits.streams_per_host;
            if let Some(host) = self.hosts().get(&name).cloned() {
                host.refused(&format!(
                    "a stream beyond the {max} one host may hold open (--rlqs-max-streams-per-host)"
                ));
            }
            return Err(Status::resource_exhausted(format!(
                "this host ({name}) holds {max} RLQS streams open already, the most it may (--rlqs-max-streams-per-host)"
            )));
        };
        let inbound = request.into_inner();
        tokio::spawn(stream(self.clone(), host, n, inbound, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Tx = mpsc::Sender<Result<pb::RateLimitQuotaResponse, Status>>;

/// One stream of `host`, from its first report to its end.
async fn stream(
    rlqs: Rlqs,
    host: Arc<Host>,
    n: u64,
    mut inbound: Streaming<pb::RateLimitQuotaUsageReports>,
    tx: Tx,
) {
    let mut stop = rlqs.stop.clone();
    let mut ended = host.ended.subscribe();
    tracing::debug!(host = %host.name, stream = n, "RLQS stream opened");
    loop {
        let open = tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(reports)) => {
                    let result = host.state().instance.on_usage(n, rlqs.now(), &reports);
                    match result {
                        Ok(actions) => match response(actions) {
                            Some(message) => tx.send(Ok(message)).await.is_ok(),
                            None => true,
                        },
                        Err(bad) => {
                            let status = match bad {
                                BadUsage::TooManyBuckets { .. } => {
                                    rlqs.clients.refused(LocalRefusal::RlqsBuckets);
                                    host.refused(&bad.to_string());
                                    Status::resource_exhausted(bad.to_string())
                                }
                                _ => {
                                    tracing::debug!(host = %host.name, "RLQS usage report refused: {bad}");
                                    Status::invalid_argument(bad.to_string())
                                }
                            };
                            let _ = tx.send(Err(status)).await;
                            false
                        }
                    }
                }
                Ok(None) => false,
                Err(status) => {
                    tracing::debug!(host = %host.name, "RLQS stream failed: {status}");
                    false
                }
            },
            _ = until_ended(&mut ended) => false,
            _ = stop.changed() => false,
        };
        if !open {
            break;
        }
    }
    rlqs.leave(&host, n);
    tracing::debug!(host = %host.name, stream = n, "RLQS stream closed");
}
