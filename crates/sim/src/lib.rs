//! Spillway's fleet simulator: thousands of hosts in zones and regions, the real core
//! decisions and the real aggregator and controller computation, in simulated time.
//!
//! A run is deterministic for a seed: arrivals, delays, losses and coins all come from seeded
//! generators, and nothing reads the wall clock. [`run`] simulates one scenario with one
//! algorithm; [`output`] turns runs into a table, CSV and SVG charts.
//!
//! ```
//! use spillway_sim::{Algorithm, Scenario, run};
//! let scenario = Scenario::named("overload-1.5x", Some(40.0)).unwrap();
//! let result = run(&scenario, Algorithm::DropRatio, 7, &|_| {}).unwrap();
//! // 15K offered against 10K: the admitted rate settles near the limit.
//! assert!(result.metrics.steady_error.unwrap() < 0.05);
//! ```
#![forbid(unsafe_code)]

pub mod engine;
pub mod metrics;
pub mod output;
mod queue;
pub mod scenario;
pub mod shape;

pub use engine::{FleetSample, Network, TokenTrace, Trace};
pub use metrics::{Metrics, TierDrops, TokenFigures};
pub use scenario::{Answers, Failover, Scenario};
pub use shape::StepAndLeave;

/// Why a simulation could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("unknown scenario `{name}`; the scenarios are {}", scenario::NAMES.join(", "))]
    UnknownScenario { name: String },
    #[error(
        "unknown algorithm `{name}`; use drop-ratio, adaptive-token-bucket, central-counter or drop-ratio-coin"
    )]
    UnknownAlgorithm { name: String },
    #[error("a duration of {0} s is too short; simulate at least 5 s")]
    Duration(f64),
    #[error("`{name}` is the demo's fleet of four sidecars and takes no host count")]
    FixedFleet { name: &'static str },
    #[error("{hosts} hosts are too few for this scenario; give it at least {least}, one per zone")]
    Hosts { hosts: usize, least: usize },
    #[error(
        "`{scenario}` is a token budget of the control plane, a drop-ratio bucket: run it with drop-ratio or drop-ratio-coin, not {algorithm}"
    )]
    Unsupported {
        scenario: &'static str,
        algorithm: &'static str,
    },
    #[error("the simulated rules are invalid: {0}")]
    Rules(String),
    #[error("cannot write {path}: {message}")]
    Write { path: String, message: String },
}

/// The algorithms compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// The control plane's drop ratio, applied by each host's drop schedule (
    /// `spillway_core::algo::DropRatio`).
    DropRatio = 0,
    /// Each host refills at its share of the limit, shares from the controller.
    AdaptiveTokenBucket = 1,
    /// One exact token bucket in a central store, one round trip per request (Redis per
    /// request).
    CentralCounter = 2,
    /// Drop-ratio with an independent coin per request instead of the drop schedule: the
    /// baseline the schedule replaced.
    DropRatioCoin = 3,
}

impl Algorithm {
    /// What `spillway sim` compares by default.
    pub const ALL: [Algorithm; 3] = [
        Algorithm::DropRatio,
        Algorithm::AdaptiveTokenBucket,
        Algorithm::CentralCounter,
    ];

    /// Every algorithm, also those only asked for by name.
    pub const NAMED: [Algorithm; 4] = [
        Algorithm::DropRatio,
        Algorithm::AdaptiveTokenBucket,
        Algorithm::CentralCounter,
        Algorithm::DropRatioCoin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::DropRatio => "drop-ratio",
            Algorithm::AdaptiveTokenBucket => "adaptive-token-bucket",
            Algorithm::CentralCounter => "central-counter",
            Algorithm::DropRatioCoin => "drop-ratio-coin",
        }
    }

    pub fn from_name(name: &str) -> Result<Algorithm, SimError> {
        Algorithm::NAMED
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| SimError::UnknownAlgorithm {
                name: name.to_owned(),
            })
    }
}

/// One scenario run with one algorithm.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub scenario: Scenario,
    pub algorithm: Algorithm,
    pub seed: u64,
    pub trace: Trace,
    pub metrics: Metrics,
}

/// Runs `scenario` with `algorithm` and `seed` on the default network; `progress` is called
/// with 1 for every simulated second.
pub fn run(
    scenario: &Scenario,
    algorithm: Algorithm,
    seed: u64,
    progress: &dyn Fn(u64),
) -> Result<RunResult, SimError> {
    run_on(scenario, algorithm, Network::default(), seed, progress)
}

/// [`run`] on a given network.
pub fn run_on(
    scenario: &Scenario,
    algorithm: Algorithm,
    network: Network,
    seed: u64,
    progress: &dyn Fn(u64),
) -> Result<RunResult, SimError> {
    let trace = engine::Engine::new(scenario, algorithm, network, seed)?.run(progress);
    let metrics = Metrics::of(scenario, &trace);
    Ok(RunResult {
        scenario: scenario.clone(),
        algorithm,
        seed,
        trace,
        metrics,
    })
}

/// Runs every algorithm of `algorithms` on `scenario`, all at once (the cores share them), with a
/// progress bar on stderr when `progress_bar` is set.
pub fn run_all(
    scenario: &Scenario,
    algorithms: &[Algorithm],
    seed: u64,
    progress_bar: bool,
) -> Result<Vec<RunResult>, SimError> {
    let total = (scenario.duration_s.round() as u64) * algorithms.len() as u64;
    let bar = if progress_bar {
        indicatif::ProgressBar::new(total)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} simulated s ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(scenario.name);
    let tick = |n: u64| bar.inc(n);
    // All of them at once, whatever the cores: three runs on two cores take about two thirds
    // of their sum, where two at a time and then the third took the longest pair plus the third.
    let threads = algorithms.len().max(1);
    let mut results = Vec::new();
    for chunk in algorithms.chunks(threads) {
        let done: Vec<Result<RunResult, SimError>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|a| s.spawn(|| run(scenario, *a, seed, &tick)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        for r in done {
            results.push(r?);
        }
    }
    bar.finish_and_clear();
    Ok(results)
}
