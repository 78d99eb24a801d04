//! The regional controller (G7): a thin driver of `spillway_loop::RegionCore` over real streams.
//! Aggregators stream their zones' sums in ([`service`]), peer controllers exchange the sums of
//! global buckets ([`peers`]), and the core's instructions go back down to every aggregator with
//! the rules when they changed. What it computed shows on its admin listener ([`admin`]).
//!
//! Worked example: a global limit of 1,000/s, region A offering 900/s and region B 600/s: both
//! controllers see 1,500/s and send a drop ratio of 1/3, so A admits 600/s and B 400/s.

mod admin;
mod peers;
mod service;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use spillway_link::{Backoff, Target, now_ms};
use spillway_loop::{BucketKey, BucketView, HostView, RegionCore, RegionStep, RulesSnapshot};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use spillway_tls::{Expect, Role, TlsSource};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::Status;

use crate::error::ControlError;
use crate::trust::{self, Trust};

/// Where a controller listens, its peers and its rules.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    pub listen: SocketAddr,
    pub region: String,
    /// The other regions' controllers, for example `http://10.1.0.5:7001`.
    pub peers: Vec<String>,
    pub admin: Option<SocketAddr>,
    /// How the admin listener is protected (TLS, token); the default leaves it open.
    pub admin_auth: spillway_net::admin::AdminAuth,
    pub backoff: Backoff,
    /// The rules in force; a new value is sent down at the next interval.
    pub rules: watch::Receiver<Arc<RulesSnapshot>>,
    /// Mutual TLS (SPEC §7): the listener then accepts only this region's aggregators and, as
    /// peers, other regions' controllers; the peers dialled (`https://`) must prove they are
    /// other regions' controllers.
    pub tls: Option<Arc<TlsSource>>,
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
            admin_auth: Default::default(),
            backoff: Backoff::default(),
            rules,
            tls: None,
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

impl Controller {
    /// Binds the listeners, dials the peers and starts computing.
    pub async fn start(options: ControllerOptions) -> Result<Self, ControlError> {
        if let Some(source) = &options.tls {
            trust::own_identity(
                source,
                |role| matches!(role, Role::Controller { region } if *region == options.region),
                &format!("the controller of region {}", options.region),
            )
            .map_err(ControlError::Identity)?;
        }
        let peers = options
            .peers
            .iter()
            .map(|url| {
                let tls =
                    options.tls.clone().map(|source| {
                        let region = options.region.clone();
                        let expect = Expect::new("another region's controller", move |identity| {
                            match &identity.role {
                                Role::Controller { region: r } if *r != region => Ok(()),
                                Role::Controller { .. } => {
                                    Err("a peer is of another region than this controller's".into())
                                }
                                _ => Err("peers are controllers".into()),
                            }
                        });
                        (source, expect)
                    });
                Target::new(url, tls)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (listener, addr) = spillway_net::bind(options.listen).await?;
        let (stop, stop_rx) = watch::channel(false);
        let region = Arc::new(Region::new(
            &options.region,
            options.rules.borrow().clone(),
            Arc::new(Trust::new(options.tls.clone(), "controller")),
        ));
        let mut tasks = Vec::new();
        let admin = spillway_net::admin::start_if(
            options.admin,
            options.admin_auth.clone(),
            region.clone(),
            stop_rx.clone(),
            &mut tasks,
        )
        .await?;
        let server = v1::controller_server::ControllerServer::new(service::Service {
            region: region.clone(),
            stop: stop_rx.clone(),
        })
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
        tasks.push(crate::serve::serve(
            tonic::transport::Server::builder().add_service(server),
            listener,
            region.trust.clone(),
            stop_rx.clone(),
            "controller",
        ));
        for target in peers {
            tasks.push(tokio::spawn(peers::run(
                region.clone(),
                target,
                options.backoff.clone(),
                stop_rx.clone(),
            )));
        }
        tasks.push(tokio::spawn(service::follow_rules(
            region.clone(),
            options.rules.clone(),
            stop_rx.clone(),
        )));
        tasks.push(tokio::spawn(service::ticker(region.clone(), stop_rx)));
        tracing::info!(%addr, region = %options.region, peers = options.peers.len(), tls = options.tls.is_some(), "controller started");
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
        self.region.lock().core.hosts()
    }

    /// Peer regions heard from within the TTL.
    pub fn live_peers(&self) -> Vec<String> {
        self.region.lock().core.live_peers(now_ms())
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

/// The controller's shared state: the core and the streams its steps go out on.
struct Region {
    region: String,
    state: Mutex<RegionState>,
    next_conn: AtomicU64,
    /// Who may stream here, and the refusals counted.
    trust: Arc<Trust>,
}

struct RegionState {
    core: RegionCore,
    /// Each aggregator's stream, by connection.
    zones: HashMap<u64, mpsc::Sender<Result<v1::ZoneInstructions, Status>>>,
    /// Each peer's stream, by connection (the ones it opened and the ones this side opened).
    peers: HashMap<u64, mpsc::Sender<Result<v1::RegionSums, Status>>>,
}

impl Region {
    fn new(region: &str, rules: Arc<RulesSnapshot>, trust: Arc<Trust>) -> Self {
        Self {
            region: region.to_owned(),
            state: Mutex::new(RegionState {
                core: RegionCore::new(region, rules, now_ms()),
                zones: HashMap::new(),
                peers: HashMap::new(),
            }),
            next_conn: AtomicU64::new(1),
            trust,
        }
    }

    fn lock(&self) -> MutexGuard<'_, RegionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RegionState {
    /// Sends what the core asks for. An aggregator or peer too slow to take one message per
    /// interval misses this one; the core sends the rules again to an aggregator that missed
    /// them.
    fn send(&mut self, steps: Vec<RegionStep>) {
        for step in steps {
            match step {
                RegionStep::Announce(sums) => {
                    for tx in self.peers.values() {
                        let _ = tx.try_send(Ok(sums.clone()));
                    }
                }
                RegionStep::Send {
                    member,
                    instructions,
                } => {
                    let carries_rules = instructions
                        .instructions
                        .as_ref()
                        .is_some_and(|i| i.rules.is_some());
                    let sent = self
                        .zones
                        .get(&member)
                        .is_some_and(|tx| tx.try_send(Ok(instructions)).is_ok());
                    if !sent && carries_rules {
                        self.core.send_failed(member);
                    }
                }
            }
        }
    }
}
