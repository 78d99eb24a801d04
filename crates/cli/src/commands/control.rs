//! `spillway aggregator` and `spillway controller` (SPEC §1, G6, G7): wiring only, the work is in
//! `spillway-control`.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use spillway_control::rules::DEFAULT_POLL;
use spillway_control::{
    Aggregator, AggregatorOptions, ControlError, Controller, ControllerOptions, FileRules,
};
use spillway_loop::RulesSnapshot;
use spillway_core::config::{ConfigFile, Services};
use tokio::sync::watch;

use crate::args::{AggregatorArgs, ControllerArgs};

/// Runs a zone's aggregator until SIGTERM or SIGINT.
pub fn aggregator(args: AggregatorArgs) -> ExitCode {
    on_runtime("aggregator", async move {
        let mut options =
            AggregatorOptions::new(args.listen, args.region, args.zone, args.controller);
        options.admin = args.admin;
        let aggregator = Aggregator::start(options).await.map_err(failure)?;
        super::stop_signal().await;
        tracing::info!("stopping: closing client and controller streams");
        aggregator.shutdown().await;
        Ok(())
    })
}

/// Runs a region's controller until SIGTERM or SIGINT.
pub fn controller(args: ControllerArgs) -> ExitCode {
    on_runtime("controller", async move {
        // Held for as long as the controller runs: dropping it stops following the store.
        let mut _watcher = None;
        let rules = match (&args.config, &args.database) {
            (Some(path), _) => FileRules::load(path).map_err(failure)?.watch(DEFAULT_POLL),
            (None, Some(url)) => {
                let watcher = spillway_rules::RulesWatcher::start(url)
                    .await
                    .map_err(|e| {
                        Failure::Usage(format!("cannot follow the rules store {url}: {e}"))
                    })?;
                let rules = from_store(&watcher).map_err(failure)?;
                _watcher = Some(watcher);
                rules
            }
            (None, None) => unreachable!("clap requires -c or --database"),
        };
        let mut options = ControllerOptions::new(args.listen, args.region, rules);
        options.peers = args.peers;
        options.admin = args.admin;
        let controller = Controller::start(options).await.map_err(failure)?;
        super::stop_signal().await;
        tracing::info!("stopping: closing aggregator and peer streams");
        controller.shutdown().await;
        Ok(())
    })
}

/// Follows the rules service's store: each new rule set becomes a snapshot with the store's
/// version, rendered with the default control section.
fn from_store(
    watcher: &spillway_rules::RulesWatcher,
) -> Result<watch::Receiver<Arc<RulesSnapshot>>, ControlError> {
    let base = ConfigFile {
        version: 1,
        identity: Default::default(),
        control: Default::default(),
        services: Services::default(),
        redis: None,
    };
    let snapshot = move |set: &spillway_rules::RuleSet| {
        RulesSnapshot::from_model(u64::try_from(set.version).unwrap_or(0), &set.model(&base))
            .map(Arc::new)
    };
    let mut store = watcher.subscribe();
    let first = snapshot(&store.borrow_and_update()).map_err(ControlError::from)?;
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        while store.changed().await.is_ok() {
            let set = store.borrow_and_update().clone();
            match snapshot(&set) {
                Ok(rules) => {
                    tx.send_replace(rules);
                }
                Err(err) => tracing::error!("{err}; keeping the rules in force"),
            }
        }
    });
    Ok(rx)
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
