//! The client side of the control plane: a rate-limit client (the sidecar, or any embedder of
//! `spillway-client`) reports to its zone's aggregator and applies what comes back.
//!
//! [`ClientLink`] drives a `spillway_loop::HostCore` with the wall clock and a real stream: it
//! calls the core at the deadlines it names (the tail of each interval, then its end), sends the
//! reports it returns, hands it every instruction set, and every 50 ms ticks its surge guards
//! and expires its shares (also while disconnected, so a host whose control plane is gone fails
//! open). What the core asks for is applied to the [`HostLimiters`] of the client. When the
//! aggregator is gone it reconnects with capped, jittered backoff; given several aggregators of
//! its zone, it moves to the next when its stream is lost or silent ([`crate::reconnect_any`]).
//! A report goes out once, on the stream open at its deadline: a host that moves never sends
//! the new aggregator an interval the old one had, so each interval of a host is in one
//! aggregator's sums.
//!
//! How a `spillway-client` embedder plugs in:
//! ```text
//! HostLimiters::counters    -> each control-plane bucket's counters (monotonic totals)
//! HostLimiters::apply       -> Client::set_drop_ratio, DropRatio::set_surge, set_share
//! HostLimiters::apply_rules -> LinkRules::decode, with_own, then Client::reload, persisted to disk
//! LinkStatus::connected     -> spillway_control_plane_connected
//! ```

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use spillway_core::clock::Nanos;
use spillway_core::config::Config;
use spillway_core::counters::Snapshot;
use spillway_core::surge;
use spillway_loop::{BucketKey, HostCore, HostId, HostStep, HostTime};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::backoff::Backoff;
use crate::clock::now_unix_ns;
use crate::session::{
    SessionError, Stop, Target, UrlError, open_stream, reconnect_any, silence_limit,
};
use spillway_tls::{Expect, TlsSource, WorkloadRole};

/// How long a stopping host waits for its aggregator to end the stream after its last report,
/// so that report is delivered, not reset with the stream.
const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// The client as the link sees it: its clock, its control-plane buckets' counters and limiters,
/// and its rules.
pub trait HostLimiters: Send + Sync + 'static {
    /// The limiters' clock (`spillway_core::clock`).
    fn now(&self) -> Nanos;

    /// The rules in force; when they change (a reload of the client's own file), the link's
    /// core follows them.
    fn config(&self) -> Arc<Config>;

    /// [`HostLimiters::config`] when it is not `held` (the same `Arc`), else `None`. The link
    /// asks at each turn (twenty times a second for the surge guards alone); a client can
    /// answer without cloning its `Arc`, whose count, when many hosts in one process share the
    /// rules, is a cache line every thread writes.
    fn config_if_changed(&self, held: &Arc<Config>) -> Option<Arc<Config>> {
        let config = self.config();
        (!Arc::ptr_eq(&config, held)).then_some(config)
    }

    /// The counters of `bucket` (monotonic totals); zeros for a bucket that is gone.
    fn counters(&self, bucket: &BucketKey) -> Snapshot;

    /// [`HostLimiters::counters`] of each of `buckets` in turn, into `into` (cleared first),
    /// which the link keeps from one guard tick to the next. `buckets` are the control-plane
    /// buckets of `rules` in the host core's order ([`HostCore::buckets`]), which is the same for
    /// the same rules: a client that keeps the position of each bucket for `rules` needs no key
    /// to find it. One that can read them all at once more cheaply than one by one (one lock,
    /// one clock reading) does it here.
    fn counters_into(
        &self,
        rules: &Arc<Config>,
        buckets: &mut dyn Iterator<Item = &BucketKey>,
        into: &mut Vec<Snapshot>,
    ) {
        let _ = rules;
        into.clear();
        into.extend(buckets.map(|key| self.counters(key)));
    }

    /// What one request stands for in `bucket`'s counts: 1 for a bucket counted in requests,
    /// the tokens of a typical request for a token budget (`spillway_loop::HostCore::set_units`).
    fn unit(&self, _bucket: &BucketKey) -> f64 {
        1.0
    }

    /// Applies one step of the core to `bucket`'s limiter: a drop ratio, a surge correction or
    /// an adaptive share. Never [`HostStep::Rules`], which goes to [`HostLimiters::apply_rules`].
    fn apply(&self, bucket: &BucketKey, step: &HostStep);

    /// [`HostLimiters::apply`] of each step in turn, with its bucket and the bucket's position
    /// in the host core for `rules` (as in [`HostLimiters::counters_into`]): the steps of one
    /// turn of the link (a surge step per bucket at every guard tick). A client that can apply
    /// them all at once more cheaply than one by one (one lock, one clock reading) does it here.
    fn apply_steps(
        &self,
        rules: &Arc<Config>,
        steps: &mut dyn Iterator<Item = (usize, &BucketKey, &HostStep)>,
    ) {
        let _ = rules;
        for (_, bucket, step) in steps {
            self.apply(bucket, step);
        }
    }

    /// New rules from the control plane as version `version`, the message as it came (read it
    /// with `spillway_loop::LinkRules::decode` and run it with the client's own `identity` and
    /// `redis`, `LinkRules::with_own`): validated, swapped in, and what is now in force
    /// returned. On an error the client keeps its rules and the link keeps reporting the old
    /// version, which the controller shows.
    fn apply_rules(
        &self,
        version: u64,
        rules: &v1::Rules,
    ) -> Result<Arc<Config>, Box<dyn std::error::Error + Send + Sync>>;
}

