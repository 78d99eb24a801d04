//! `spillway demo`: the whole system in one process on embedded defaults, under a 15x surge.
//!
//! An SQLite rules store in a temporary folder, seeded with [`demo_rules`]; one controller
//! following it; two zones with an aggregator each; four sidecars (two per zone) in front of one
//! upstream; and a load generator that offers `shop/checkout` 120/s (below its 200/s global limit)
//! and then, a quarter into the run, 1,800/s: 15x the base and 9x the limit. `shop/browse` runs
//! steadily below its limit throughout, and a trickle of direct requests measures the upstream's
//! own latency. The controller's dashboard is served on [`DASHBOARD`] (or a free port when that
//! one is taken) for as long as the demo runs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use spillway_client::control::{ControlOptions, LinkOptions};
use spillway_control::{Aggregator, AggregatorOptions, Controller, ControllerOptions};
use spillway_node::{StoreRules, follow_changes, seed_and_follow};
use spillway_proxy::{Proxy, ProxyOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::DemoError;
use crate::load::{self, Recorder, Stream};
use crate::summary::{BucketPlan, Summary};
use crate::view::{Row, View};

/// The surged bucket's limit, and its base and surge rates.
pub const LIMIT_RPS: f64 = 200.0;
pub const BASE_RPS: f64 = 120.0;
pub const SURGE_FACTOR: f64 = 15.0;
/// The steady bucket's limit and rate.
pub const BROWSE_LIMIT_RPS: f64 = 400.0;
pub const BROWSE_RPS: f64 = 80.0;
/// Direct requests a second, for the latency baseline.
const DIRECT_RPS: f64 = 50.0;
/// Where the controller's dashboard is served: `spillway up`'s default controller admin port.
pub const DASHBOARD: &str = "127.0.0.1:9902";

/// The demo's rules: two global drop-ratio buckets, reports every `interval`.
pub fn demo_rules(interval: Duration) -> String {
    format!(
        "version: 1\n\
         control:\n  report_interval: {}ms\n  instruction_ttl: 3s\n\
         services:\n  shop:\n    buckets:\n\
         \x20     - {{ name: checkout, match: {{ procedure: /checkout }}, limit: {}/s, scope: global }}\n\
         \x20     - {{ name: browse, match: {{ procedure: /browse }}, limit: {}/s, scope: global }}\n",
        interval.as_millis(),
        LIMIT_RPS as u64,
        BROWSE_LIMIT_RPS as u64,
    )
}

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub seconds: u64,
    /// Where the chart goes; the temporary folder's parent (the system's temp dir) by default.
    pub out: Option<PathBuf>,
    pub report_interval: Duration,
    /// Redraw a live view on a terminal; otherwise print a plain line every second.
    pub terminal: bool,
    /// Start the surge this far into a report interval (0 to 1), a little after a quarter of
    /// the run; `None` starts it at a quarter of the run, wherever in its interval that falls.
    /// The enforcement delay depends on it: a surge near an interval's start is reported whole
    /// one interval later, one in the middle is seen from the interval's tail half an interval
    /// later.
    pub surge_phase: Option<f64>,
    /// The controller's admin listener with the dashboard ([`DASHBOARD`] by default); a free
    /// port on loopback when this one is taken. `None` serves none.
    pub dashboard: Option<SocketAddr>,
}

impl DemoOptions {
    pub fn new(seconds: u64) -> Self {
        Self {
            seconds,
            out: None,
            report_interval: Duration::from_millis(250),
            terminal: false,
            surge_phase: None,
            dashboard: DASHBOARD.parse().ok(),
        }
    }
}

/// Runs the demo for `options.seconds`, drawing the view on stderr; returns the summary with the
/// chart written.
pub async fn run(options: DemoOptions) -> Result<Summary, DemoError> {
    Demo::start(options).await?.run().await
}

/// The demo's fleet, started and linked, before the load.
pub struct Demo {
    options: DemoOptions,
    /// The rules file and the sidecars' state live in it.
    dir: tempfile::TempDir,
    store: StoreRules,
    changes_task: JoinHandle<()>,
    controller: Controller,
    aggregators: Vec<Aggregator>,
    proxies: Vec<Proxy>,
    upstream: SocketAddr,
    upstream_task: JoinHandle<()>,
    stop_tx: watch::Sender<bool>,
}

