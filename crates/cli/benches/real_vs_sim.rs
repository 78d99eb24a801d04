//! Real processes against the simulator on one scenario shape (docs/control-plane.md, *Real
//! processes and the simulator*): four sidecars in two zones step 15x over a global limit, then
//! one leaves and its load moves to the other three.
//!
//! `cargo bench -p spillway-cli --bench real_vs_sim -- [RUNS] [SEEDS] [OUT]`
//!
//! Real: a controller, two aggregators and four `spillway proxy` processes of this build on
//! loopback, an upstream and an open-loop load generator (the demo's) in this process: 120/s
//! through the four (30/s each), 1,800/s from 3 s on, and 6 s later the fourth proxy gets
//! SIGTERM and its 450/s go to the other three. Reports every second, limit 200/s. Run `i` of
//! `RUNS` (default 5) starts its step at phase `(i + 0.5) / RUNS` of a report interval (rounded
//! to 0.1: intervals are aligned to the wall clock, and the load starts on an interval's start).
//!
//! Simulated: `spillway sim`'s `sidecar-leaves` scenario, the same shape at the same phases, over
//! seeds 1-`SEEDS` (default 20) each.
//!
//! Both are measured by [`spillway_sim::StepAndLeave`] on 100 ms samples. Prints a Markdown
//! table of ranges and writes `real-vs-sim.svg` (admitted over time of the real run and seed 1
//! at the middle phase) to `OUT` (default: the system's temporary folder). Every load is bounded:
//! a run lasts 15-16 s.

#[path = "../tests/all/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use plotters::prelude::*;
use spillway_demo::load::{BIN, Recorder, Stream, run_stream, upstream};
use spillway_sim::shape::SAMPLE_S;
use spillway_sim::{Algorithm, Scenario, StepAndLeave};
use support::fleet::{Proc, admin_get, aggregator, controller, linked_proxy, metric, wait_for};
use support::free_port;

const LIMIT: f64 = 200.0;
const BASE_RPS: f64 = 120.0;
const STEP_RPS: f64 = 1_800.0;
const STEP_AT: f64 = 3.0;
const LEAVE_AFTER: f64 = 6.0;
const END_AFTER: f64 = 12.0;
const PROXIES: usize = 4;
/// Samples of the chart's trailing window: 300 ms.
const CHART_WINDOW: usize = 3;

fn rules(limit: f64) -> String {
    format!(
        "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\nservices:\n  api:\n    buckets:\n      - {{ name: limited, limit: {limit}/s, scope: global }}\n"
    )
}

/// The controller, the aggregators and the proxies of one run; dropped, they are killed.
struct Fleet {
    _controller: Proc,
    _aggregators: Vec<Proc>,
    proxies: Vec<(Proc, u16, u16)>,
}