/// Who the client is and where it reports.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// The zone's aggregators, for example `http://127.0.0.1:7101`: one, or several of the same
    /// zone. With several, a host starts at one chosen by its host id (so a zone's hosts spread
    /// over them) and moves to the next when its stream is lost, refused or silent for
    /// [`crate::SILENT_INTERVALS`] intervals.
    pub aggregators: Vec<String>,
    pub host_id: String,
    pub region: String,
    pub zone: String,
    /// The rules version the client starts with (its last good rules from disk), 0 for none.
    pub rules_version: u64,
    pub backoff: Backoff,
    /// Mutual TLS: the process's certificate files. The aggregator must then prove
    /// it is this region's and zone's (`spiffe://T/spillway/aggregator/REGION/ZONE`), and the
    /// URL must be `https://`.
    pub tls: Option<Arc<TlsSource>>,
}

impl LinkOptions {
    /// Options with one aggregator, no rules version yet and the default backoff.
    pub fn new(
        aggregator: impl Into<String>,
        host_id: impl Into<String>,
        region: impl Into<String>,
        zone: impl Into<String>,
    ) -> Self {
        Self {
            aggregators: vec![aggregator.into()],
            host_id: host_id.into(),
            region: region.into(),
            zone: zone.into(),
            rules_version: 0,
            backoff: Backoff::default(),
            tls: None,
        }
    }
}

/// The link's state, readable from anywhere (metrics, readiness).
#[derive(Debug, Default)]
pub struct LinkStatus {
    connected: AtomicBool,
    rules_version: AtomicU64,
    interval_ms: AtomicU64,
    last_instructions_ms: AtomicU64,
    connects: AtomicU64,
    failovers: AtomicU64,
    reports: AtomicU64,
    instructions: AtomicU64,
    /// The aggregator of the open stream, or of the last one.
    aggregator: Mutex<String>,
    /// Streams in a row that ended for silence with nothing heard on them.
    silent_streak: AtomicU32,
}

impl LinkStatus {
    /// True while a stream to the aggregator is open (`spillway_control_plane_connected`).
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The rules version the client runs, as reported upward.
    pub fn rules_version(&self) -> u64 {
        self.rules_version.load(Ordering::Relaxed)
    }

