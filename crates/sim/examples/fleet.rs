//! Times one scenario with every algorithm: `cargo run --release -p spillway-sim --example fleet
//! -- SCENARIO SECONDS [SEED [OUT [HOSTS [ALGORITHMS]]]]`, for example `surge-15x 600` (1,000
//! hosts for 600 simulated seconds), `surge-15x 60 1 - 100000`, or `surge-15x 30 1 - 100000
//! drop-ratio` to time one algorithm alone (names comma-separated, as the table prints them),
//! and prints the table and the wall time.

use std::time::Instant;

use spillway_sim::{Algorithm, Scenario, output, run_all};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "surge-15x".into());
    let seconds: f64 = args.next().map_or(Ok(60.0), |s| s.parse())?;
    let seed: u64 = args.next().map_or(Ok(1), |s| s.parse())?;
    let out = args.next().filter(|o| o != "-");
    let mut scenario = Scenario::named(&name, Some(seconds))?;
    if let Some(hosts) = args.next().filter(|h| h != "-") {
        scenario.set_hosts(hosts.parse()?)?;
    }
    let only = args.next();
    let algorithms: Vec<Algorithm> = Algorithm::ALL
        .into_iter()
        .filter(|a| scenario.runs(*a))
        .filter(|a| {
            only.as_ref()
                .is_none_or(|o| o.split(',').any(|n| n == a.name()))
        })
        .collect();
    if algorithms.is_empty() {
        return Err(format!("no algorithm of {only:?} runs in {name}").into());
    }
    let started = Instant::now();
    let results = run_all(&scenario, &algorithms, seed, false)?;
    let took = started.elapsed();
    println!("{}", output::table(&results));
    if let Some(dir) = out {
        output::write(std::path::Path::new(&dir), &results)?;
    }
    println!(
        "{} hosts x {} simulated s x {} algorithms in {:.1} s of wall time",
        scenario.hosts,
        scenario.duration_s,
        results.len(),
        took.as_secs_f64()
    );
    Ok(())
}