impl Fleet {
    fn start(dir: &Path, upstream: u16) -> Fleet {
        let controller_file = dir.join("rules.yaml");
        std::fs::write(&controller_file, rules(LIMIT)).unwrap();
        // A limit nobody reaches: only the controller's rules can make a proxy drop.
        let proxy_file = dir.join("proxy.yaml");
        std::fs::write(&proxy_file, rules(1_000_000.0)).unwrap();
        let controller_port = free_port();
        let controller = controller(controller_port, &controller_file, &[]);
        let zones = ["r1z1", "r1z2"];
        let aggregator_ports: Vec<u16> = zones.iter().map(|_| free_port()).collect();
        let aggregators = zones
            .iter()
            .zip(&aggregator_ports)
            .map(|(zone, port)| aggregator(*port, zone, controller_port, &[]))
            .collect();
        // Proxy `i` in zone `i % 2`, as the simulator spreads its hosts.
        let proxies = (0..PROXIES)
            .map(|i| {
                let zone = zones[i % 2];
                let host = format!("p{}", i + 1);
                linked_proxy(
                    dir,
                    &proxy_file,
                    upstream,
                    aggregator_ports[i % 2],
                    zone,
                    &host,
                )
            })
            .collect();
        let fleet = Fleet {
            _controller: controller,
            _aggregators: aggregators,
            proxies,
        };
        wait_for(
            Duration::from_secs(30),
            "every proxy linked and running the controller's limit",
            || {
                fleet.proxies.iter().all(|(_, _, admin)| {
                    let m = admin_get(*admin, "/metrics");
                    metric(&m, "spillway_control_plane_connected", "") == Some(1.0)
                        && metric(&m, "spillway_bucket_limit_rps", "bucket=\"limited\"")
                            == Some(LIMIT)
                })
            },
        );
        fleet
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One real run with its step at `phase` of a report interval: offered and admitted per 100 ms.
fn real_run(runtime: &tokio::runtime::Runtime, phase: f64) -> Vec<(u64, u64)> {
    let dir = tempfile::tempdir().unwrap();
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let (upstream_addr, _upstream) = runtime.block_on(upstream(stop_rx)).unwrap();
    let mut fleet = Fleet::start(dir.path(), upstream_addr.port());
    let step = STEP_AT + phase;
    let (leave, end) = (step + LEAVE_AFTER, step + END_AFTER);
    let mut leaver = fleet.proxies.pop().expect("four proxies");
    let recorder = runtime.block_on(async {
        // Start on an interval's start (intervals are aligned to the wall clock), so the step
        // falls at `phase` of its interval as in the simulator.
        tokio::time::sleep(Duration::from_millis(1_000 - unix_ms() % 1_000)).await;
        let recorder = Recorder::new(1, Duration::from_secs_f64(end + 1.0));
        let start = recorder.start;
        let mut generators = Vec::new();
        let targets = fleet
            .proxies
            .iter()
            .map(|p| (p.1, false))
            .chain([(leaver.1, true)]);
        for (port, leaves) in targets {
            let rate = move |t: f64| {
                if t < step {
                    BASE_RPS / PROXIES as f64
                } else if t < leave || leaves {
                    STEP_RPS / PROXIES as f64
                } else {
                    STEP_RPS / (PROXIES - 1) as f64
                }
            };
            let stream = Stream {
                path: "/".into(),
                series: 0,
                targets: vec![([127, 0, 0, 1], port).into()],
                direct: false,
                rate: Box::new(rate),
            };
            let until = start + Duration::from_secs_f64(if leaves { leave } else { end });
            generators.push(tokio::spawn(run_stream(stream, recorder.clone(), until)));
        }
        let leaving = tokio::task::spawn_blocking(move || {
            std::thread::sleep((start + Duration::from_secs_f64(leave)) - Instant::now());
            leaver.0.terminate();
        });
        for g in generators {
            let _ = g.await;
        }
        let _ = leaving.await;
        // Let the last answers come back.
        tokio::time::sleep(Duration::from_millis(300)).await;
        recorder
    });
    let series = &recorder.series[0];
    // The recorder's 50 ms bins, two to a sample.
    let per_sample = (SAMPLE_S / BIN.as_secs_f64()).round() as usize;
    let samples = (end / SAMPLE_S).floor() as usize;
    let count = |v: &[std::sync::atomic::AtomicU64], i: usize| -> u64 {
        v[i * per_sample..(i + 1) * per_sample]
            .iter()
            .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    };
    (0..samples)
        .map(|i| (count(&series.offered, i), count(&series.admitted, i)))
        .collect()
}

/// The simulator's run of the same shape at `phase` with `seed`: offered and admitted per 100 ms.
fn sim_run(phase: f64, seed: u64) -> Vec<(u64, u64)> {
    let mut s = Scenario::named("sidecar-leaves", None).expect("a scenario of the simulator");
    let step = STEP_AT + phase;
    s.step_from_s = step;
    s.host_leave = Some((PROXIES - 1, step + LEAVE_AFTER));
    s.duration_s = step + END_AFTER;
    s.step_to_s = s.duration_s;
    let run = spillway_sim::run(&s, Algorithm::DropRatio, seed, &|_| {}).expect("a simulation");
    run.trace
        .samples
        .iter()
        .map(|x| (x.offered, x.admitted))
        .collect()
}

fn figures(samples: &[(u64, u64)], phase: f64) -> StepAndLeave {
    let step = STEP_AT + phase;
    StepAndLeave::of(samples, LIMIT, step, step + LEAVE_AFTER).expect("the run lasts long enough")
}

/// `low-high` of `values`, with `decimals` decimals.
fn range(values: impl Iterator<Item = f64>, decimals: usize) -> String {
    let (low, high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| {
        (l.min(v), h.max(v))
    });
    if (high - low).abs() < 0.5 * 10f64.powi(-(decimals as i32)) {
        format!("{low:.decimals$}")
    } else {
        format!("{low:.decimals$}-{high:.decimals$}")
    }
}

/// A row of the table: its name, its figure and how many decimals it shows.
type Row = (&'static str, fn(&StepAndLeave) -> f64, usize);

fn table(real: &[StepAndLeave], sim: &[StepAndLeave], runs: usize, seeds: u64) -> String {
    let rows: [Row; 7] = [
        (
            "enforcement delay, s (trailing 300 ms within 5%)",
            |f| f.delay_s.unwrap_or(f64::NAN),
            1,
        ),
        (
            "admitted in the second after the step, x limit",
            |f| f.first_second,
            2,
        ),
        (
            "admitted in the second after that, x limit",
            |f| f.second_second,
            3,
        ),
        (
            "admitted from 2 s after the step to the leave, x limit",
            |f| f.steady,
            3,
        ),
        (
            "admitted in the second after the leave, x limit",
            |f| f.leave_second,
            3,
        ),
        ("lowest 300 ms in that second, x limit", |f| f.leave_low, 2),
        (
            "admitted from 1 s after the leave to the end, x limit",
            |f| f.after_leave,
            3,
        ),
    ];
    let mut out = format!(
        "| figure | real processes ({runs} runs) | simulator (seeds 1-{seeds} at the same {runs} phases) |\n| --- | --- | --- |\n"
    );
    for (name, get, decimals) in rows {
        out.push_str(&format!(
            "| {name} | {} | {} |\n",
            range(real.iter().map(get), decimals),
            range(sim.iter().map(get), decimals)
        ));
    }
    out
}

/// Admitted per second over a trailing 300 ms, sample by sample, from `from_s` on.
fn smoothed(samples: &[(u64, u64)], from_s: f64) -> Vec<(f64, f64)> {
    let window_s = CHART_WINDOW as f64 * SAMPLE_S;
    (CHART_WINDOW..=samples.len())
        .map(|k| {
            let n: u64 = samples[k - CHART_WINDOW..k].iter().map(|s| s.1).sum();
            (k as f64 * SAMPLE_S - from_s, n as f64 / window_s)
        })
        .collect()
}

fn chart(path: &Path, real: &[(u64, u64)], sim: &[(u64, u64)], phase: f64) -> PathBuf {
    let step = STEP_AT + phase;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 420)).into_drawing_area();
        root.fill(&WHITE)?;
        let (from, to) = (-STEP_AT, END_AFTER);
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "admitted: real processes and the simulator (trailing 300 ms)",
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(from..to, 0.0..LIMIT * 2.5)?;
        chart
            .configure_mesh()
            .x_desc("seconds after the step (a proxy leaves at 6 s)")
            .y_desc("requests/s")
            .draw()?;
        let style = |c: &RGBColor| ShapeStyle::from(c).stroke_width(2);
        for (samples, color, label) in [(real, &BLUE, "real processes"), (sim, &GREEN, "simulator")]
        {
            chart
                .draw_series(LineSeries::new(smoothed(samples, step), style(color)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], *color));
        }
        chart
            .draw_series(LineSeries::new(
                vec![(from, LIMIT), (to, LIMIT)],
                style(&RED),
            ))?
            .label("limit")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().expect("the chart is written");
    path.to_owned()
}

