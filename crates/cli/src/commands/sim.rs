//! `spillway sim`: runs a scenario (or `all`) with the chosen algorithms, prints the table and
//! writes CSV, SVG and the table under `--out`.

use std::io::IsTerminal;
use std::process::ExitCode;

use spillway_sim::{Algorithm, Scenario, SimError, output, run_all, scenario};

use crate::args::SimArgs;

pub fn sim(args: SimArgs) -> ExitCode {
    let names: Vec<&str> = if args.scenario == "all" {
        scenario::NAMES.to_vec()
    } else {
        vec![args.scenario.as_str()]
    };
    let algorithms = if args.algorithms.is_empty() {
        Algorithm::ALL.to_vec()
    } else {
        match args
            .algorithms
            .iter()
            .map(|a| Algorithm::from_name(a))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(list) => list,
            Err(err) => return usage(&err),
        }
    };
    let mut scenarios = Vec::new();
    for name in names {
        let mut s = match Scenario::named(name, args.duration) {
            Ok(s) => s,
            Err(err) => return usage(&err),
        };
        s.surge_guard = !args.no_surge_guard;
        if let Some(hosts) = args.hosts {
            match s.set_hosts(hosts) {
                Ok(()) => {}
                // `all` runs the fixed fleets as they are; one named alone is a mistake.
                Err(SimError::FixedFleet { name }) if args.scenario == "all" => {
                    eprintln!("spillway sim: {name} keeps its own fleet, not {hosts} hosts");
                }
                Err(err) => return usage(&err),
            }
        }
        scenarios.push(s);
    }
    let progress = std::io::stderr().is_terminal();
    for scenario in &scenarios {
        // A token budget is a drop-ratio bucket: the other algorithms have no such bucket to run.
        let (runs, others): (Vec<Algorithm>, Vec<Algorithm>) =
            algorithms.iter().partition(|a| scenario.runs(**a));
        if let Some(other) = others.first()
            && !args.algorithms.is_empty()
        {
            let err = SimError::Unsupported {
                scenario: scenario.name,
                algorithm: other.name(),
            };
            if args.scenario != "all" {
                return usage(&err);
            }
            eprintln!("spillway sim: {err}");
        }
        if runs.is_empty() {
            continue;
        }
        let results = match run_all(scenario, &runs, args.seed, progress) {
            Ok(r) => r,
            Err(err) => {
                eprintln!("spillway sim: {err}");
                return ExitCode::from(1);
            }
        };
        println!("{}", output::table(&results));
        if let Some(dir) = &args.out {
            match output::write(dir, &results) {
                Ok(paths) => {
                    for p in paths {
                        eprintln!("wrote {}", p.display());
                    }
                }
                Err(err) => {
                    eprintln!("spillway sim: {err}");
                    return ExitCode::from(1);
                }
            }
        }
    }
    ExitCode::SUCCESS
}

fn usage(err: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("spillway sim: {err}");
    ExitCode::from(2)
}
