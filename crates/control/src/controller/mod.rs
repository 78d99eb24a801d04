//! The regional controller: a thin driver of `spillway_loop::RegionCore` over real streams.
//! Aggregators stream their zones' sums in ([`service`]), peer controllers exchange the sums of
//! global buckets ([`peers`]), and the core's instructions go back down to every aggregator with
//! the rules when they changed. What it computed shows on its admin listener ([`admin`]), with
//! the few minutes of history and the zones' health its dashboard draws ([`record`]).
//!
//! Worked example: a global limit of 1,000/s, region A offering 900/s and region B 600/s: both
//! controllers see 1,500/s and send a drop ratio of 1/3, so A admits 600/s and B 400/s.

mod admin;
mod changes;
mod history;
mod peers;
mod record;
mod service;
mod zones;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use spillway_core::leadership::Leadership;
use spillway_link::{Backoff, LEADER_HINT, Target, now_ms};
use spillway_loop::{
    BucketKey, BucketView, HistoryBatch, HostView, Ledger, RegionCore, RegionStep, RulesSnapshot,
    SharedInstructions,
};
use spillway_proto::v1;
use spillway_tls::{Expect, TlsSource, WorkloadRole};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::Status;

pub use changes::RulesChange;

use crate::error::ControlError;
use crate::intervals::IntervalSpans;
use crate::listener::GrpcLimits;
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
    /// Mutual TLS: the listener then accepts only this region's aggregators and, as
    /// peers, other regions' controllers; the peers dialled (`https://`) must prove they are
    /// other regions' controllers.
    pub tls: Option<Arc<TlsSource>>,
    /// The gRPC listener's bounds (connections, streams, deadlines, idle close).
    pub grpc: GrpcLimits,
    /// The rules store's latest changes, newest first, when the rules come from one: shown on
    /// `/v1/rules/changes` and the dashboard.
    pub changes: Option<watch::Receiver<Arc<Vec<RulesChange>>>>,
    /// Where this region's traffic history goes, slot by slot, for the configurator.
    pub history: Option<HistorySink>,
    /// Whether this controller leads its region, from the controller lease
    /// (`spillway_db::lease::campaign`): a standby follows the rules and its peers' sums but
    /// refuses aggregators, pointing them to the leader, and sends nothing down. `None`: no
    /// lease, this controller always leads (at epoch 0).
    pub leadership: Option<watch::Receiver<Leadership>>,
}

/// Where a controller hands its region's closed history slots (the configurator's `builtin:` source) and
/// at what resolution: a bounded channel to a writer off the control loop. A full channel (a
/// writer stuck on its store) loses slots, never delays an interval.
#[derive(Debug, Clone)]
pub struct HistorySink {
    pub resolution: std::time::Duration,
    pub slots: mpsc::Sender<HistoryBatch>,
}

