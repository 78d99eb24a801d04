//! The client's side of the control plane: reports the counts of its control-plane buckets to
//! the zone's aggregator every interval and applies what comes back (drop ratios, adaptive
//! token bucket shares and rules), failing open when the instructions stop (G5, G8-G10, G12).
//!
//! [`ControlPlane::spawn`] runs a [`ClientLink`] over a [`Client`]. The client implements the
//! link's [`ReportSource`] and [`InstructionSink`] through a small adapter that remembers the
//! counters of the previous report (the client's counters are monotonic totals) and when each
//! adaptive share expires. Rules pushed down are validated, swapped in, and written to the
//! state directory as the last good rules, so a restarted sidecar enforces them before the
//! control plane answers ([`last_good_rules`]). Between instructions each drop-ratio bucket's
//! surge guard (`spillway_core::surge`), ticked every 50 ms, holds the host to its part of the
//! limit when its own load jumps (`control.surge_guard`, on by default).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_control::link::{BucketReport, Instruction};
use spillway_control::timing::now_ms;
use spillway_core::algo::{Limiter, Ratio};
use spillway_core::clock::{Nanos, nanos};
use spillway_core::config::{self, Algorithm, Config, Store};
use spillway_core::counters::Snapshot;
use spillway_core::surge::{self, Instructed, SurgeGuard};
use tokio::task::JoinHandle;

pub use spillway_control::{
    Backoff, ClientLink, ControlError, InstructionSink, LinkOptions, LinkStatus, ReportSource,
};

use crate::client::Client;
use crate::rules::Limiters;

/// The file in the state directory that holds the last good rules from the control plane.
pub const LAST_GOOD_RULES: &str = "last-good-rules.yaml";

/// The first line of [`LAST_GOOD_RULES`]: a YAML comment carrying the control plane's version,
/// so the rules and their version are written (and renamed into place) as one file.
const VERSION_PREFIX: &str = "# spillway rules version ";

