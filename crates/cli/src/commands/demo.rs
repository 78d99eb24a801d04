//! `spillway demo`: wiring only, the fleet, the load and the view are in
//! `spillway-demo`.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use spillway_demo::DemoOptions;

use crate::args::{DemoArgs, DemoScenario};

/// Runs the demo for `--seconds`, prints the dashboard's address when the fleet is up and the
/// summary at the end on stdout, and exits 0.
pub fn demo(args: DemoArgs) -> ExitCode {
    if args.scenario == DemoScenario::Tokens {
        return tokens(args);
    }
    if args.seconds < 4 {
        eprintln!("spillway demo: --seconds must be at least 4 (a base load, then the surge)");
        return ExitCode::from(2);
    }
    if let Some(phase) = args.surge_phase
        && !(0.0..1.0).contains(&phase)
    {
        eprintln!(
            "spillway demo: --surge-phase {phase} is outside [0, 1): it is how far into its report interval the surge starts, 0.5 being the middle"
        );
        return ExitCode::from(2);
    }
    let mut options = DemoOptions::new(args.seconds);
    options.surge_phase = args.surge_phase;
    options.out = args.out;
    options.report_interval = Duration::from_millis(args.report_interval_ms.max(10));
    options.terminal = std::io::stderr().is_terminal();
    let run = async move {
        let demo = spillway_demo::Demo::start(options).await?;
        if let Some(admin) = demo.dashboard() {
            println!("dashboard: http://{admin}/ (live while the demo runs)");
        }
        demo.run().await
    };
    block_on(run)
}

/// `--scenario tokens`: token budgets per API key in front of a fake LLM API.
fn tokens(args: DemoArgs) -> ExitCode {
    if args.seconds == 0 || args.sidecars == 0 || args.keys == 0 || args.budget == 0 {
        eprintln!(
            "spillway demo: --seconds, --sidecars, --keys and --budget must be at least 1 for --scenario tokens"
        );
        return ExitCode::from(2);
    }
    let shares = (0.0..=1.0).contains(&args.streamed) && args.offered.is_finite();
    if !(shares && args.offered > 0.0) {
        eprintln!(
            "spillway demo: --streamed is a share from 0 to 1 and --offered a factor above 0 (2 offers twice the budget)"
        );
        return ExitCode::from(2);
    }
    let mut options = spillway_demo::TokensOptions::new(args.seconds);
    options.sidecars = args.sidecars;
    options.keys = args.keys;
    options.budget = args.budget;
    options.offered = args.offered;
    options.streamed = args.streamed;
    options.redis = args.redis_url;
    block_on(spillway_demo::run_tokens(options))
}

/// Runs a scenario on a runtime of its own and prints its summary on stdout: exit 0, or 2 for
/// a usage error and 1 for any other.
fn block_on<S: std::fmt::Display>(
    run: impl Future<Output = Result<S, spillway_demo::DemoError>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("spillway demo: cannot start the async runtime: {err}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run) {
        Ok(summary) => {
            print!("{summary}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("spillway demo: {err}");
            ExitCode::from(if err.is_usage() { 2 } else { 1 })
        }
    }
}
