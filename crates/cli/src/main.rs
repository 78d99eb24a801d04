//! `spillway`: one binary for every role. It parses arguments and wires libraries; nothing else.

mod args;
mod commands;
mod duration;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    let telemetry = match commands::init_logging(
        cli.log_format,
        commands::default_log_level(&cli.command),
        cli.otlp_endpoint.as_deref(),
        commands::service_name(&cli.command),
    ) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("error: --otlp-endpoint: {err}");
            return ExitCode::from(2);
        }
    };
    let code = commands::run(cli.command);
    telemetry.finish();
    code
}