/// Slots the channel to the history writer holds: at a resolution of a second, a minute of a
/// writer that does not keep up.
pub const HISTORY_CHANNEL: usize = 64;

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
            grpc: GrpcLimits::default(),
            changes: None,
            history: None,
            leadership: None,
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
                |role| matches!(role, WorkloadRole::Controller { region } if *region == options.region),
                &format!("the controller of region {}", options.region),
            )
            .map_err(ControlError::Identity)?;
        }
        let peers = options
            .peers
            .iter()
            .map(|url| {
                // The region the dialled peer's certificate names, once a handshake proved it:
                // the only region whose sums it may send.
                let certified = Arc::new(std::sync::Mutex::new(None::<String>));
                let tls =
                    options.tls.clone().map(|source| {
                        let region = options.region.clone();
                        let certified = certified.clone();
                        let expect = Expect::new("another region's controller", move |identity| {
                            match &identity.role {
                                WorkloadRole::Controller { region: r } if *r != region => {
                                    *certified.lock().unwrap_or_else(|p| p.into_inner()) =
                                        Some(r.clone());
                                    Ok(())
                                }
                                WorkloadRole::Controller { .. } => {
                                    Err("a peer is of another region than this controller's".into())
                                }
                                _ => Err("peers are controllers".into()),
                            }
                        });
                        (source, expect)
                    });
                Target::new(url, tls).map(|target| (target, url.clone(), certified))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (listener, addr) = spillway_net::bind(options.listen).await?;
        let (stop, stop_rx) = watch::channel(false);
        let mut region = Region {
            peers_configured: options.peers.len(),
            changes: options.changes.clone(),
            ..Region::new(
                &options.region,
                options.rules.borrow().clone(),
                Arc::new(Trust::new(options.tls.clone(), "controller")),
            )
        };
        if let Some(sink) = &options.history {
            let state = region.state.get_mut().unwrap_or_else(|p| p.into_inner());
            state.history = Some(HistoryOut {
                ledger: Ledger::new(sink.resolution),
                slots: sink.slots.clone(),
                lost: 0,
            });
        }
        let leadership = options.leadership.clone();
        if let Some(rx) = &leadership {
            let state = region.state.get_mut().unwrap_or_else(|p| p.into_inner());
            state.lead(rx.borrow().clone());
        }
        let region = Arc::new(region);
        let mut tasks = Vec::new();
        let admin = spillway_net::admin::start_if(
            options.admin,
            options.admin_auth.clone(),
            region.clone(),
            stop_rx.clone(),
            &mut tasks,
        )
        .await?;
        let server = zones::Routes::new(service::Service {
            region: region.clone(),
            stop: stop_rx.clone(),
        });
        tasks.push(crate::serve::serve(
            tonic::service::Routes::new(server),
            listener,
            region.trust.clone(),
            options.grpc,
            stop_rx.clone(),
            "controller",
        ));
        for (target, url, certified) in peers {
            tasks.push(tokio::spawn(peers::run(
                region.clone(),
                peers::Dialled {
                    target,
                    url,
                    certified,
                },
                options.backoff.clone(),
                stop_rx.clone(),
            )));
        }
        tasks.push(tokio::spawn(service::follow_rules(
            region.clone(),
            options.rules.clone(),
            stop_rx.clone(),
        )));
        if let Some(rx) = leadership {
            tasks.push(tokio::spawn(service::follow_leadership(
                region.clone(),
                rx,
                stop_rx.clone(),
            )));
        }
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

    /// Whether this controller leads its region now (always, without a lease), and at which
    /// epoch.
    pub fn leads(&self) -> (bool, u64) {
        let state = self.region.lock();
        (
            state.leadership.leads_at(std::time::Instant::now()),
            state.core.epoch(),
        )
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
    /// How many peers this controller dials (`--peer`).
    peers_configured: usize,
    /// The rules store's latest changes, when the rules come from one.
    changes: Option<watch::Receiver<Arc<Vec<RulesChange>>>>,
}

struct RegionState {
    core: RegionCore,
    /// What the dashboard shows beside the core's view.
    record: record::Record,
    /// Each aggregator's stream, by connection.
    zones: HashMap<u64, mpsc::Sender<service::Outgoing>>,
    /// Each peer's stream, by connection (the ones it opened and the ones this side opened).
    peers: HashMap<u64, mpsc::Sender<Result<v1::RegionSums, Status>>>,
    /// The region's traffic history on its way to the rules store, when it has one.
    history: Option<HistoryOut>,
    /// Each interval's span, from its first zone report until its instructions go down.
    spans: IntervalSpans,
    /// Whether this controller leads: only a leader takes aggregators and sends anything.
    leadership: Leadership,
}

/// The history's slots as they fill, and the channel closed ones leave by.
struct HistoryOut {
    ledger: Ledger,
    slots: mpsc::Sender<HistoryBatch>,
    /// Slots the writer could not take.
    lost: u64,
}

impl HistoryOut {
    fn flush(&mut self, now_ms: u64) {
        for batch in self.ledger.take_closed(now_ms) {
            if self.slots.try_send(batch).is_err() {
                self.lost += 1;
                if self.lost.is_power_of_two() {
                    tracing::warn!(
                        lost = self.lost,
                        "history: the writer is not keeping up; slots are lost, control is not"
                    );
                }
            }
        }
    }
}

impl Region {
    fn new(region: &str, rules: Arc<RulesSnapshot>, trust: Arc<Trust>) -> Self {
        let now = now_ms();
        Self {
            region: region.to_owned(),
            state: Mutex::new(RegionState {
                record: record::Record::new(rules.version, now),
                core: {
                    let mut core = RegionCore::new(region, rules, now);
                    // Every zone stream sends the buckets common to all zones as encoded once.
                    core.share_instructions(true);
                    core
                },
                zones: HashMap::new(),
                peers: HashMap::new(),
                history: None,
                spans: IntervalSpans::controller(region),
                leadership: Leadership::alone(),
            }),
            next_conn: AtomicU64::new(1),
            trust,
            peers_configured: 0,
            changes: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, RegionState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl RegionState {
    /// Follows a new state of the lease: a leader's instructions carry its epoch; a controller
    /// that stopped leading ends every aggregator's stream, pointing it to the new leader.
    fn lead(&mut self, next: Leadership) {
        let was = self.leadership.is_leader();
        if next.is_leader() {
            self.core.set_epoch(next.epoch);
        } else if was {
            let status = standby_status(&next);
            for tx in self.zones.values() {
                let _ = tx.try_send(Err(status.clone()));
            }
        }
        self.leadership = next;
    }

    /// Sends what the core asks for. An aggregator or peer too slow to take one message per
    /// interval misses this one; the core sends the rules again to an aggregator that missed
    /// them. The record learns what went down, and samples the interval the core computed.
    fn send(&mut self, steps: Vec<RegionStep>) {
        let now = now_ms();
        // A standby, or a leader whose lease lapsed without a renewal (a process that was
        // paused): nothing goes out, not even to the peers, whose sums of this region are the
        // leader's alone.
        let leads = self.leadership.leads_at(Instant::now());
        let mut computed = None;
        // (zones sent to, the most buckets one zone got, zones that missed them)
        let mut fanout = (0u64, 0u64, 0u64);
        for step in steps {
            match step {
                RegionStep::Announce(_) if !leads => {}
                RegionStep::Announce(sums) => {
                    for tx in self.peers.values() {
                        let _ = tx.try_send(Ok(sums.clone()));
                    }
                }
                RegionStep::Send {
                    member,
                    instructions,
                } => {
                    // Not asked for (the core shares its instructions): sent all the same,
                    // as a message of no common buckets.
                    let instructions = SharedInstructions::whole(instructions);
                    self.send_zone(member, instructions, leads, now, &mut computed, &mut fanout);
                }
                RegionStep::SendShared {
                    member,
                    instructions,
                } => {
                    self.send_zone(member, instructions, leads, now, &mut computed, &mut fanout);
                }
            }
        }
        if let Some(sequence) = computed {
            self.spans.on_left(sequence, fanout.0, fanout.1, fanout.2);
        }
        self.record.after_steps(&self.core, computed, now);
        if let Some(history) = &mut self.history {
            history.flush(now);
        }
    }
}

impl RegionState {
    /// Sends one zone stream its instructions; counts them in `computed` (the interval) and
    /// `fanout` ([`RegionState::send`]).
    fn send_zone(
        &mut self,
        member: u64,
        instructions: SharedInstructions,
        leads: bool,
        now: u64,
        computed: &mut Option<u64>,
        fanout: &mut (u64, u64, u64),
    ) {
        if let Some(i) = &instructions.head().instructions {
            *computed = Some(i.sequence);
            fanout.1 = fanout.1.max(instructions.len() as u64);
        }
        let lost = match self.zones.get(&member) {
            Some(tx) if leads => tx
                .try_send(Ok(instructions))
                .err()
                .and_then(|e| e.into_inner().ok()),
            _ => Some(instructions),
        };
        let sent = lost.is_none();
        fanout.0 += 1;
        fanout.2 += u64::from(!sent);
        self.record.on_instructions(member, sent, now);
        if let Some(lost) = lost {
            self.core.shared_send_failed(member, &lost);
        }
    }
}

/// What a controller that does not lead answers an aggregator: UNAVAILABLE, with the leader's
/// address in [`LEADER_HINT`] when it knows it, for the aggregator to dial next.
fn standby_status(leadership: &Leadership) -> Status {
    let mut status = Status::unavailable(match &leadership.leader_url {
        Some(url) => format!("a standby controller: the region's leader is {url}"),
        None => "a standby controller: the region's leader is not known yet".to_owned(),
    });
    if let Some(url) = &leadership.leader_url
        && let Ok(value) = url.parse()
    {
        status.metadata_mut().insert(LEADER_HINT, value);
    }
    status
}