    /// The report interval in force.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Relaxed))
    }

    /// When instructions last arrived, Unix milliseconds (0: never).
    pub fn last_instructions_ms(&self) -> u64 {
        self.last_instructions_ms.load(Ordering::Relaxed)
    }

    /// Streams opened so far (the first connection included).
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Streams opened to another aggregator than the stream before (given several).
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// The aggregator of the open stream, or of the last one (empty before the first).
    pub fn aggregator(&self) -> String {
        self.aggregator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reports sent so far.
    pub fn reports(&self) -> u64 {
        self.reports.load(Ordering::Relaxed)
    }

    /// Instruction sets received so far.
    pub fn instructions(&self) -> u64 {
        self.instructions.load(Ordering::Relaxed)
    }

    /// Copies what the core knows, after it changed.
    fn update(&self, core: &HostCore) {
        self.rules_version
            .store(core.rules_version(), Ordering::Relaxed);
        self.interval_ms
            .store(core.interval().ms(), Ordering::Relaxed);
        self.last_instructions_ms
            .store(core.last_instructions_ms(), Ordering::Relaxed);
    }
}

/// A running link; dropping it without [`ClientLink::shutdown`] aborts it.
pub struct ClientLink {
    status: Arc<LinkStatus>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The link's own housekeeping task, unless another's keeps it ([`ClientLink::spawn_kept`]):
    /// it ends with the link.
    _housekeeping: Option<Housekeeping>,
}

