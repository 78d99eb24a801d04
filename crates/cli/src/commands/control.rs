//! `spillway aggregator` and `spillway controller`: wiring only, the work is in
//! `spillway-control`.

use std::future::Future;
use std::process::ExitCode;

use anyhow::Context;
use spillway_control::controller::{HISTORY_CHANNEL, HistorySink};
use spillway_control::rules::DEFAULT_POLL;
use spillway_control::{
    Aggregator, AggregatorOptions, ControlError, Controller, ControllerOptions, FileRules,
};
use spillway_core::config::{ConfigFile, Services};
use spillway_db::lease::{LeaseCandidate, LeaseStore, campaign};
#[cfg(feature = "rls")]
use spillway_rls::{Rlqs, RlqsLimits};
use spillway_rules::store::history::write_history_from;
#[cfg(feature = "rls")]
use spillway_tls::SanPolicy;

use super::trust::{self, Place};
use crate::args::{AggregatorArgs, ControllerArgs};

/// Runs a zone's aggregator until SIGTERM or SIGINT.
pub fn aggregator(args: AggregatorArgs) -> ExitCode {
    on_runtime("aggregator", async move {
        fd_limit(args.grpc.grpc_max_connections.get());
        let place = Place {
            region: args.region,
            zone: args.zone,
            host: None,
        };
        let transport = trust::role(
            "aggregator",
            place,
            Some(args.listen),
            args.admin,
            args.admin_token_file.as_deref(),
            &args.tls,
        )
        .map_err(Failure::Usage)?;
        let (Some(region), Some(zone)) = (transport.place.region, transport.place.zone) else {
            return Err(Failure::Usage(
                "give --region and --zone, or a --tls-cert that names them".into(),
            ));
        };
        if let Some(addr) = args.rlqs_listen {
            trust::rlqs_listener(addr, transport.tls.is_some(), &args.tls)
                .map_err(Failure::Usage)?;
        }
        // Bound before the aggregator starts, so a port in use stops the start.
        #[cfg_attr(not(feature = "rls"), allow(unused_variables))]
        let rlqs_listener = match args.rlqs_listen {
            Some(addr) => Some(
                spillway_net::bind(addr)
                    .await
                    .map_err(|err| Failure::Runtime(format!("--rlqs-listen: {err}")))?,
            ),
            None => None,
        };
        let drain = args.drain_timeout;
        #[cfg_attr(not(feature = "rls"), allow(unused_variables))]
        let rlqs_tls = transport.tls.clone();
        let mut controllers = args.controllers.into_iter();
        let first = controllers
            .next()
            .ok_or_else(|| Failure::Usage("give --controller".into()))?;
        let mut options = AggregatorOptions::new(args.listen, region, zone, first);
        options.standby_controllers = controllers.collect();
        options.admin = args.admin;
        options.admin_auth = transport.admin;
        options.tls = transport.tls;
        let grpc = args.grpc.limits();
        options.grpc = grpc;
        let aggregator = Aggregator::start(options).await.map_err(failure)?;
        // Envoy's RLQS: each host (an identity, or a connection) a client of this zone.
        // Without the `rls` feature, --rlqs-listen was refused above.
        #[cfg(feature = "rls")]
        let rlqs = rlqs_listener.map(|(listener, addr)| {
            let service = Rlqs::new(aggregator.local_clients())
                .with_allowed_sans(SanPolicy::new(args.allow_client_san))
                .with_limits(RlqsLimits {
                    streams_per_host: args.rlqs_max_streams_per_host.get(),
                    buckets_per_host: args.rlqs_max_buckets_per_host.get(),
                    buckets: args.rlqs_max_buckets.get(),
                })
                .with_release(spillway_net::memory::return_free_memory);
            tracing::info!(%addr, "serving Envoy's rate limit quota service (RLQS v3)");
            spillway_rls::serve_rlqs_with(listener, service, rlqs_tls, grpc)
        });
        super::stop_signal().await;
        tracing::info!("stopping: closing client and controller streams");
        #[cfg(feature = "rls")]
        if let Some(rlqs) = rlqs {
            rlqs.shutdown().await;
        }
        aggregator.shutdown_within(drain).await;
        Ok(())
    })
}