/// True while the link is up and instructions arrived within `ttl`, which is what
/// `spillway_control_plane_connected` says: an aggregator whose controller is gone keeps its
/// clients' streams open but sends nothing, and those clients fail open all the same.
pub fn control_plane_live(status: &LinkStatus, ttl: Duration) -> bool {
    let last = status.last_instructions_ms();
    status.connected()
        && last != 0
        && now_ms().saturating_sub(last) < u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// How a client joins the control plane.
#[derive(Debug, Clone)]
pub struct ControlOptions {
    /// The aggregator and who this host is. Its interval is replaced by the `report_interval` of
    /// the rules in force when the link starts.
    pub link: LinkOptions,
    /// Where the last good rules are kept across restarts; `None` keeps nothing.
    pub state_dir: Option<PathBuf>,
}

impl ControlOptions {
    pub fn new(link: LinkOptions) -> Self {
        Self {
            link,
            state_dir: None,
        }
    }
}

/// The last good rules of a state directory: their control-plane version and configuration.
/// `None` when there are none, or when they no longer validate (logged: the caller then starts
/// from its own file, and the control plane sends the rules again).
pub fn last_good_rules(state_dir: &Path) -> Option<(u64, Config)> {
    let path = state_dir.join(LAST_GOOD_RULES);
    let text = std::fs::read_to_string(&path).ok()?;
    let version = text
        .lines()
        .next()
        .and_then(|line| line.strip_prefix(VERSION_PREFIX))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(version) = version else {
        tracing::warn!(path = %path.display(), "no version line; ignoring the saved rules");
        return None;
    };
    match config::load_str(&text, &path.display().to_string()) {
        Ok(config) => Some((version, config)),
        Err(err) => {
            tracing::warn!("{err}; ignoring the saved rules");
            None
        }
    }
}

/// Writes `yaml` as the last good rules of version `version`: to a temporary file first and then
/// renamed, so a crash mid-write leaves the previous rules whole.
fn save_rules(state_dir: &Path, version: u64, yaml: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(state_dir)?;
    let tmp = state_dir.join(format!("{LAST_GOOD_RULES}.tmp"));
    std::fs::write(&tmp, format!("{VERSION_PREFIX}{version}\n{yaml}"))?;
    std::fs::rename(&tmp, state_dir.join(LAST_GOOD_RULES))
}

type Key = (String, String);

/// The client as the link sees it.
struct Adapter {
    client: Arc<Client>,
    state_dir: Option<PathBuf>,
    /// Counter totals at the previous report, per bucket.
    last: Mutex<HashMap<Key, Snapshot>>,
    /// When each adaptive share stops holding; past it the bucket refills at the full limit
    /// again, as a host alone would (fail-open, G9).
    shares: Mutex<HashMap<Key, Instant>>,
    /// Each drop-ratio bucket's surge guard, the offered total at its last tick and when that
    /// tick was.
    guards: Mutex<HashMap<Key, Guard>>,
}

/// One drop-ratio bucket's surge guard and where its counting stands.
#[derive(Debug, Default)]
struct Guard {
    guard: SurgeGuard,
    offered: u64,
    at: Nanos,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Buckets whose limit the control plane computes from everyone's counts.
fn on_control_plane(algorithm: Algorithm, store: Store) -> bool {
    matches!(
        algorithm,
        Algorithm::DropRatio | Algorithm::AdaptiveTokenBucket
    ) && store == Store::ControlPlane
}

impl ReportSource for Adapter {
    fn report(&self) -> Vec<BucketReport> {
        let rules = self.client.rules();
        let mut last = lock(&self.last);
        let mut seen = HashMap::with_capacity(last.len());
        let mut out = Vec::new();
        for bucket in rules.buckets() {
            let config = bucket.config();
            if !on_control_plane(config.algorithm, config.store) {
                continue;
            }
            let key = (bucket.service().to_owned(), bucket.name().to_owned());
            let now = bucket.counters.snapshot();
            // A bucket recreated by a reload starts its counters at zero again.
            let before = last
                .get(&key)
                .copied()
                .filter(|b| b.offered() <= now.offered())
                .unwrap_or_default();
            let delta = now - before;
            out.push(BucketReport {
                service: key.0.clone(),
                bucket: key.1.clone(),
                offered: delta.offered(),
                allowed: delta.allowed,
                shadow_dropped: delta.shadow_dropped,
            });
            seen.insert(key, now);
        }
        *last = seen;
        out
    }
}

impl InstructionSink for Adapter {
    fn apply_rules(
        &self,
        version: u64,
        yaml: &str,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let config = config::load_str(yaml, &format!("control-plane rules version {version}"))?;
        self.client.reload(config)?;
        if let Some(dir) = &self.state_dir
            && let Err(err) = save_rules(dir, version, yaml)
        {
            // The rules are in force; only a restart without the control plane would miss them.
            tracing::error!(dir = %dir.display(), "cannot save the last good rules: {err}");
        }
        Ok(())
    }

    fn apply(&self, instruction: Instruction<'_>, ttl: Duration) {
        let (service, bucket) = (instruction.service, instruction.bucket);
        let rules = self.client.rules();
        let Some(found) = rules.find(service, bucket) else {
            tracing::debug!(service, bucket, "instruction for a bucket not in force");
            return;
        };
        match &found.state.limiters {
            Limiters::Shared(Limiter::DropRatio(_)) => {
                if let Err(err) =
                    self.client
                        .set_drop_ratio(service, bucket, instruction.drop_ratio, ttl)
                {
                    tracing::debug!("{err}");
                }
                let interval = rules.config().control.report_interval;
                let now = self.client.now();
                let ago = now_ms().saturating_sub(instruction.interval_end_ms);
                lock(&self.guards)
                    .entry((service.to_owned(), bucket.to_owned()))
                    .or_default()
                    .guard
                    .instruct(
                        Instructed {
                            ratio: instruction.drop_ratio.as_f64(),
                            limit_rps: found.config().limit.per_second(),
                            scope_offered_rps: instruction.scope_offered_rps,
                            scope_hosts: instruction.scope_hosts,
                            interval_ns: nanos(interval),
                            interval_ended_ago_ns: ago.saturating_mul(1_000_000),
                            expires_at: now.saturating_add(nanos(ttl)),
                        },
                        now,
                    );
            }
            Limiters::Shared(Limiter::AdaptiveTokenBucket(a)) => {
                if let Some(share) = instruction.share {
                    a.set_share(self.client.now(), share);
                    lock(&self.shares).insert(
                        (service.to_owned(), bucket.to_owned()),
                        Instant::now() + ttl,
                    );
                }
            }
            _ => tracing::debug!(service, bucket, "instruction for a local bucket ignored"),
        }
    }
}

impl Adapter {
    /// One tick of every drop-ratio bucket's surge guard: counts what each was offered since the
    /// last tick and installs the correction (0 unless the count shows a surge over the host's
    /// part of the limit) until two ticks from now, so a stalled task cannot leave one behind.
    fn guard_surges(&self) {
        let rules = self.client.rules();
        let now = self.client.now();
        let mut guards = lock(&self.guards);
        if !rules.config().control.surge_guard {
            // Corrections already installed end within two ticks.
            guards.clear();
            return;
        }
        let mut live = HashMap::with_capacity(guards.len());
        for bucket in rules.buckets() {
            let config = bucket.config();
            // Drop-ratio buckets on the control plane: the limiter says which algorithm it is.
            if !on_control_plane(config.algorithm, config.store) {
                continue;
            }
            let Limiters::Shared(Limiter::DropRatio(d)) = &bucket.state.limiters else {
                continue;
            };
            let key = (bucket.service().to_owned(), bucket.name().to_owned());
            let mut state = guards.remove(&key).unwrap_or_default();
            let offered = bucket.counters.snapshot().offered();
            if state.at != 0 && offered >= state.offered && now > state.at {
                // A late tick counted more than one tick's time: scale it to one.
                let count = (offered - state.offered) as f64 * surge::TICK_NS as f64
                    / (now - state.at) as f64;
                let ratio = state.guard.tick(count.round() as u64, now);
                d.set_surge(ratio, now.saturating_add(2 * surge::TICK_NS));
            }
            state.offered = offered;
            state.at = now;
            live.insert(key, state);
        }
        *guards = live;
    }

    /// Puts adaptive buckets whose share expired back on the whole limit.
    fn expire_shares(&self) {
        let now = Instant::now();
        let expired: Vec<Key> = {
            let mut shares = lock(&self.shares);
            let expired = shares
                .iter()
                .filter(|(_, until)| **until <= now)
                .map(|(k, _)| k.clone())
                .collect::<Vec<_>>();
            for key in &expired {
                shares.remove(key);
            }
            expired
        };
        let rules = self.client.rules();
        for (service, bucket) in expired {
            if let Some(found) = rules.find(&service, &bucket)
                && let Limiters::Shared(Limiter::AdaptiveTokenBucket(a)) = &found.state.limiters
            {
                a.set_share(self.client.now(), Ratio::ONE);
                tracing::warn!(
                    service,
                    bucket,
                    "adaptive share expired; refilling at the whole limit until the control plane sends a new one"
                );
            }
        }
    }
}

/// A client linked to the control plane: the link and the housekeeping that goes with it.
pub struct ControlPlane {
    /// Always `Some` until shutdown takes it.
    link: Option<ClientLink>,
    housekeeping: JoinHandle<()>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("link", &self.link)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Links `client` to the aggregator of `options` on the current tokio runtime, and runs the
    /// client's housekeeping: the drop-ratio buckets' surge guards every 50 ms
    /// (`spillway_core::surge`), and [`Client::tick`], which counts expired instructions, every
    /// second.
    /// `rules_version` is the control-plane version of the rules the client starts with (from
    /// [`last_good_rules`]), 0 when it starts from its own file. Fails only on an unusable
    /// aggregator URL; an unreachable aggregator is retried with backoff.
    pub fn spawn(
        client: Arc<Client>,
        options: ControlOptions,
        rules_version: u64,
    ) -> Result<Self, ControlError> {
        let adapter = Arc::new(Adapter {
            client,
            state_dir: options.state_dir,
            last: Mutex::new(HashMap::new()),
            shares: Mutex::new(HashMap::new()),
            guards: Mutex::new(HashMap::new()),
        });
        let mut link = options.link;
        link.rules_version = rules_version;
        // Start at the interval of the rules in force; the controller's instructions confirm it.
        link.interval = adapter.client.rules().config().control.report_interval;
        let link = ClientLink::spawn(link, adapter.clone(), adapter.clone())?;
        let housekeeping = tokio::spawn(async move {
            // Every 50 ms the surge guards; every 250 ms the adaptive shares; every second the
            // client's own housekeeping.
            let mut every = tokio::time::interval(Duration::from_nanos(surge::TICK_NS));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u64;
            loop {
                every.tick().await;
                adapter.guard_surges();
                n += 1;
                if n.is_multiple_of(5) {
                    adapter.expire_shares();
                }
                if n.is_multiple_of(20) {
                    adapter.client.tick();
                }
            }
        });
        Ok(Self {
            link: Some(link),
            housekeeping,
        })
    }

    /// The link's state: connected, rules version, interval.
    pub fn status(&self) -> Arc<LinkStatus> {
        match &self.link {
            Some(link) => link.status(),
            None => Arc::default(),
        }
    }

    /// Sends the last partial report, closes the stream and stops the housekeeping.
    pub async fn shutdown(mut self) {
        self.housekeeping.abort();
        if let Some(link) = self.link.take() {
            link.shutdown().await;
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.housekeeping.abort();
    }
}
