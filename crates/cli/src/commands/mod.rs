//! One function per subcommand. Exit status per SPEC §1: 0 success, 1 runtime failure, 2 bad
//! usage or bad configuration.

mod check;
mod control;
mod demo;
mod proxy;
mod rules;
mod sim;
mod up;

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

use crate::args::{Command, LogFormat};

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

pub fn run(command: Command) -> ExitCode {
    match command {
        Command::Check { config } => check::check(&config),
        Command::Schema => check::schema(),
        Command::Demo(args) => demo::demo(args),
        Command::Up(args) => up::up(args),
        Command::Proxy(args) => proxy::proxy(args),
        Command::Aggregator(args) => control::aggregator(args),
        Command::Controller(args) => control::controller(args),
        Command::Rules { command } => rules::rules(command),
        Command::Sim(args) => sim::sim(args),
    }
}
