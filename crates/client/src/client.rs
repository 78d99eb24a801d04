//! The client: the rules in force behind `arc-swap`, the clock, reloads and the instruction table.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use spillway_core::algo::{Limiter, Ratio, TierRatios, uniform};
use spillway_core::clock::{Clock, CoarseClock, Nanos, nanos};
use spillway_core::config::{self, Algorithm, Config};
use spillway_core::counters::Snapshot;
use spillway_core::decision::{Decision, Mode};
use spillway_core::limit::Limit;
use spillway_core::pattern::RequestAttrs;

use crate::error::{ClientError, InstructionError};
use crate::identity::Headers;
use crate::rules::{self, Rules, Step};
use crate::state::Limiters;
use crate::subjects::DEFAULT_MAX_SUBJECTS;

/// The rate-limit client of one process: decides requests against the rules in force.
pub struct Client {
    rules: ArcSwap<Rules>,
    clock: Arc<dyn Clock>,
    max_subjects: usize,
    /// Serialises reloads so two of them cannot both build on the same previous version.
    reload: std::sync::Mutex<()>,
    expired: AtomicU64,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("version", &self.rules.load().version())
            .finish_non_exhaustive()
    }
}

/// A reading of one bucket for metrics and reports.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketStats {
    pub service: String,
    pub bucket: String,
    pub mode: Mode,
    pub algorithm: Algorithm,
    pub limit: Limit,
    /// Totals since the bucket was first loaded (they survive reloads that keep the bucket).
    pub counters: Snapshot,
    /// The drop ratio in force, for drop-ratio buckets.
    pub drop_ratio: Option<f64>,
    /// Subjects held, for per-subject buckets.
    pub subjects: Option<usize>,
    pub subject_overflow: u64,
}

impl Client {
    /// A client on the coarse system clock ([`CoarseClock`]): a decision reads it in about 2 ns
    /// instead of 22, and every time a decision needs (an instruction's expiry, a window, a
    /// bucket's refill) is good to the millisecond the coarse clock keeps.
    pub fn new(config: Config) -> Result<Self, ClientError> {
        Self::with_clock(config, Arc::new(CoarseClock::new()))
    }

    /// A client reading its rules from `path`.
    pub fn from_file(path: &Path) -> Result<Self, ClientError> {
        Self::new(config::load_file(path)?)
    }

    /// A client on `clock` (a fake one in tests and the simulator).
    pub fn with_clock(config: Config, clock: Arc<dyn Clock>) -> Result<Self, ClientError> {
        Self::with_options(config, clock, DEFAULT_MAX_SUBJECTS)
    }

    /// A client on `clock` whose per-subject buckets hold at most `max_subjects` subjects each.
    pub fn with_options(
        config: Config,
        clock: Arc<dyn Clock>,
        max_subjects: usize,
    ) -> Result<Self, ClientError> {
        let rules = Rules::compile(config, 1, None, max_subjects)?;
        Ok(Self {
            rules: ArcSwap::from_pointee(rules),
            clock,
            max_subjects,
            reload: std::sync::Mutex::new(()),
            expired: AtomicU64::new(0),
        })
    }

    /// The rules in force. Hold the result while turning a decision into an answer, so the bucket
    /// a decision names is looked up in the snapshot that made it.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    /// The current time of the client's clock.
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// Decides a request now, against the rules in force, without waiting: a `store: redis`
    /// bucket is decided by its `on_store_failure` (see [`Rules::decide`]); use
    /// [`Client::decide_async`] when the rules have such buckets.
    pub fn decide<H: Headers + ?Sized>(&self, attrs: &RequestAttrs<'_>, headers: &H) -> Decision {
        self.rules.load().decide(self.clock.now(), attrs, headers)
    }

    /// Decides a request now, against the rules in force, asking Redis for the `store: redis`
    /// buckets it matches. Waits only for those; any other request is decided at once.
    pub async fn decide_async<H: Headers + ?Sized>(
        &self,
        attrs: &RequestAttrs<'_>,
        headers: &H,
    ) -> Decision {
        let rules = self.rules.load_full();
        match rules.begin(self.clock.now(), attrs, headers) {
            Step::Done(decision) => decision,
            Step::Redis(pending) => rules.finish(pending).await,
        }
    }

