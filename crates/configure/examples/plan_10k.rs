//! Plans 10,000 synthetic series of 28 days of per-minute history (403 million points), streamed
//! one series at a time, and prints the time (wall and CPU) and the process's peak memory; first,
//! as the baseline in the same run, only generating the same history without planning it.
//!
//! ```text
//! cargo run --release -p spillway-configure --example plan_10k [SERIES] [DAYS]
//! ```

use std::time::Instant;

use spillway_configure::series::DAY;
use spillway_configure::synthetic::SyntheticSource;
use spillway_configure::{CurrentLimits, HistorySource, Params, PolicyKind, Settings, Window};

/// The CPU time this thread has had (`/proc/thread-self/schedstat`, in ns), in seconds: on a
/// shared machine the wall time also counts the waits for a core, the CPU time does not.
fn cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e9)
}

/// The process's peak resident memory (`VmHWM`), in MiB.
fn peak_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let series: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let days: i64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(28);
    let window = Window::ending(1_767_225_600, days * DAY);
    let points = series * window.minutes();
    println!(
        "{series} series x {days} days of per-minute history = {:.0} M points",
        points as f64 / 1e6
    );

    // The baseline: generating the history alone.
    let began = Instant::now();
    let cpu = cpu_secs();
    let mut source = SyntheticSource::new(series, 1);
    let mut buffer = Vec::new();
    let mut checksum = 0.0;
    while let Some(_key) = source.next_series(window, &mut buffer).unwrap() {
        checksum += buffer.last().map_or(0.0, |p| p.rps);
    }
    let generate = began.elapsed().as_secs_f64();
    let generate_cpu = cpu_secs() - cpu;
    println!(
        "generate only:        {generate:7.2} s, CPU {generate_cpu:6.2} s ({:.1} ns/point, checksum {checksum:.0}), peak RSS {:.0} MiB",
        generate_cpu * 1e9 / points as f64,
        peak_mib()
    );

    for policy in [PolicyKind::Historical, PolicyKind::Forecast] {
        let settings = Settings::new(Params {
            policy,
            ..Params::default()
        });
        let began = Instant::now();
        let cpu = cpu_secs();
        let mut source = SyntheticSource::new(series, 1);
        let plan = spillway_configure::plan(
            &mut source,
            window,
            &settings,
            &CurrentLimits::default(),
            |_, _| {},
        )
        .unwrap();
        let took = began.elapsed().as_secs_f64();
        let took_cpu = cpu_secs() - cpu;
        println!(
            "plan ({:<10}):    {took:7.2} s, CPU {took_cpu:6.2} s ({:.1} ns/point, {:.2}x the generation's CPU), {} proposals, peak RSS {:.0} MiB",
            policy.name(),
            took_cpu * 1e9 / points as f64,
            took_cpu / generate_cpu,
            plan.proposals.len(),
            peak_mib()
        );
    }
    println!(
        "all of it in memory at once would be {:.1} GiB of 16-byte points",
        points as f64 * 16.0 / (1u64 << 30) as f64
    );
}