impl std::fmt::Debug for ClientLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLink")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl ClientLink {
    /// Starts the link on the current tokio runtime. Fails only on an unusable URL (or none);
    /// an unreachable aggregator is retried forever.
    pub fn spawn(options: LinkOptions, host: Arc<dyn HostLimiters>) -> Result<Self, UrlError> {
        Self::start(options, host, None)
    }

    /// [`ClientLink::spawn`], with the link's 50 ms housekeeping run by `housekeeping`'s task
    /// together with that of the other links it keeps, rather than by a task and a timer of
    /// the link's own: for many links in one process (`spillway emulate`).
    pub fn spawn_kept(
        options: LinkOptions,
        host: Arc<dyn HostLimiters>,
        housekeeping: &Housekeeping,
    ) -> Result<Self, UrlError> {
        Self::start(options, host, Some(housekeeping))
    }

    fn start(
        options: LinkOptions,
        host: Arc<dyn HostLimiters>,
        housekeeping: Option<&Housekeeping>,
    ) -> Result<Self, UrlError> {
        let tls = options.tls.clone().map(|source| {
            let (region, zone) = (options.region.clone(), options.zone.clone());
            let expect = Expect::new(
                format!("the aggregator of region {region}, zone {zone}"),
                move |identity| match &identity.role {
                    WorkloadRole::Aggregator { region: r, zone: z }
                        if *r == region && *z == zone =>
                    {
                        Ok(())
                    }
                    _ => Err("a proxy reports only to its own zone's aggregator".into()),
                },
            );
            (source, expect)
        });
        let mut targets = options
            .aggregators
            .iter()
            .map(|url| Target::new(url, tls.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        if targets.is_empty() {
            return Err(UrlError {
                url: String::new(),
                reason: "no aggregator given".into(),
            });
        }
        // Each host starts at its own aggregator of the zone, the same one every run.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        options.host_id.hash(&mut hasher);
        let first = (hasher.finish() % targets.len() as u64) as usize;
        targets.rotate_left(first);
        let several = targets.len() > 1;
        let config = host.config();
        let core = HostCore::new(
            HostId {
                host_id: options.host_id.clone(),
                region: options.region.clone(),
                zone: options.zone.clone(),
            },
            &config,
            options.rules_version,
        );
        let status = Arc::new(LinkStatus::default());
        status.update(&core);
        let driver = Arc::new(Driver {
            host,
            status: status.clone(),
            state: Mutex::new(State { core, config }),
            surges: Mutex::new(None),
        });
        let (stop, stop_rx) = watch::channel(false);
        // Surge guards every 50 ms and share expiry every 250 ms, connected or not.
        let own = match housekeeping {
            Some(kept) => {
                kept.keep(&driver, stop_rx.clone());
                None
            }
            None => {
                let own = Housekeeping::start();
                own.keep(&driver, stop_rx.clone());
                Some(own)
            }
        };
        let link = tokio::spawn(async move {
            reconnect_any(
                "control-plane",
                &targets,
                |_| None,
                options.backoff,
                stop_rx,
                |channel, stop, target| {
                    let driver = driver.clone();
                    let url = target.url().to_owned();
                    async move {
                        let result = driver.session(channel, stop, url, several).await;
                        *driver.surges.lock().unwrap_or_else(|p| p.into_inner()) = None;
                        driver.status.connected.store(false, Ordering::Relaxed);
                        result
                    }
                },
            )
            .await;
        });
        Ok(Self {
            status,
            stop,
            tasks: vec![link],
            _housekeeping: own,
        })
    }

    pub fn status(&self) -> Arc<LinkStatus> {
        self.status.clone()
    }

    pub fn connected(&self) -> bool {
        self.status.connected()
    }

    /// Sends what was counted since the last report and closes the stream.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for ClientLink {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The core and the rules it was last given (its buckets and their order follow from them).
struct State {
    core: HostCore,
    config: Arc<Config>,
}

/// What the link's tasks share: the client, the status and the core.
struct Driver {
    host: Arc<dyn HostLimiters>,
    status: Arc<LinkStatus>,
    state: Mutex<State>,
    /// The open stream's sender, for the surge reports the housekeeping task finds
    /// ([`HostCore::take_surge_report`]); `None` while no stream is open.
    surges: Mutex<Option<mpsc::Sender<v1::Report>>>,
}

impl Driver {
    /// The core, following the client's rules if they changed since the last call.
    fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(config) = self.host.config_if_changed(&state.config) {
            state.core.set_rules(&config);
            state.config = config;
        }
        state
    }

    fn now(&self) -> HostTime {
        HostTime {
            clock: self.host.now(),
            unix_ns: now_unix_ns(),
        }
    }

    /// Every bucket's counters, in the core's order.
    fn totals(&self, state: &State) -> Vec<Snapshot> {
        let mut totals = Vec::with_capacity(state.core.buckets().len());
        self.totals_into(state, &mut totals);
        totals
    }

    /// [`Driver::totals`] into `into`, which the guard's ticks keep from one to the next.
    fn totals_into(&self, state: &State, into: &mut Vec<Snapshot>) {
        self.host
            .counters_into(&state.config, &mut state.core.buckets(), into);
    }

    /// Applies `steps` of the core in `state` (emptying it, so the guard's ticks can keep one
    /// buffer), and the instructions that waited for new rules. The steps between two rules go
    /// to the client together ([`HostLimiters::apply_steps`]), in order.
    fn apply(&self, state: &mut State, now: HostTime, steps: &mut Vec<HostStep>) {
        let mut from = 0;
        while from < steps.len() {
            let to = steps[from..]
                .iter()
                .position(|step| matches!(step, HostStep::Rules { .. }))
                .map_or(steps.len(), |at| from + at);
            let (core, rules) = (&state.core, &state.config);
            for step in &steps[from..to] {
                if let HostStep::ShareExpired { bucket } = step {
                    let key = core.bucket(*bucket);
                    tracing::warn!(
                        service = %key.service,
                        bucket = %key.bucket,
                        "adaptive share expired; refilling at the whole limit until the control plane sends a new one"
                    );
                }
            }
            self.host.apply_steps(
                rules,
                &mut steps[from..to].iter().filter_map(|step| match step {
                    HostStep::DropRatio { bucket, .. }
                    | HostStep::Surge { bucket, .. }
                    | HostStep::Share { bucket, .. }
                    | HostStep::ShareExpired { bucket } => {
                        Some((*bucket, core.bucket(*bucket), step))
                    }
                    HostStep::Rules { .. } => None,
                }),
            );
            if let Some(HostStep::Rules { version, rules }) = steps.get(to) {
                let applied = self.host.apply_rules(*version, rules);
                let mut more = rules_handshake(
                    &mut state.core,
                    now,
                    *version,
                    applied.as_ref().map(|config| &**config),
                    "",
                );
                if let Ok(config) = applied {
                    state.config = config;
                }
                self.apply(state, now, &mut more);
            }
            from = to + 1;
        }
        steps.clear();
        self.status.update(&state.core);
    }

    /// One stream to aggregator `url`, from its opening to its end: `Ok` when stopped, an
    /// error when lost (or, with `several` aggregators, silent).
    async fn session(
        &self,
        channel: Channel,
        mut stop: Stop,
        url: String,
        several: bool,
    ) -> Result<(), SessionError> {
        let mut client = v1::aggregator_client::AggregatorClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::channel::<v1::Report>(4);
        let mut inbound = open_stream(several, client.link(ReceiverStream::new(rx)))
            .await?
            .into_inner();
        *self.surges.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx.clone());
        self.status.connected.store(true, Ordering::Relaxed);
        self.status.connects.fetch_add(1, Ordering::Relaxed);
        let before = std::mem::replace(
            &mut *self
                .status
                .aggregator
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
            url.clone(),
        );
        if before.is_empty() || before == url {
            tracing::info!(aggregator = %url, "control-plane link up");
        } else {
            self.status.failovers.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                from = %before,
                aggregator = %url,
                "control-plane link up on another aggregator of the zone (spillway_control_plane_failovers_total)"
            );
        }
        {
            let mut state = self.lock();
            let totals = self.totals(&state);
            state.core.start(self.now(), &totals);
            // Named to the aggregator at once, so the interval in progress waits for this host.
            tx.try_send(state.core.hello())
                .map_err(|_| SessionError::Closed)?;
        }
        let mut heard = tokio::time::Instant::now();
        loop {
            let (deadline, interval) = {
                let state = self.lock();
                (state.core.deadline(), state.core.interval().duration())
            };
            let wait = deadline.saturating_sub(now_unix_ns() / 1_000_000);
            let streak = self.status.silent_streak.load(Ordering::Relaxed);
            let quiet = silence_limit(several, interval, streak);
            tokio::select! {
                _ = tokio::time::sleep_until(heard + quiet) => {
                    self.status.silent_streak.fetch_add(1, Ordering::Relaxed);
                    return Err(SessionError::Silent(quiet));
                }
                _ = tokio::time::sleep(Duration::from_millis(wait)) => {
                    let report = {
                        let mut state = self.lock();
                        let totals = self.totals(&state);
                        state.core.on_deadline(self.now(), &totals)
                    };
                    if let Some(report) = report {
                        tx.send(report).await.map_err(|_| SessionError::Closed)?;
                        self.status.reports.fetch_add(1, Ordering::Relaxed);
                    }
                }
                message = inbound.message() => match message {
                    Ok(Some(instructions)) => {
                        heard = tokio::time::Instant::now();
                        self.status.silent_streak.store(0, Ordering::Relaxed);
                        self.status.instructions.fetch_add(1, Ordering::Relaxed);
                        let now = self.now();
                        let mut state = self.lock();
                        let mut steps = state.core.on_instructions(now, instructions);
                        self.apply(&mut state, now, &mut steps);
                    }
                    Ok(None) => return Err(SessionError::Ended),
                    Err(status) => return Err(SessionError::Stream(status)),
                },
                _ = stop.changed() => {
                    // Flush the partial interval so a stopping host's last requests are counted.
                    let report = {
                        let mut state = self.lock();
                        let totals = self.totals(&state);
                        state.core.flush(self.now(), &totals)
                    };
                    let _ = tx.try_send(report);
                    // The report is only on its way once the stream ends cleanly: returning now
                    // would drop the call, and a reset stream loses what it still held. So close
                    // this side (the surge reports' sender too) and wait, briefly, for the
                    // aggregator to end its own.
                    drop(tx);
                    *self.surges.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    let drained = async { while let Ok(Some(_)) = inbound.message().await {} };
                    let _ = tokio::time::timeout(FLUSH_WAIT, drained).await;
                    return Ok(());
                }
            }
        }
    }
}