/// Runs a region's controller until SIGTERM or SIGINT.
pub fn controller(args: ControllerArgs) -> ExitCode {
    on_runtime("controller", async move {
        let place = Place {
            region: args.region.clone(),
            ..Place::default()
        };
        let transport = trust::role(
            "controller",
            place,
            Some(args.listen),
            args.admin,
            args.admin_token_file.as_deref(),
            &args.tls,
        )
        .map_err(Failure::Usage)?;
        let Some(region) = transport.place.region else {
            return Err(Failure::Usage(
                "give --region, or a --tls-cert that names it".into(),
            ));
        };
        // Held for as long as the controller runs: dropping it stops following the store.
        let mut _watcher = None;
        let mut history = None;
        // With a store, the dashboard's recent changes: its audit log, read on each version.
        let mut changes = None;
        let rules = match (&args.config, &args.database) {
            (Some(path), _) => FileRules::load(path).map_err(failure)?.watch(DEFAULT_POLL),
            (None, Some(url)) => {
                let watcher = spillway_rules::RulesWatcher::start(url)
                    .await
                    .map_err(|e| {
                        Failure::Usage(format!("cannot follow the rules store {url}: {e}"))
                    })?;
                // The store keeps buckets only and the controller has no file here: its rules
                // run with the default identity and control sections.
                let base = ConfigFile {
                    version: 1,
                    identity: Default::default(),
                    control: Default::default(),
                    services: Services::default(),
                    redis: None,
                };
                let rules = spillway_rules::follow(&watcher, base)
                    .map_err(|e| failure(ControlError::from(e)))?;
                _watcher = Some(watcher);
                let store = spillway_rules::Store::connect(url).await.map_err(|e| {
                    Failure::Usage(format!("cannot open the rules store {url}: {e}"))
                })?;
                changes = Some(spillway_node::follow_changes(store, rules.clone()));
                history = Some(
                    history_writer(
                        url,
                        &region,
                        args.history_resolution,
                        args.history_retention,
                    )
                    .await?,
                );
                rules
            }
            (None, None) => unreachable!("clap requires -c or --database"),
        };
        let drain = args.drain_timeout;
        let lease = match &args.lease_store {
            None => None,
            Some(url) => {
                let interval = rules.borrow().config.control.report_interval;
                let ttl = args.lease_ttl.unwrap_or(interval * 3);
                if ttl <= interval {
                    return Err(Failure::Usage(format!(
                        "--lease-ttl {} is not longer than the report interval ({} ms): a leader would lose its lease between two intervals; three intervals is usual",
                        args.lease_ttl
                            .map_or(String::new(), |t| format!("{} ms", t.as_millis())),
                        interval.as_millis()
                    )));
                }
                let scheme = if transport.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                let address = args
                    .advertise
                    .clone()
                    .unwrap_or_else(|| format!("{scheme}://{}", args.listen));
                let candidate = LeaseCandidate::new(region.clone(), address, ttl);
                let store = LeaseStore::open(url, candidate.period())
                    .await
                    .map_err(|e| {
                        Failure::Usage(format!("cannot open the lease store {url}: {e}"))
                    })?;
                let (stop, stop_rx) = tokio::sync::watch::channel(false);
                tracing::info!(store = %url, ttl_ms = ttl.as_millis() as u64, advertise = %candidate.address, "campaigning for the controller lease");
                let (leadership, task) = campaign(store, candidate, stop_rx);
                Some((leadership, stop, task))
            }
        };
        let mut options = ControllerOptions::new(args.listen, region, rules);
        options.leadership = lease.as_ref().map(|(rx, _, _)| rx.clone());
        options.peers = args.peers;
        options.admin = args.admin;
        options.admin_auth = transport.admin;
        options.tls = transport.tls;
        options.grpc = args.grpc.limits();
        options.history = history.as_ref().map(|(sink, _)| sink.clone());
        options.changes = changes.as_ref().map(|(rx, _)| rx.clone());
        let controller = Controller::start(options).await.map_err(failure)?;
        super::stop_signal().await;
        if let Some((_, stop, task)) = lease {
            // First: a standby takes the lease at its next claim instead of when it lapses.
            tracing::info!("stopping: releasing the controller lease");
            stop.send_replace(true);
            let _ = task.await;
        }
        tracing::info!("stopping: closing aggregator and peer streams");
        controller.shutdown_within(drain).await;
        if let Some((_, task)) = changes {
            task.abort();
        }
        if let Some((sink, writer)) = history {
            // The controller's sender is gone with it; the writer stores what it holds and ends.
            drop(sink);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
        }
        Ok(())
    })
}

/// The rules store the controller writes its region's history into (the configurator's `builtin:`
/// source), through a writer task of its own.
async fn history_writer(
    url: &str,
    region: &str,
    resolution: std::time::Duration,
    retention: std::time::Duration,
) -> Result<(HistorySink, tokio::task::JoinHandle<()>), Failure> {
    let store = spillway_rules::Store::connect(url)
        .await
        .map_err(|e| Failure::Usage(format!("cannot open the rules store {url}: {e}")))?;
    let (slots, rx) = tokio::sync::mpsc::channel(HISTORY_CHANNEL);
    let writer = tokio::spawn(write_history_from(store, region.to_owned(), rx, retention));
    Ok((HistorySink { resolution, slots }, writer))
}

enum Failure {
    /// Bad usage or configuration: exit 2.
    Usage(String),
    /// Anything else: exit 1.
    Runtime(String),
}

fn failure(err: ControlError) -> Failure {
    if err.is_usage() {
        Failure::Usage(err.to_string())
    } else {
        Failure::Runtime(err.to_string())
    }
}

fn on_runtime(name: &str, work: impl Future<Output = Result<(), Failure>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("spillway {name}: {err:#}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("spillway {name}: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(message)) => {
            eprintln!("spillway {name}: {message}");
            ExitCode::from(1)
        }
    }
}

/// Descriptors an aggregator keeps for everything but its hosts' connections.
const FD_RESERVE: u64 = 256;

/// Raises the soft descriptor limit to the hard one: each host holds a connection open, and the
/// distributions' default soft limit of 1,024 stops a zone far below --grpc-max-connections.
/// What is still short of `connections` is said at the start rather than found as EMFILE.
fn fd_limit(connections: usize) {
    match spillway_proxy::raise_fd_limit() {
        Ok(limit) => {
            tracing::info!("file descriptor limit: {limit}");
            let needed = connections as u64 + FD_RESERVE;
            if let Some(soft) = limit.soft
                && soft < needed
            {
                tracing::warn!(
                    "the file descriptor limit ({limit}) is below the {needed} that --grpc-max-connections {connections} needs: connections beyond about {} will fail to be accepted; raise the hard limit (ulimit -Hn, systemd's LimitNOFILE=) or lower --grpc-max-connections",
                    soft.saturating_sub(FD_RESERVE)
                );
            }
        }
        Err(err) => tracing::warn!(
            "cannot raise the file descriptor limit to its hard limit ({err}); the soft limit stays"
        ),
    }
}
