//! Propagation: a [`RulesWatcher`] follows the store and yields each new [`RuleSet`].
//!
//! On PostgreSQL it LISTENs on [`CHANNEL`]; NOTIFY is not durable, so after a lost connection
//! it resyncs by comparing the stored version with the one it holds. On SQLite the store that
//! commits wakes the watchers of the same file in this process. Both also poll the version every
//! second, which catches what a notification could miss (another process writing the SQLite
//! file, a change committed while the listener was reconnecting) and ends incident overrides on
//! time even when no rules service is running to delete them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use spillway_core::config::{Config, ConfigFile, ServiceFile, Services};
#[cfg(feature = "postgres")]
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::rule::{self, Rule};
#[cfg(feature = "postgres")]
use crate::store::CHANNEL;
use crate::store::local::local_channel;
use crate::store::{Backend, Store, StoreError, normalize};
use crate::time::now_millis;

const POLL: Duration = Duration::from_secs(1);

/// The rules at one version, compiled by core.
#[derive(Debug, Clone)]
pub struct RuleSet {
    pub version: i64,
    /// The live rules, incident overrides included, by service and name.
    pub rules: Vec<Rule>,
    /// The rules as one validated configuration. Its `redis` is `None` and its identity and
    /// control sections are the defaults: the consumer brings its own.
    pub config: Config,
}

impl RuleSet {
    /// Builds the set of `rules` that are live at `now` (Unix milliseconds).
    pub fn build(version: i64, rules: Vec<Rule>, now: i64) -> Result<RuleSet, StoreError> {
        let rules: Vec<Rule> = rules
            .into_iter()
            .filter(|r| r.expires_at.is_none_or(|at| at > now))
            .collect();
        let mut services: Vec<(String, Vec<Value>)> = Vec::new();
        for rule in &rules {
            let bucket = serde_json::to_value(&rule.bucket)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            match services.last_mut() {
                Some((service, buckets)) if *service == rule.service => buckets.push(bucket),
                _ => services.push((rule.service.clone(), vec![bucket])),
            }
        }
        let config = rule::validate(&services)
            .map_err(|e| StoreError::Corrupt(format!("the stored rules do not validate: {e}")))?;
        Ok(RuleSet {
            version,
            rules,
            config,
        })
    }

    /// The rules as a configuration file's model: their services and buckets, with the identity,
    /// control and redis sections of `base` (the consumer's own file; the store keeps only
    /// buckets).
    pub fn model(&self, base: &ConfigFile) -> ConfigFile {
        let mut services: Vec<(String, ServiceFile)> = Vec::new();
        for rule in &self.rules {
            match services.last_mut() {
                Some((name, service)) if *name == rule.service => {
                    service.buckets.push(rule.bucket.clone())
                }
                _ => services.push((
                    rule.service.clone(),
                    ServiceFile {
                        buckets: vec![rule.bucket.clone()],
                    },
                )),
            }
        }
        ConfigFile {
            version: base.version,
            identity: base.identity.clone(),
            control: base.control.clone(),
            services: Services(services),
            redis: base.redis.clone(),
        }
    }

    /// When the next incident override ends, if any does.
    fn next_expiry(&self) -> Option<i64> {
        self.rules.iter().filter_map(|r| r.expires_at).min()
    }
}

/// Follows a rules store and always holds its latest [`RuleSet`].
pub struct RulesWatcher {
    receiver: watch::Receiver<Arc<RuleSet>>,
    task: JoinHandle<()>,
}

impl Drop for RulesWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RulesWatcher {
    /// Connects to the store at `database_url`, loads the current rules, and follows them.
    pub async fn start(database_url: &str) -> Result<RulesWatcher, StoreError> {
        let (backend, _) = normalize(database_url)?;
        let store = Store::connect(database_url).await?;
        let (version, rules) = store.snapshot().await?;
        let first = Arc::new(RuleSet::build(version, rules, now_millis())?);
        let (sender, receiver) = watch::channel(first);
        let url = database_url.to_owned();
        let task = tokio::spawn(async move {
            match backend {
                #[cfg(feature = "postgres")]
                Backend::Postgres => follow_postgres(url, store, sender).await,
                // `normalize` refuses postgres:// URLs without the driver.
                #[cfg(not(feature = "postgres"))]
                Backend::Postgres => drop((url, store, sender)),
                Backend::Sqlite => follow_sqlite(store, sender).await,
            }
        });
        Ok(RulesWatcher { receiver, task })
    }