/// What a turn of housekeeping works in, kept from one to the next.
#[derive(Default)]
struct TickBuffers {
    totals: Vec<Snapshot>,
    units: Vec<f64>,
    steps: Vec<HostStep>,
}

impl Driver {
    /// Turn `n` of housekeeping (every 50 ms, from 1): the surge guards' tick, and every fifth
    /// turn the adaptive shares' expiry.
    fn housekeep(&self, n: u64, buffers: &mut TickBuffers) {
        let TickBuffers {
            totals,
            units,
            steps,
        } = buffers;
        let now = self.now();
        let mut state = self.lock();
        self.totals_into(&state, totals);
        units.clear();
        units.extend(state.core.buckets().map(|key| self.host.unit(key)));
        state.core.set_units(units);
        state.core.guard_tick_into(now.clock, totals, steps);
        if n.is_multiple_of(5) {
            steps.extend(state.core.expire_shares(now.clock));
        }
        self.apply(&mut state, now, steps);
        // A guard that engaged says so at once, on the stream that is open (or to nobody).
        if let Some(report) = state.core.take_surge_report()
            && let Some(tx) = self
                .surges
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
        {
            let _ = tx.try_send(report);
        }
    }
}

/// One task that runs the 50 ms housekeeping (surge guards, share expiry) of links in turn: of
/// one link ([`ClientLink::spawn`]), or of many links of one process ([`ClientLink::spawn_kept`]),
/// which would otherwise take a task and a timer each: twenty wake-ups a second per link, with
/// the guards' buffers kept once per task rather than once per link. `spillway emulate` keeps
/// its hosts' links in groups of 16 (docs/benchmarks.md: about 30% less of the emulator's CPU at
/// 2,000 hosts, together with the guard's calm ticks). The work per link is what a link's own
/// task does at each turn. A link leaves when it stops; the task ends once every clone of its
/// `Housekeeping` is dropped.
#[derive(Clone)]
pub struct Housekeeping {
    links: Arc<Mutex<Vec<Kept>>>,
}

