//! The client's side of the control plane: reports the counts of its control-plane buckets to
//! the zone's aggregator every interval and applies what comes back (drop ratios, adaptive
//! token bucket shares and rules), failing open when the instructions stop.
//!
//! [`ControlPlane::spawn`] runs a [`ClientLink`] (which drives the host's sans-IO core,
//! `spillway_loop::HostCore`) over a [`Client`]: the client gives the link its counters and
//! applies what the core decides to its limiters ([`HostLimiters`]). Rules pushed down are data
//! (the controller's `control` and `services`, never its file's text or its `redis` section):
//! they run with the client's own `identity` and `redis`, are validated, swapped in, and written
//! to the state directory as the last good rules, so a restarted sidecar enforces them before
//! the control plane answers ([`last_good_rules`]).
//! Between instructions each drop-ratio bucket's surge guard (`spillway_core::surge`), ticked
//! every 50 ms, holds the host to its part of the limit when its own load jumps
//! (`control.surge_guard`, on by default).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use spillway_core::algo::Limiter;
use spillway_core::clock::Nanos;
use spillway_core::config::Config;
use spillway_core::counters::Snapshot;
use spillway_link::now_ms;
use spillway_loop::{BucketKey, DecodeRules, HostStep, LinkRules, SteeredLimiter, StepApplied};
use spillway_proto::v1;
use tokio::task::JoinHandle;

pub use spillway_link::{Backoff, ClientLink, HostLimiters, LinkOptions, LinkStatus, UrlError};

use crate::client::Client;
use crate::state::Limiters;

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
    /// The aggregator and who this host is. It reports at the `report_interval` of the rules in
    /// force until the controller says otherwise.
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

/// The last good rules of a state directory, run with the client's own settings `own` (its
/// file: its `identity` and `redis`): their control-plane version and configuration. `None`
/// when there are none, or when they no longer validate (logged: the caller then starts from its
/// own file, and the control plane sends the rules again).
///
/// The file holds the rules as they came down, data ([`LinkRules`] as JSON, which is YAML too),
/// after the version line; a file written by an older client (a whole configuration file) gives
/// its `control` and `services` only.
pub fn last_good_rules(state_dir: &Path, own: &Config) -> Option<(u64, Config)> {
    let path = state_dir.join(LAST_GOOD_RULES);
    let text = std::fs::read_to_string(&path).ok()?;
    let (first, body) = text.split_once('\n').unwrap_or((&text, ""));
    let version = first
        .strip_prefix(VERSION_PREFIX)
        .and_then(|v| v.trim().parse::<u64>().ok());
    let Some(version) = version else {
        tracing::warn!(path = %path.display(), "no version line; ignoring the saved rules");
        return None;
    };
    // The same two shapes a message of the link has: data, or (older) a file's text.
    let message = if body.trim_start().starts_with('{') {
        v1::Rules {
            version,
            json: body.to_owned(),
            ..Default::default()
        }
    } else {
        v1::Rules {
            version,
            yaml: body.to_owned(),
            ..Default::default()
        }
    };
    let name = path.display().to_string();
    match LinkRules::decode(&message).and_then(|rules| rules.with_own(own, &name)) {
        Ok(config) => Some((version, config)),
        Err(err) => {
            tracing::warn!("{err}; ignoring the saved rules");
            None
        }
    }
}

/// Writes `rules` as the last good rules of version `version`: to a temporary file first and
/// then renamed, so a crash mid-write leaves the previous rules whole.
fn save_rules(state_dir: &Path, version: u64, rules: &LinkRules) -> std::io::Result<()> {
    let json = rules.to_json().map_err(std::io::Error::other)?;
    std::fs::create_dir_all(state_dir)?;
    let tmp = state_dir.join(format!("{LAST_GOOD_RULES}.tmp"));
    std::fs::write(&tmp, format!("{VERSION_PREFIX}{version}\n{json}\n"))?;
    std::fs::rename(&tmp, state_dir.join(LAST_GOOD_RULES))
}

/// The client as the link sees it.
struct Linked {
    client: Arc<Client>,
    state_dir: Option<PathBuf>,
}

impl HostLimiters for Linked {
    fn now(&self) -> Nanos {
        self.client.now()
    }

    fn config(&self) -> Arc<Config> {
        self.client.rules().shared_config().clone()
    }

    fn counters(&self, key: &BucketKey) -> Snapshot {
        self.client
            .rules()
            .find(&key.service, &key.bucket)
            .map(|b| b.counters.snapshot())
            .unwrap_or_default()
    }

    fn unit(&self, key: &BucketKey) -> f64 {
        self.client
            .rules()
            .find(&key.service, &key.bucket)
            .filter(|b| b.response_cost().is_some_and(|c| c.counts_tokens()))
            .map_or(1.0, |b| b.budget().count_unit())
    }

    fn apply(&self, key: &BucketKey, step: &HostStep) {
        let (service, bucket) = (key.service.as_str(), key.bucket.as_str());
        let rules = self.client.rules();
        let Some(found) = rules.find(service, bucket) else {
            tracing::debug!(service, bucket, "instruction for a bucket not in force");
            return;
        };
        let limiter = match &found.state.limiters {
            Limiters::Shared(Limiter::DropRatio(d)) => SteeredLimiter::DropRatio(d),
            Limiters::Shared(Limiter::AdaptiveTokenBucket(a)) => SteeredLimiter::Adaptive(a),
            _ => {
                tracing::debug!(service, bucket, "instruction for a local bucket ignored");
                return;
            }
        };
        match step.apply_to(limiter, self.client.now()) {
            StepApplied::Instruction { expires } => found
                .state
                .instruction_expires
                .store(expires, Ordering::Relaxed),
            StepApplied::Applied => {}
            StepApplied::Ignored => {
                tracing::debug!(service, bucket, "instruction for a local bucket ignored");
            }
        }
    }

    fn apply_rules(
        &self,
        version: u64,
        rules: &v1::Rules,
    ) -> Result<Arc<Config>, Box<dyn std::error::Error + Send + Sync>> {
        let rules = LinkRules::decode(rules)?;
        // The client's own identity and redis stay: a reload keeps them from its file, and
        // rules received before kept them too.
        let own = self.client.rules().shared_config().clone();
        let config = rules.with_own(&own, &format!("control-plane rules version {version}"))?;
        self.client.reload(config)?;
        if let Some(dir) = &self.state_dir
            && let Err(err) = save_rules(dir, version, &rules)
        {
            // The rules are in force; only a restart without the control plane would miss them.
            tracing::error!(dir = %dir.display(), "cannot save the last good rules: {err}");
        }
        Ok(self.client.rules().shared_config().clone())
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
    /// Links `client` to the aggregator of `options` on the current tokio runtime: its reports,
    /// instructions, surge guards and share expiry (`spillway-link`), and [`Client::tick`], which
    /// counts expired instructions, every second. `rules_version` is the control-plane version
    /// of the rules the client starts with (from [`last_good_rules`]), 0 when it starts from its
    /// own file. Fails only on an unusable aggregator URL; an unreachable aggregator is retried
    /// with backoff.
    pub fn spawn(
        client: Arc<Client>,
        options: ControlOptions,
        rules_version: u64,
    ) -> Result<Self, UrlError> {
        let mut link = options.link;
        link.rules_version = rules_version;
        let linked = Arc::new(Linked {
            client: client.clone(),
            state_dir: options.state_dir,
        });
        let link = ClientLink::spawn(link, linked)?;
        let housekeeping = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                client.tick();
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