    /// The rules as last seen.
    pub fn current(&self) -> Arc<RuleSet> {
        self.receiver.borrow().clone()
    }

    /// Waits for a rule set newer than the last one this watcher returned, and returns it.
    pub async fn changed(&mut self) -> Arc<RuleSet> {
        if self.receiver.changed().await.is_err() {
            // The follower ended (its runtime is shutting down): nothing newer will come.
            std::future::pending::<()>().await;
        }
        self.receiver.borrow_and_update().clone()
    }

    /// A receiver of every new rule set, for consumers that select over several sources.
    pub fn subscribe(&self) -> watch::Receiver<Arc<RuleSet>> {
        self.receiver.clone()
    }
}

/// Reloads when the version moved or an override ended; keeps the last good set on errors.
async fn resync(store: &Store, sender: &watch::Sender<Arc<RuleSet>>) {
    let held = sender.borrow().clone();
    let now = now_millis();
    let expired = held.next_expiry().is_some_and(|at| at <= now);
    match store.version().await {
        Ok(version) if version == held.version && !expired => return,
        Ok(_) => {}
        Err(err) => {
            tracing::warn!(%err, "rules watcher: cannot read the rules version; keeping the last rules");
            return;
        }
    }
    match store.snapshot().await {
        Ok((version, rules)) => match RuleSet::build(version, rules, now_millis()) {
            Ok(set) => {
                tracing::info!(version, "rules watcher: new rules");
                sender.send_replace(Arc::new(set));
            }
            Err(err) => tracing::error!(%err, "rules watcher: keeping the last good rules"),
        },
        Err(err) => {
            tracing::warn!(%err, "rules watcher: cannot read the rules; keeping the last rules")
        }
    }
}

/// How long to sleep before the next poll: a second, or less when an override ends sooner.
fn next_wake(sender: &watch::Sender<Arc<RuleSet>>) -> Duration {
    let until_expiry = sender
        .borrow()
        .next_expiry()
        .map(|at| Duration::from_millis(u64::try_from(at - now_millis()).unwrap_or(0)));
    until_expiry.map_or(POLL, |d| d.min(POLL))
}

async fn follow_sqlite(store: Store, sender: watch::Sender<Arc<RuleSet>>) {
    let mut local = local_channel(&store_key(&store));
    loop {
        tokio::select! {
            _ = local.changed() => {}
            _ = tokio::time::sleep(next_wake(&sender)) => {}
        }
        resync(&store, &sender).await;
    }
}

fn store_key(store: &Store) -> String {
    store.local_key().to_owned()
}

#[cfg(feature = "postgres")]
async fn follow_postgres(url: String, store: Store, sender: watch::Sender<Arc<RuleSet>>) {
    let mut listener: Option<PgListener> = None;
    loop {
        if listener.is_none() {
            match PgListener::connect(&url).await {
                Ok(mut l) => match l.listen(CHANNEL).await {
                    Ok(()) => {
                        listener = Some(l);
                        // Whatever was committed while we were not listening.
                        resync(&store, &sender).await;
                    }
                    Err(err) => tracing::warn!(%err, "rules watcher: LISTEN failed"),
                },
                Err(err) => tracing::warn!(%err, "rules watcher: cannot connect to listen"),
            }
        }
        let wake = next_wake(&sender);
        match listener.as_mut() {
            Some(l) => {
                tokio::select! {
                    received = l.try_recv() => match received {
                        Ok(Some(_)) => {}
                        // The connection dropped; sqlx would reconnect on the next call, but we
                        // reconnect ourselves so that the resync runs after LISTEN is back.
                        Ok(None) | Err(_) => {
                            tracing::warn!("rules watcher: lost the LISTEN connection; reconnecting");
                            listener = None;
                        }
                    },
                    _ = tokio::time::sleep(wake) => {}
                }
            }
            None => tokio::time::sleep(wake.max(Duration::from_millis(200))).await,
        }
        resync(&store, &sender).await;
    }
}