impl Demo {
    /// Starts the rules store, the controller (with its dashboard), the zones, the sidecars and
    /// the upstream, and waits until every sidecar is linked.
    pub async fn start(options: DemoOptions) -> Result<Demo, DemoError> {
        let dir = tempfile::Builder::new()
            .prefix("spillway-demo-")
            .tempdir()
            .map_err(DemoError::io("the demo's temporary folder"))?;
        let yaml = demo_rules(options.report_interval);
        let rules_file = dir.path().join("demo.yaml");
        std::fs::write(&rules_file, &yaml).map_err(DemoError::io("the demo's rules file"))?;
        let url = format!("sqlite://{}", dir.path().join("rules.db").display());
        let store = seed_and_follow(&url, &yaml, "the demo rules").await?;
        let (changes, changes_task) = follow_changes(store.store.clone(), store.rules.clone());

        let any: SocketAddr = "127.0.0.1:0".parse().expect("a socket address");
        let controller_options = |admin| {
            let mut c = ControllerOptions::new(any, "demo", store.rules.clone());
            c.admin = admin;
            c.changes = Some(changes.clone());
            c
        };
        let controller = match Controller::start(controller_options(options.dashboard)).await {
            Err(spillway_control::ControlError::Bind(e)) if Some(e.addr) == options.dashboard => {
                tracing::info!("{} is taken: the dashboard goes on a free port", e.addr);
                Controller::start(controller_options(Some(any))).await?
            }
            started => started?,
        };
        let controller_url = format!("http://{}", controller.local_addr());
        let mut aggregators = Vec::new();
        for zone in ["zone-a", "zone-b"] {
            let options = AggregatorOptions::new(any, "demo", zone, &controller_url);
            aggregators.push(Aggregator::start(options).await?);
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let (upstream, upstream_task) = load::upstream(stop_rx).await?;
        let mut proxies = Vec::new();
        for i in 0..4 {
            let (zone, aggregator) = if i < 2 {
                ("zone-a", &aggregators[0])
            } else {
                ("zone-b", &aggregators[1])
            };
            let mut options =
                ProxyOptions::new(rules_file.clone(), any, format!("http://{upstream}"));
            options.drain_timeout = Duration::from_secs(1);
            let link = LinkOptions::new(
                format!("http://{}", aggregator.local_addr()),
                format!("sidecar-{}", i + 1),
                "demo",
                zone,
            );
            let mut control = ControlOptions::new(link);
            control.state_dir = Some(dir.path().join(format!("sidecar-{}", i + 1)));
            options.control = Some(control);
            proxies.push(Proxy::start(options).await?);
        }
        wait_linked(&controller, &proxies).await;
        Ok(Demo {
            options,
            dir,
            store,
            changes_task,
            controller,
            aggregators,
            proxies,
            upstream,
            upstream_task,
            stop_tx,
        })
    }

    /// Where the controller's dashboard is served, if it is.
    pub fn dashboard(&self) -> Option<SocketAddr> {
        self.controller.admin_addr()
    }

    /// Runs the load for `options.seconds`, drawing the view on stderr, then stops the fleet;
    /// returns the summary with the chart written.
    pub async fn run(self) -> Result<Summary, DemoError> {
        let Demo {
            options,
            dir,
            store,
            changes_task,
            controller,
            aggregators,
            proxies,
            upstream,
            upstream_task,
            stop_tx,
        } = self;
        let seconds = options.seconds.max(4);
        let run = Duration::from_secs(seconds);
        let mut surge_at = (seconds as f64 * 0.25).max(2.0);
        let recorder = Recorder::new(2, run + Duration::from_secs(1));
        // Where in its report interval the surge begins: intervals are aligned to the wall clock.
        let start_ms = spillway_link::now_ms() as f64;
        let interval_ms = options.report_interval.as_millis().max(1) as f64;
        let phase_of = |at: f64| ((start_ms + at * 1000.0) % interval_ms) / interval_ms;
        if let Some(wanted) = options.surge_phase {
            let shift = (wanted.clamp(0.0, 1.0) - phase_of(surge_at)).rem_euclid(1.0);
            surge_at += shift * interval_ms / 1000.0;
        }
        let surge_phase = phase_of(surge_at);
        let end = recorder.start + run;
        let targets: Vec<_> = proxies.iter().map(Proxy::addr).collect();
        let streams = [
            Stream {
                path: "/checkout".into(),
                series: 0,
                targets: targets.clone(),
                direct: false,
                rate: Box::new(move |t| {
                    if t < surge_at {
                        BASE_RPS
                    } else {
                        BASE_RPS * SURGE_FACTOR
                    }
                }),
            },
            Stream {
                path: "/browse".into(),
                series: 1,
                targets,
                direct: false,
                rate: Box::new(|_| BROWSE_RPS),
            },
            Stream {
                path: "/direct".into(),
                series: 0,
                targets: vec![upstream],
                direct: true,
                rate: Box::new(|_| DIRECT_RPS),
            },
        ];
        let generators: Vec<_> = streams
            .into_iter()
            .map(|s| tokio::spawn(load::run_stream(s, recorder.clone(), end)))
            .collect();

        let plans = [
            BucketPlan {
                name: "shop/checkout",
                limit: LIMIT_RPS,
            },
            BucketPlan {
                name: "shop/browse",
                limit: BROWSE_LIMIT_RPS,
            },
        ];
        let mut view = View::new(seconds, options.terminal);
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        while Instant::now() < end {
            tick.tick().await;
            let now_bin = recorder.bin(Instant::now());
            let from = now_bin.saturating_sub(20);
            let rows: Vec<Row> = plans
                .iter()
                .enumerate()
                .map(|(i, plan)| {
                    let (offered, admitted) = recorder.series[i].rates(from, now_bin);
                    let bucket = plan.name.split_once('/').map_or(plan.name, |(_, b)| b);
                    Row {
                        name: plan.name,
                        limit: plan.limit,
                        offered,
                        admitted,
                        drop_ratio: mean_drop_ratio(&proxies, bucket),
                    }
                })
                .collect();
            view.update(recorder.start.elapsed(), &rows);
        }
        view.finish();
        for g in generators {
            let _ = g.await;
        }
        // Let the last requests come back before the numbers are read.
        tokio::time::sleep(Duration::from_millis(300)).await;

        let out = match options.out {
            Some(dir) => dir,
            None => std::env::temp_dir(),
        };
        std::fs::create_dir_all(&out).map_err(DemoError::io(format!("{}", out.display())))?;
        let chart = out.join("spillway-demo.svg");
        let summary = Summary::compute(
            &recorder,
            &plans,
            surge_at,
            surge_phase,
            seconds as f64,
            options.report_interval,
            chart.clone(),
        );
        crate::chart::write(&chart, &recorder, &plans[0], seconds as f64)?;

        for p in proxies {
            p.shutdown().await;
        }
        for a in aggregators {
            a.shutdown().await;
        }
        controller.shutdown().await;
        stop_tx.send_replace(true);
        let _ = upstream_task.await;
        changes_task.abort();
        drop(store);
        // The sidecars' state and the rules file lived in it until now.
        drop(dir);
        Ok(summary)
    }
}

/// Waits (at most 15 s) until every sidecar hears from the control plane with the store's rules.
async fn wait_linked(controller: &Controller, proxies: &[Proxy]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        let hosts = controller.hosts();
        let linked = proxies.iter().all(|p| {
            p.link_status().is_some_and(|s| {
                let ttl = p.client().rules().config().control.instruction_ttl;
                spillway_client::control::control_plane_live(&s, ttl) && s.rules_version() > 0
            })
        });
        if linked && hosts.len() == proxies.len() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!("not every sidecar linked within 15 s; running anyway");
}

/// The drop ratio the sidecars apply to `bucket`, averaged.
fn mean_drop_ratio(proxies: &[Proxy], bucket: &str) -> f64 {
    let ratios: Vec<f64> = proxies
        .iter()
        .filter_map(|p| {
            p.client()
                .stats()
                .into_iter()
                .find(|s| s.bucket == bucket)
                .and_then(|s| s.drop_ratio)
        })
        .collect();
    if ratios.is_empty() {
        0.0
    } else {
        ratios.iter().sum::<f64>() / ratios.len() as f64
    }
}
