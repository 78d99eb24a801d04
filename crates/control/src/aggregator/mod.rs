//! The zone aggregator: a thin driver of `spillway_loop::ZoneCore` over real streams. Clients
//! stream reports in ([`service`]); the core sums them per bucket and interval and says when an
//! interval is complete; its sums go up to the region's controller ([`upstream`]) and the
//! controller's instructions come back down to every client.
//!
//! With 1 s reports and one silent client, the zone's sums still leave at 250 ms past the second,
//! and with all clients healthy they leave the moment the last report arrives, so the loop's
//! delay is the network's, not a sum of timers.

mod admin;
mod local;
mod service;
mod upstream;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use spillway_link::{Backoff, Target, now_ms};
use spillway_loop::{ZoneCore, ZoneStep};
use spillway_proto::codec::Encoded;
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use spillway_tls::{Expect, TlsSource, WorkloadRole};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::Status;

use crate::error::ControlError;
use crate::intervals::IntervalSpans;
use crate::listener::GrpcLimits;
use crate::trust::{self, Trust};

pub use local::{InstructionsRx, LocalClient, LocalClients};

/// Where an aggregator listens, and whom it reports to.
#[derive(Debug, Clone)]
pub struct AggregatorOptions {
    pub listen: SocketAddr,
    pub region: String,
    pub zone: String,
    /// The region's controller, for example `http://127.0.0.1:7001`.
    pub controller: String,
    /// The region's other controllers (its standbys, when the controllers hold a lease): the
    /// link tries each in turn when it loses one, and follows a standby's pointer to the
    /// leader, so no address needs to name the leader.
    pub standby_controllers: Vec<String>,
    pub admin: Option<SocketAddr>,
    /// How the admin listener is protected (TLS, token); the default leaves it open.
    pub admin_auth: spillway_net::admin::AdminAuth,
    pub backoff: Backoff,
    /// Mutual TLS: the listener then accepts only proxies of this region and zone,
    /// each under its certificate's host id, and the controller (`https://`) must prove it is
    /// this region's.
    pub tls: Option<Arc<TlsSource>>,
    /// The gRPC listener's bounds (connections, streams, deadlines, idle close).
    pub grpc: GrpcLimits,
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
            standby_controllers: Vec::new(),
            admin: None,
            admin_auth: Default::default(),
            backoff: Backoff::default(),
            tls: None,
            grpc: GrpcLimits::default(),
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
            .field("zone", &self.zone.lock().core.zone())
            .finish_non_exhaustive()
    }
}