impl std::fmt::Debug for Housekeeping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner()).len();
        f.debug_struct("Housekeeping")
            .field("links", &links)
            .finish()
    }
}

/// A link kept by a [`Housekeeping`] task: its driver, while the link runs, and its stop.
struct Kept {
    driver: Weak<Driver>,
    stop: Stop,
}

impl Housekeeping {
    /// Starts the task on the current tokio runtime, its first turn at once.
    pub fn start() -> Self {
        Self::start_after(Duration::ZERO)
    }

    /// Starts the task on the current tokio runtime, its first turn `offset` from now. Several
    /// tasks started together with their offsets spread over the 50 ms of a turn share out
    /// their work over it, where tasks started at once would all run at the same instant of
    /// every turn (and of every report interval, which is a whole number of turns), delaying
    /// whatever else is due then (every host's report, at the end of an interval).
    pub fn start_after(offset: Duration) -> Self {
        let links = Arc::new(Mutex::new(Vec::<Kept>::new()));
        let held = Arc::downgrade(&links);
        tokio::spawn(async move {
            let mut every = tokio::time::interval_at(
                tokio::time::Instant::now() + offset,
                Duration::from_nanos(surge::TICK_NS),
            );
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u64;
            let mut buffers = TickBuffers::default();
            loop {
                every.tick().await;
                let Some(links) = held.upgrade() else { return };
                n += 1;
                let mut links = links.lock().unwrap_or_else(|p| p.into_inner());
                links.retain(|kept| match kept.driver.upgrade() {
                    Some(driver) if !*kept.stop.borrow() => {
                        driver.housekeep(n, &mut buffers);
                        true
                    }
                    _ => false,
                });
            }
        });
        Self { links }
    }

    /// The links it keeps now.
    pub fn links(&self) -> usize {
        self.links.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn keep(&self, driver: &Arc<Driver>, stop: Stop) {
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Kept {
                driver: Arc::downgrade(driver),
                stop,
            });
    }
}