    /// Replaces the rules with `config`, keeping the state of unchanged buckets. On an error the
    /// rules in force stay. Returns the new version.
    pub fn reload(&self, config: Config) -> Result<u64, ClientError> {
        let _one_at_a_time = self.reload.lock().unwrap_or_else(|p| p.into_inner());
        let previous = self.rules.load_full();
        let rules = Rules::compile(
            config,
            previous.version() + 1,
            Some(&previous),
            self.max_subjects,
        )?;
        let version = rules.version();
        self.rules.store(Arc::new(rules));
        Ok(version)
    }

    /// Reloads from a file; see [`Client::reload`].
    pub fn reload_file(&self, path: &Path) -> Result<u64, ClientError> {
        self.reload(config::load_file(path)?)
    }

    /// Installs a drop-ratio instruction: drop `ratio` of the bucket's requests for `ttl`,
    /// after which the bucket admits everything again unless a newer instruction came.
    pub fn set_drop_ratio(
        &self,
        service: &str,
        bucket: &str,
        ratio: Ratio,
        ttl: Duration,
    ) -> Result<(), InstructionError> {
        self.set_drop_ratio_tiers(service, bucket, ratio, &uniform(ratio), ttl)
    }

    /// Like [`Client::set_drop_ratio`], each criticality tier dropping its own ratio of `tiers`
    ///; `ratio` is the bucket's, as readings show it.
    pub fn set_drop_ratio_tiers(
        &self,
        service: &str,
        bucket: &str,
        ratio: Ratio,
        tiers: &TierRatios,
        ttl: Duration,
    ) -> Result<(), InstructionError> {
        let rules = self.rules.load();
        let found = rules
            .find(service, bucket)
            .ok_or_else(|| InstructionError::UnknownBucket {
                service: service.to_owned(),
                bucket: bucket.to_owned(),
            })?;
        match &found.state.limiters {
            Limiters::Shared(Limiter::DropRatio(d)) => {
                let now = self.clock.now();
                let expires = now.saturating_add(nanos(ttl));
                d.set_tiers(ratio, tiers, expires);
                found
                    .state
                    .instruction_expires
                    .store(expires, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(InstructionError::NotDropRatio {
                service: service.to_owned(),
                bucket: bucket.to_owned(),
                algorithm: found.algorithm().name(),
            }),
        }
    }

    /// Housekeeping, to call about once a second: evicts idle subjects and counts instructions
    /// that expired. Returns how many subjects were evicted.
    pub fn tick(&self) -> usize {
        let now = self.clock.now();
        let rules = self.rules.load();
        for bucket in rules.buckets() {
            if rules::note_expiry(&bucket.state, now) {
                self.expired.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    service = bucket.service(),
                    bucket = bucket.name(),
                    "drop-ratio instruction expired; admitting everything until the control plane sends a new one"
                );
            }
        }
        rules.sweep(now)
    }

    /// Instructions that expired before a newer one arrived.
    pub fn instructions_expired(&self) -> u64 {
        self.expired.load(Ordering::Relaxed)
    }

    /// A reading of every bucket in force.
    pub fn stats(&self) -> Vec<BucketStats> {
        let now = self.clock.now();
        let rules = self.rules.load();
        rules
            .buckets()
            .iter()
            .map(|b| BucketStats {
                service: b.service().to_owned(),
                bucket: b.name().to_owned(),
                mode: b.mode(),
                algorithm: b.algorithm(),
                limit: b.limit(),
                counters: b.counters.snapshot(),
                drop_ratio: rules::drop_ratio(&b.state, now),
                subjects: b.subjects(),
                subject_overflow: b.subject_overflow(),
            })
            .collect()
    }
}

// Only with the feature: a client built without Redis has no breaker to report, and a stand-in
// `BreakerStats` of its own would be a second type of that name. Code that reads the breaker is
// Redis code, so its crate turns the feature on (as the sidecar's metrics do); since features
// only add items, that never breaks a crate built against the client without it.
#[cfg(feature = "redis")]
impl Client {
    /// The Redis store's circuit breaker (`spillway_circuit_state`, `spillway_store_errors_total`),
    /// when the rules have a `redis` section. Only with the `redis` feature.
    pub fn store_stats(&self) -> Option<spillway_redis::BreakerStats> {
        self.rules().store.as_ref().map(|store| store.stats())
    }
}