impl Aggregator {
    /// Binds the listeners and starts serving and reporting.
    pub async fn start(options: AggregatorOptions) -> Result<Self, ControlError> {
        let tls = match &options.tls {
            None => None,
            Some(source) => {
                trust::own_identity(
                    source,
                    |role| {
                        matches!(role, WorkloadRole::Aggregator { region, zone }
                            if *region == options.region && *zone == options.zone)
                    },
                    &format!(
                        "the aggregator of region {}, zone {}",
                        options.region, options.zone
                    ),
                )
                .map_err(ControlError::Identity)?;
                let region = options.region.clone();
                let expect = Expect::new(
                    format!("the controller of region {region}"),
                    move |identity| match &identity.role {
                        WorkloadRole::Controller { region: r } if *r == region => Ok(()),
                        _ => {
                            Err("an aggregator reports only to its own region's controller".into())
                        }
                    },
                );
                Some((source.clone(), expect))
            }
        };
        let targets = std::iter::once(&options.controller)
            .chain(&options.standby_controllers)
            .map(|url| Target::new(url, tls.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        // A standby's pointer to its leader is dialled as the configured addresses are, and
        // must prove the same identity.
        let hinted = move |url: &str| Target::new(url, tls.clone()).ok();
        let (listener, addr) = spillway_net::bind(options.listen).await?;
        let (stop, stop_rx) = watch::channel(false);
        let zone = Arc::new(Zone::new(&options));
        let trust = zone.trust.clone();
        let mut tasks = Vec::new();
        let admin = spillway_net::admin::start_if(
            options.admin,
            options.admin_auth.clone(),
            zone.clone(),
            stop_rx.clone(),
            &mut tasks,
        )
        .await?;
        let server =
            spillway_proto::encoded::aggregator_server::AggregatorServer::new(service::Service {
                zone: zone.clone(),
                stop: stop_rx.clone(),
            })
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        tasks.push(crate::serve::serve(
            tonic::service::Routes::new(server),
            listener,
            trust,
            options.grpc,
            stop_rx.clone(),
            "aggregator",
        ));
        tasks.push(tokio::spawn(upstream::run(
            zone.clone(),
            targets,
            hinted,
            options.backoff.clone(),
            stop_rx.clone(),
        )));
        tasks.push(tokio::spawn(service::ticker(zone.clone(), stop_rx)));
        tracing::info!(%addr, zone = %options.zone, region = %options.region, controller = %options.controller, standbys = options.standby_controllers.len(), tls = options.tls.is_some(), "aggregator started");
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

    /// Attaches clients that live in this process (an RLQS stream's Envoy instance).
    pub fn local_clients(&self) -> LocalClients {
        LocalClients::new(self.zone.clone())
    }

    /// Clients with an open stream.
    pub fn clients(&self) -> usize {
        self.zone.lock().core.hosts()
    }

    /// Stops accepting, ends every stream and waits (at most 5 s) for the tasks.
    pub async fn shutdown(self) {
        self.shutdown_within(spillway_net::SHUTDOWN_GRACE).await;
    }

    /// Stops accepting, ends every stream (HTTP/2 GOAWAY, then the streams' end) and waits at
    /// most `grace` (`--drain-timeout`) for the tasks, aborting what still runs then.
    pub async fn shutdown_within(self, grace: std::time::Duration) {
        spillway_net::stop_and_join_within(&self.stop, self.tasks, grace).await;
    }
}

/// The aggregator's shared state: the core and the streams its steps go out on.
struct Zone {
    state: Mutex<ZoneState>,
    connected: AtomicBool,
    next_conn: AtomicU64,
    /// In-process clients attached now ([`LocalClients`]: Envoy instances on RLQS).
    local: AtomicU64,
    /// Who may report here, and the refusals counted.
    trust: Arc<Trust>,
    /// Where this aggregator is: its region and zone.
    region: String,
    zone: String,
}

struct ZoneState {
    core: ZoneCore,
    /// Each client's stream, by host. Looked up on every report, so hashed with foldhash
    /// rather than SipHash: its keys are the host ids of this zone's own clients.
    clients: HashMap<String, Outlet, foldhash::fast::RandomState>,
    /// The stream to the controller, while open.
    upstream: Option<mpsc::Sender<v1::ZoneReport>>,
    /// Each interval's span, from its first host report until the zone's sums go up.
    spans: IntervalSpans,
}

impl Zone {
    fn new(options: &AggregatorOptions) -> Self {
        Self {
            state: Mutex::new(ZoneState {
                core: {
                    let mut core = ZoneCore::new(&options.region, &options.zone, now_ms());
                    // The stream to the controller delivers every message in order.
                    core.number_buckets();
                    core
                },
                clients: HashMap::default(),
                upstream: None,
                spans: IntervalSpans::aggregator(&options.region, &options.zone),
            }),
            connected: AtomicBool::new(false),
            next_conn: AtomicU64::new(1),
            local: AtomicU64::new(0),
            trust: Arc::new(Trust::new(options.tls.clone(), "aggregator")),
            region: options.region.clone(),
            zone: options.zone.clone(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ZoneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a client's instructions go.
#[derive(Clone)]
enum Outlet {
    /// A linked host's stream ([`service`]), its instructions encoded: the zone's own are
    /// encoded once for every host that gets them ([`ZoneState::relay`]). A channel allocates its
    /// slots 32 at a time when it is made, held for as long as the host stays linked: an
    /// `Encoded` is one pointer (512 bytes a channel), where an `Instructions` is 136 bytes
    /// (4 KiB).
    Stream(mpsc::Sender<Result<Encoded, Status>>),
    /// An in-process client ([`LocalClients`]), a few a process.
    Local(mpsc::Sender<Result<v1::Instructions, Status>>),
}

impl Outlet {
    /// Whether `other` is this very stream.
    fn same(&self, other: &Outlet) -> bool {
        match (self, other) {
            (Outlet::Stream(a), Outlet::Stream(b)) => a.same_channel(b),
            (Outlet::Local(a), Outlet::Local(b)) => a.same_channel(b),
            _ => false,
        }
    }

    /// Hands `instructions` to the client's stream unless it is full or closed.
    fn try_send(&self, instructions: v1::Instructions) -> bool {
        match self {
            Outlet::Stream(tx) => tx.try_send(Ok(Encoded::of(&instructions))).is_ok(),
            Outlet::Local(tx) => tx.try_send(Ok(instructions)).is_ok(),
        }
    }
}

impl ZoneState {
    /// `outlet` is where `host`'s instructions go from now on: the stream it reported on last.
    /// A host reports on the same stream interval after interval, so the entry is written only
    /// when the stream changed, without a copy of the host id for every report.
    fn attach(&mut self, host: &str, outlet: &Outlet) {
        match self.clients.get_mut(host) {
            Some(current) if current.same(outlet) => {}
            Some(current) => *current = outlet.clone(),
            None => {
                self.clients.insert(host.to_owned(), outlet.clone());
            }
        }
    }

    /// `host`'s stream `outlet` ended: it no longer takes the host's instructions, unless a
    /// newer stream of the host already does.
    fn detach(&mut self, host: &str, outlet: &Outlet) {
        if self.clients.get(host).is_some_and(|t| t.same(outlet)) {
            self.clients.remove(host);
        }
    }

    /// Sends what the core asks for. A client too slow to take one message per interval misses
    /// this one (its instructions expire if it keeps missing them); the core sends the rules
    /// again to a client that missed them, and the hosts list to a controller that missed it.
    fn send(&mut self, steps: Vec<ZoneStep>) {
        self.warn_clamps();
        // The interval the instructions of these steps belong to: (sequence, hosts, buckets,
        // hosts that missed them).
        let mut instructed: Option<(u64, u64, u64, u64)> = None;
        for step in steps {
            match step {
                ZoneStep::Forward(report) => {
                    let Some(tx) = &self.upstream else { continue };
                    let (sequence, buckets) = (report.sequence, report.buckets.len() as u64);
                    let unsent = match tx.try_send(report) {
                        Ok(()) => 0,
                        Err(err) => {
                            self.core.forward_failed(&err.into_inner());
                            1
                        }
                    };
                    self.spans.on_left(sequence, 1, buckets, unsent);
                }
                ZoneStep::Send { host, instructions } => {
                    let carries_rules = instructions.rules.is_some();
                    let (sequence, buckets) =
                        (instructions.sequence, instructions.buckets.len() as u64);
                    let sent = self
                        .clients
                        .get(&host)
                        .is_some_and(|outlet| outlet.try_send(instructions));
                    if !sent && carries_rules {
                        self.core.send_failed(&host);
                    }
                    let at = instructed.get_or_insert((sequence, 0, 0, 0));
                    at.1 += 1;
                    at.2 = at.2.max(buckets);
                    at.3 += u64::from(!sent);
                }
            }
        }
        // Without a controller the zone computes its own instructions: the interval leaves
        // when they go to the hosts.
        if self.upstream.is_none()
            && let Some((sequence, hosts, buckets, unsent)) = instructed
        {
            self.spans.on_left(sequence, hosts, buckets, unsent);
        }
    }

    /// The controller's instructions at `now_ms`, relayed to every client
    /// ([`ZoneCore::on_instructions_with`]). The hosts whose instructions are the zone's own
    /// (no share, hold or rules of their own: every host of a zone of drop ratios) share one
    /// message, encoded once here for all their streams; a host's own message is encoded for it.
    /// A client too slow to take one message per interval misses this one, as in
    /// [`ZoneState::send`].
    fn relay(&mut self, now_ms: u64, instructions: v1::ZoneInstructions) {
        let ZoneState { core, clients, .. } = self;
        // The shared message and its encoding. The core hands the same `Arc` to every host that
        // shares it, and a host's own message in an `Arc` of its own, held nowhere else.
        let mut shared: Option<(Arc<v1::Instructions>, Encoded)> = None;
        let mut rules_unsent = Vec::new();
        core.on_instructions_with(now_ms, instructions, |host, message| {
            let sent = match clients.get(host) {
                None => false,
                Some(Outlet::Local(tx)) => {
                    tx.try_send(Ok(v1::Instructions::clone(&message))).is_ok()
                }
                Some(Outlet::Stream(tx)) => {
                    let encoded = match &shared {
                        Some((held, encoded)) if Arc::ptr_eq(held, &message) => encoded.clone(),
                        _ => {
                            let encoded = Encoded::of(&*message);
                            if Arc::strong_count(&message) > 1 {
                                shared = Some((message.clone(), encoded.clone()));
                            }
                            encoded
                        }
                    };
                    tx.try_send(Ok(encoded)).is_ok()
                }
            };
            if !sent && message.rules.is_some() {
                rules_unsent.push(host.to_owned());
            }
        });
        for host in rules_unsent {
            self.core.send_failed(&host);
        }
    }

    /// Logs the core's clamps: at most one line per host per ten seconds
    /// (`spillway_loop::NOTICE_EVERY_MS`), each clamp counted on `/metrics` all the same.
    fn warn_clamps(&mut self) {
        for notice in self.core.take_notices() {
            let c = &notice.clamp;
            tracing::warn!(
                host = %c.host,
                service = %c.bucket.service,
                bucket = %c.bucket.bucket,
                reason = c.reason.label(),
                reported = c.reported,
                counted = c.counted,
                unlogged_since_last = notice.unlogged,
                "a client's report was implausible: its count was lowered before the zone's sums (spillway_control_plane_clamped_total)"
            );
        }
    }
}