fn main() {
    // `cargo bench` passes `--bench`; the numbers are positional.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let runs: usize = args
        .first()
        .map_or(5, |a| a.parse().expect("RUNS is a count"));
    let seeds: u64 = args
        .get(1)
        .map_or(20, |a| a.parse().expect("SEEDS is a count"));
    let out = args.get(2).map_or_else(std::env::temp_dir, PathBuf::from);
    let phases: Vec<f64> = (0..runs.max(1))
        .map(|i| ((i as f64 + 0.5) / runs.max(1) as f64 * 10.0).round() / 10.0 % 1.0)
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut real = Vec::new();
    let mut sim = Vec::new();
    let mut middle = None;
    for (i, &phase) in phases.iter().enumerate() {
        let samples = real_run(&runtime, phase);
        let f = figures(&samples, phase);
        eprintln!("real run {} (phase {phase:.1}): {f:?}", i + 1);
        for seed in 1..=seeds {
            let s = sim_run(phase, seed);
            sim.push(figures(&s, phase));
            if i == phases.len() / 2 && seed == 1 {
                middle = Some((samples.clone(), s, phase));
            }
        }
        real.push(f);
    }
    println!("{}", table(&real, &sim, runs, seeds));
    if let Some((real_samples, sim_samples, phase)) = middle {
        std::fs::create_dir_all(&out).expect("the output folder");
        let path = chart(
            &out.join("real-vs-sim.svg"),
            &real_samples,
            &sim_samples,
            phase,
        );
        println!("chart: {}", path.display());
    }
}
