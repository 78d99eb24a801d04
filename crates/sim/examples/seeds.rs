//! One scenario over a range of seeds, drop-ratio by default: `cargo run --release -p
//! spillway-sim --example seeds -- SCENARIO FROM TO [ALGORITHM] [--no-surge-guard]`, for
//! example `many-callers 1 20`. Prints a row per seed and the range of each figure over the
//! seeds, with the scenario's noise band: what docs/simulation.md quotes. A token budget
//! (`tokens`) adds the tokens admitted over the window against the budget and the requests
//! refused while the fleet offered under it (wrongly: while the budget had room).

use spillway_sim::{Algorithm, Metrics, Scenario, run};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let guard = !args.iter().any(|a| a == "--no-surge-guard");
    let mut args = args.into_iter().filter(|a| !a.starts_with("--"));
    let name = args.next().unwrap_or_else(|| "surge-15x".into());
    let from: u64 = args.next().map_or(Ok(1), |s| s.parse())?;
    let to: u64 = args.next().map_or(Ok(8), |s| s.parse())?;
    let algorithm = Algorithm::from_name(&args.next().unwrap_or_else(|| "drop-ratio".into()))?;
    let mut scenario = Scenario::named(&name, None)?;
    scenario.surge_guard = guard;
    println!("{name}, {}, seeds {from}-{to}", algorithm.name());
    let tokens = scenario.answers.is_some();
    println!(
        "seed | delay s | steady error | peak overshoot | 2nd after 1st | Jain | wrongful{}",
        if tokens {
            " | tokens admitted / budget | under the budget: refused / offered (with room)"
        } else {
            ""
        }
    );
    let seeds: Vec<u64> = (from..=to).collect();
    let mut all: Vec<Metrics> = Vec::new();
    for pair in seeds.chunks(2) {
        let runs: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = pair
                .iter()
                .map(|&seed| {
                    let scenario = &scenario;
                    s.spawn(move || run(scenario, algorithm, seed, &|_| {}))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in runs {
            let r = r?;
            let m = r.metrics;
            let budget = m.tokens.map_or(String::new(), |t| {
                format!(
                    " | {:.3} | {} / {} ({})",
                    t.admitted, t.under_refused, t.under_offered, t.under_wrongful
                )
            });
            println!(
                "{} | {} | {} | {} | {} | {} | {}{budget}",
                r.seed,
                fmt(m.enforcement_delay_s, 1.0, 1),
                fmt(m.steady_error, 100.0, 1),
                fmt(m.peak_overshoot, 100.0, 1),
                fmt(m.second_after_first, 100.0, 1),
                fmt(m.jain, 1.0, 3),
                m.wrongful_drops
            );
            all.push(m);
        }
    }
    let range = |f: &dyn Fn(&Metrics) -> Option<f64>, scale: f64, digits: usize| {
        let v: Vec<f64> = all.iter().filter_map(f).collect();
        if v.is_empty() {
            return "-".to_owned();
        }
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{:.digits$}-{:.digits$}", lo * scale, hi * scale)
    };
    let budget = if tokens {
        let sum = |f: &dyn Fn(&spillway_sim::TokenFigures) -> u64| {
            all.iter()
                .filter_map(|m| m.tokens.as_ref())
                .map(f)
                .sum::<u64>()
        };
        format!(
            " | {:.3}-{:.3} | {} / {} ({}) in all",
            all.iter()
                .filter_map(|m| m.tokens.map(|t| t.admitted))
                .fold(f64::INFINITY, f64::min),
            all.iter()
                .filter_map(|m| m.tokens.map(|t| t.admitted))
                .fold(f64::NEG_INFINITY, f64::max),
            sum(&|t| t.under_refused),
            sum(&|t| t.under_offered),
            sum(&|t| t.under_wrongful),
        )
    } else {
        String::new()
    };
    println!(
        "range | {} | {}% | {}% | {}% | {} | {}{budget}",
        range(&|m| m.enforcement_delay_s, 1.0, 1),
        range(&|m| m.steady_error, 100.0, 1),
        range(&|m| m.peak_overshoot, 100.0, 1),
        range(&|m| m.second_after_first, 100.0, 1),
        range(&|m| m.jain, 1.0, 3),
        range(&|m| Some(m.wrongful_drops as f64), 1.0, 0),
    );
    if let Some(n) = all.first().map(|m| m.noise) {
        println!(
            "noise (3 sd at the limit) | 100 ms ±{:.1}% | window ±{:.1}% | 1 s ±{:.1}% | Jain of coins {}",
            n.sample_3sd * 100.0,
            n.window_3sd * 100.0,
            n.second_3sd * 100.0,
            range(&|m| m.noise.coin_jain, 1.0, 3),
        );
    }
    Ok(())
}

fn fmt(v: Option<f64>, scale: f64, digits: usize) -> String {
    v.map_or("-".to_owned(), |v| format!("{:.digits$}", v * scale))
}
