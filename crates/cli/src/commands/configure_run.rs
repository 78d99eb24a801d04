//! `spillway configure run --every D`: `apply --promote` on a schedule, and at once when the rules
//! change (the store's LISTEN/NOTIFY, through the rules watcher), with its counts on `--admin`.

use crate::duration::duration;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spillway_net::admin::{AdminAuth, AdminView, check_exposure};

use super::configure::{failure, usage};
use super::configure_apply::{ApplyArgs, apply_once};

/// Every action a run's step may take, so each series is there from the start.
const ACTIONS: [&str; 9] = [
    "create",
    "candidate",
    "retune",
    "withdraw",
    "validating",
    "promote",
    "due",
    "hold",
    "skip",
];

/// Runs closer together than this are one: a change of the configurator's own wakes it once more.
const MIN_GAP: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub apply: ApplyArgs,
    /// How often to plan and roll out (`1h`, `5m`); a run also starts at once when the rules
    /// change.
    #[arg(long, value_parser = duration)]
    pub every: Duration,
    /// The rules store to follow for changes (`sqlite://PATH` or `postgres://...`); default the
    /// store of a `builtin:` source. Without either, only the schedule starts runs.
    #[arg(long, value_name = "URL")]
    pub database: Option<String>,
    /// Serve /healthz, /readyz and /metrics (spillway_configurator_*) here (loopback).
    #[arg(long)]
    pub admin: Option<SocketAddr>,
}

type Labels = Vec<(&'static str, String)>;

/// What the admin port shows.
#[derive(Default)]
struct Counts {
    steps: BTreeMap<&'static str, u64>,
    held: u64,
    runs_ok: u64,
    runs_failed: u64,
    last_run_s: Option<f64>,
}

struct View(Mutex<Counts>);

impl AdminView for View {
    fn ready(&self) -> Result<String, String> {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match counts.last_run_s {
            Some(_) => Ok(format!("{} runs", counts.runs_ok + counts.runs_failed)),
            None => Err("the first run has not finished".to_owned()),
        }
    }

    fn metrics(&self) -> String {
        let counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut registry = Registry::default();
        let steps = Family::<Labels, Counter>::default();
        for action in ACTIONS {
            let n = counts.steps.get(action).copied().unwrap_or(0);
            steps
                .get_or_create(&vec![("action", action.to_owned())])
                .inc_by(n);
        }
        registry.register(
            "spillway_configurator_proposals",
            "Rollout steps taken, by action",
            steps,
        );
        let held = Counter::<u64>::default();
        held.inc_by(counts.held);
        registry.register(
            "spillway_configurator_held",
            "Shadow buckets held at the end of their validation window",
            held,
        );
        let runs = Family::<Labels, Counter>::default();
        for (result, n) in [("ok", counts.runs_ok), ("failed", counts.runs_failed)] {
            runs.get_or_create(&vec![("result", result.to_owned())])
                .inc_by(n);
        }
        registry.register(
            "spillway_configurator_runs",
            "Runs, by whether every step went through",
            runs,
        );
        if let Some(at) = counts.last_run_s {
            let last = Gauge::<f64, AtomicU64>::default();
            last.set(at);
            registry.register(
                "spillway_configurator_last_run_timestamp_seconds",
                "When the last run ended",
                last,
            );
        }
        drop(counts);
        let mut out = String::new();
        let _ = encode(&mut out, &registry);
        out
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub fn run(args: &RunArgs) -> ExitCode {
    if args.every < MIN_GAP {
        return usage(format!(
            "--every {:?}: give at least 1s, like 1h or 5m",
            args.every
        ));
    }
    if let Some(addr) = args.admin
        && let Err(err) = check_exposure(addr, &AdminAuth::default())
    {
        return usage(format!("--admin: {err}"));
    }
    let follow = args.database.clone().or_else(|| {
        args.apply
            .plan
            .source
            .strip_prefix("builtin:")
            .map(str::to_owned)
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return failure(format!("cannot start a runtime: {err}")),
    };
    let view = Arc::new(View(Mutex::new(Counts::default())));
    let (wake_tx, wake) = std::sync::mpsc::channel::<&'static str>();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    let started = runtime.block_on(async {
        let admin = spillway_net::admin::start_if(
            args.admin,
            AdminAuth::default(),
            view.clone(),
            stop_rx.clone(),
            &mut tasks,
        )
        .await
        .map_err(|e| usage(format!("--admin: {e}")))?;
        if let Some(addr) = admin {
            tracing::info!(%addr, "configurator admin port");
        }
        let watcher = match &follow {
            Some(url) => Some(
                spillway_rules::RulesWatcher::start(url)
                    .await
                    .map_err(|e| failure(format!("cannot follow the rules store: {e}")))?,
            ),
            None => None,
        };
        if let Some(watcher) = &watcher {
            let mut changes = watcher.subscribe();
            let tx = wake_tx.clone();
            tasks.push(tokio::spawn(async move {
                while changes.changed().await.is_ok() {
                    if tx.send("the rules changed").is_err() {
                        return;
                    }
                }
            }));
        }
        let tx = wake_tx.clone();
        tasks.push(tokio::spawn(async move {
            super::stop_signal().await;
            let _ = tx.send("stop");
        }));
        Ok::<_, ExitCode>(watcher)
    });
    let _watcher = match started {
        Ok(watcher) => watcher,
        Err(code) => return code,
    };
    let mut first = true;
    loop {
        let began = Instant::now();
        let mut next = began + args.every;
        match apply_once(&args.apply, true) {
            Ok(done) => {
                // A window that ends before the schedule's next run wakes one then.
                if let Some(due) = done.next_due {
                    next = next.min(Instant::now() + due);
                }
                let mut counts = view.0.lock().unwrap_or_else(|p| p.into_inner());
                for action in &done.actions {
                    *counts.steps.entry(action).or_default() += 1;
                }
                counts.held += done.actions.iter().filter(|a| **a == "hold").count() as u64;
                if done.failed > 0 {
                    counts.runs_failed += 1;
                } else {
                    counts.runs_ok += 1;
                }
                counts.last_run_s = Some(unix_now());
            }
            // Bad input shows at the first run: stop. Later, a run that could not be made (the
            // rules service or the store down) is counted and the next one tried.
            Err(code) if first => {
                let _ = stop_tx.send(true);
                return code;
            }
            Err(_) => {
                let mut counts = view.0.lock().unwrap_or_else(|p| p.into_inner());
                counts.runs_failed += 1;
                counts.last_run_s = Some(unix_now());
            }
        }
        first = false;
        std::thread::sleep(MIN_GAP.saturating_sub(began.elapsed()));
        let why = match wake.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Ok("stop") => break,
            Ok(why) => why,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if next < began + args.every => {
                "a validation window is over"
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => "the schedule",
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        // Changes that came together wake one run.
        let mut stop = false;
        while let Ok(more) = wake.try_recv() {
            stop |= more == "stop";
        }
        if stop {
            break;
        }
        tracing::info!("configurator run: {why}");
    }
    let _ = stop_tx.send(true);
    runtime.block_on(async {
        for task in tasks {
            task.abort();
        }
    });
    ExitCode::SUCCESS
}