/// The end of a [`HostStep::Rules`]: `applied` is what running its rules gave (the
/// configuration now in force, or why they were refused). Logs it (`who` starts the line, empty
/// for a client's link), tells the core, and returns the steps that waited for the rules, to
/// apply next. Every owner of a host core (a client's link, an RLQS host) ends the handshake here.
pub fn rules_handshake<E: std::fmt::Display>(
    core: &mut HostCore,
    now: HostTime,
    version: u64,
    applied: Result<&Config, E>,
    who: &str,
) -> Vec<HostStep> {
    match applied {
        Ok(config) => {
            tracing::info!(version, "{who}rules from the control plane applied");
            core.rules_applied(now, version, config)
        }
        Err(err) => {
            tracing::error!(
                version,
                "{who}rules from the control plane refused, keeping version {}: {err}",
                core.rules_version()
            );
            core.rules_refused(now)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// A client of one drop-ratio bucket that counts the guard's turns it is given.
    struct Counted {
        config: Arc<Config>,
        turns: AtomicUsize,
    }

    impl HostLimiters for Counted {
        fn now(&self) -> Nanos {
            now_unix_ns()
        }

        fn config(&self) -> Arc<Config> {
            self.config.clone()
        }

        fn counters(&self, _: &BucketKey) -> Snapshot {
            Snapshot::default()
        }

        fn apply(&self, _: &BucketKey, _: &HostStep) {}

        fn apply_steps(
            &self,
            _: &Arc<Config>,
            steps: &mut dyn Iterator<Item = (usize, &BucketKey, &HostStep)>,
        ) {
            let mut surge = false;
            for (_, _, step) in steps {
                surge |= matches!(step, HostStep::Surge { .. });
            }
            if surge {
                self.turns.fetch_add(1, Ordering::Relaxed);
            }
        }

        fn apply_rules(
            &self,
            _: u64,
            _: &v1::Rules,
        ) -> Result<Arc<Config>, Box<dyn std::error::Error + Send + Sync>> {
            Err("not here".into())
        }
    }

    #[tokio::test]
    async fn links_kept_together_tick_their_guards_until_they_stop() {
        let yaml = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: b0, limit: 100/s, scope: global }\n";
        let config = Arc::new(spillway_core::config::load_str(yaml, "rules.yaml").unwrap());
        let housekeeping = Housekeeping::start();
        // No aggregator listens there: housekeeping runs connected or not.
        let (links, hosts): (Vec<_>, Vec<_>) = (0..3)
            .map(|i| {
                let host = Arc::new(Counted {
                    config: config.clone(),
                    turns: AtomicUsize::new(0),
                });
                let options = LinkOptions::new("http://127.0.0.1:9", format!("h{i}"), "r", "z");
                let link = ClientLink::spawn_kept(options, host.clone(), &housekeeping).unwrap();
                (link, host)
            })
            .unzip();
        assert_eq!(housekeeping.links(), 3);
        // Every link's guards tick, each on its own client (waited for, however slow the
        // machine: at most 10 s).
        let started = tokio::time::Instant::now();
        while hosts.iter().any(|h| h.turns.load(Ordering::Relaxed) < 3) {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "guard turns: {:?}",
                hosts
                    .iter()
                    .map(|h| h.turns.load(Ordering::Relaxed))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for link in links {
            link.shutdown().await;
        }
        let stopped = tokio::time::Instant::now();
        while housekeeping.links() > 0 {
            assert!(
                stopped.elapsed() < Duration::from_secs(10),
                "a stopped link is no longer kept"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let after: Vec<usize> = hosts
            .iter()
            .map(|h| h.turns.load(Ordering::Relaxed))
            .collect();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let later: Vec<usize> = hosts
            .iter()
            .map(|h| h.turns.load(Ordering::Relaxed))
            .collect();
        assert_eq!(after, later, "nor ticked");
    }
}
