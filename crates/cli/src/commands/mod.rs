//! One function per subcommand. Exit status per SPEC §1: 0 success, 1 runtime failure, 2 bad
//! usage or bad configuration.

mod certs;
mod check;
mod control;
mod demo;
mod proxy;
mod rules;
mod sim;
mod trust;
mod up;

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

use crate::args::{Command, LogFormat};

/// Logs go to stderr, filtered by `RUST_LOG`, or at `default_level` without it.
pub fn init_logging(format: LogFormat, default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colours only for a terminal: a log file or a collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The default log level of a command: the demo draws a live view on the terminal, which info
/// lines from its many components would scroll away; every other command logs at `info`.
pub fn default_log_level(command: &Command) -> &'static str {
    match command {
        Command::Demo(_) => "warn",
        _ => "info",
    }
}

/// Waits until the process is asked to stop: SIGTERM (how orchestrators stop a service) or SIGINT
/// (Ctrl-C). Without a SIGTERM handler (it cannot be installed), SIGINT alone.
pub async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(err) => {
            tracing::warn!(%err, "cannot listen for SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
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
        Command::Certs { command } => certs::certs(command),
    }
}
