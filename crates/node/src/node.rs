//! `spillway up`: a single node in one process — the rules service on its store (SQLite in the
//! state directory unless a database URL is given), a controller following the store, one zone's
//! aggregator, and a sidecar linked to it, each with its admin endpoints.
//!
//! The configuration file seeds the store at every start (declaratively: a file that did not
//! change changes nothing) and gives the identity and control sections; rules changed through
//! the rules API reach the sidecar through the controller within seconds, like in a fleet.

use std::net::SocketAddr;
use std::path::PathBuf;

use spillway_client::control::{ControlOptions, LinkOptions};
use spillway_control::controller::{HISTORY_CHANNEL, HistorySink};
use spillway_control::{Aggregator, AggregatorOptions, Controller, ControllerOptions};
use spillway_proxy::{Proxy, ProxyOptions};
use spillway_rules::store::history::write_history_from;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::NodeError;
use crate::changes::follow_changes;
use crate::store::{StoreRules, seed_and_follow};

/// Where each part of the node listens.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub config: PathBuf,
    /// The SQLite store and the sidecar's last good rules live here.
    pub state_dir: PathBuf,
    /// `postgres://...` or `sqlite://...` instead of the state directory's SQLite file.
    pub database: Option<String>,
    pub upstream: String,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub rules_listen: SocketAddr,
    pub controller_listen: SocketAddr,
    pub controller_admin: SocketAddr,
    pub aggregator_listen: SocketAddr,
    pub aggregator_admin: SocketAddr,
    /// How long shutdown waits for the sidecar's requests in flight (`--drain-timeout`).
    pub drain_timeout: std::time::Duration,
    /// The controller's traffic history in the store (`--history-resolution`), and how long it
    /// is kept.
    pub history_resolution: std::time::Duration,
    pub history_retention: std::time::Duration,
}

/// A running node.
pub struct Node {
    pub proxy: Proxy,
    pub aggregator: Aggregator,
    pub controller: Controller,
    pub rules_addr: SocketAddr,
    /// An admin token for the rules API, when this start created the store.
    pub admin_token: Option<String>,
    rules: StoreRules,
    rules_stop: watch::Sender<bool>,
    rules_task: JoinHandle<()>,
    /// Reads the audit log for the dashboard's list of changes.
    changes_task: JoinHandle<()>,
    /// Writes the controller's traffic history into the store.
    history_task: JoinHandle<()>,
}

impl Node {
    pub async fn start(options: NodeOptions) -> Result<Node, NodeError> {
        let yaml = std::fs::read_to_string(&options.config).map_err(|e| {
            NodeError::Config(format!("cannot read {}: {e}", options.config.display()))
        })?;
        std::fs::create_dir_all(&options.state_dir).map_err(|source| NodeError::StateDir {
            path: options.state_dir.clone(),
            source,
        })?;
        let url = options.database.clone().unwrap_or_else(|| {
            format!("sqlite://{}", options.state_dir.join("rules.db").display())
        });
        let rules = seed_and_follow(&url, &yaml, &options.config.display().to_string()).await?;

        let listen = |source| NodeError::Listen {
            addr: options.rules_listen,
            source,
        };
        let listener = tokio::net::TcpListener::bind(options.rules_listen)
            .await
            .map_err(listen)?;
        let rules_addr = listener.local_addr().map_err(listen)?;
        let (rules_stop, mut stopped) = watch::channel(false);
        let store = rules.store.clone();
        let rules_task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.changed().await;
            };
            if let Err(err) = spillway_rules::serve(listener, store, shutdown).await {
                tracing::error!("rules service failed: {err}");
            }
        });

        let (changes, changes_task) = follow_changes(rules.store.clone(), rules.rules.clone());
        let mut controller =
            ControllerOptions::new(options.controller_listen, "local", rules.rules.clone());
        controller.admin = Some(options.controller_admin);
        controller.changes = Some(changes);
        let (slots, history) = tokio::sync::mpsc::channel(HISTORY_CHANNEL);
        let history_task = tokio::spawn(write_history_from(
            rules.store.clone(),
            "local".to_owned(),
            history,
            options.history_retention,
        ));
        controller.history = Some(HistorySink {
            resolution: options.history_resolution,
            slots,
        });
        let controller = Controller::start(controller).await?;
        let mut aggregator = AggregatorOptions::new(
            options.aggregator_listen,
            "local",
            "local-a",
            format!("http://{}", controller.local_addr()),
        );
        aggregator.admin = Some(options.aggregator_admin);
        let aggregator = Aggregator::start(aggregator).await?;
        let mut proxy = ProxyOptions::new(options.config.clone(), options.listen, options.upstream);
        proxy.drain_timeout = options.drain_timeout;
        proxy.admin = Some(options.admin);
        let mut control = ControlOptions::new(LinkOptions::new(
            format!("http://{}", aggregator.local_addr()),
            "local-1",
            "local",
            "local-a",
        ));
        control.state_dir = Some(options.state_dir.join("sidecar"));
        proxy.control = Some(control);
        let proxy = Proxy::start(proxy).await?;
        Ok(Node {
            proxy,
            aggregator,
            controller,
            rules_addr,
            admin_token: rules.admin_token.clone(),
            rules,
            rules_stop,
            rules_task,
            changes_task,
            history_task,
        })
    }

    /// Drains the sidecar, then stops the control plane and the rules service.
    pub async fn shutdown(self) {
        self.proxy.shutdown().await;
        self.aggregator.shutdown().await;
        self.controller.shutdown().await;
        self.changes_task.abort();
        // The controller's sender went with it: the writer stores what it holds, then ends.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.history_task).await;
        self.rules_stop.send_replace(true);
        let _ = self.rules_task.await;
        self.rules.store.close().await;
    }
}
