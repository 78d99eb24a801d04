//! One function per subcommand. Exit status: 0 success, 1 runtime failure, 2 bad
//! usage or bad configuration.

mod certs;
mod check;
pub mod configure;
pub mod configure_apply;
pub mod configure_command;
pub mod configure_run;
mod control;
mod demo;
pub mod import;
mod proxy;
mod rls;
mod rules;
mod signal;
mod sim;
mod telemetry;
mod trust;
mod up;

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

pub use self::signal::stop_signal;
use crate::args::{Command, LogFormat};

/// Logs go to stderr, filtered by `RUST_LOG`, or at `default_level` without it. With an OTLP
/// endpoint, the spans of Spillway's own crates (at `info`, whatever `RUST_LOG` says) also go to
/// that collector, named `service`; the returned guard sends what is still queued when dropped.
pub fn init_logging(
    format: LogFormat,
    default_level: &str,
    otlp_endpoint: Option<&str>,
    service: &str,
) -> Result<telemetry::Telemetry, String> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colours only for a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (telemetry, spans) = telemetry::Telemetry::start(otlp_endpoint, service)?;
    let Some(spans) = spans else {
        // Without a collector, the plain subscriber with one global filter, as before tracing
        // was added: the request path's logging is what it was, with no per-layer filters to
        // consult.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_writer(std::io::stderr);
        match format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
        return Ok(telemetry);
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(spans)
        .init();
    Ok(telemetry)
}

/// The service name a command's spans carry.
pub fn service_name(command: &Command) -> &'static str {
    match command {
        Command::Demo(_) => "spillway-demo",
        Command::Up(_) => "spillway-up",
        Command::Proxy(_) => "spillway-proxy",
        Command::Aggregator(_) => "spillway-aggregator",
        Command::Controller(_) => "spillway-controller",
        Command::Rules { .. } => "spillway-rules",
        Command::Rls(_) => "spillway-rls",
        Command::Configure { .. } => "spillway-configure",
        _ => "spillway",
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

pub fn run(command: Command) -> ExitCode {
    match command {
        Command::Check { config } => check::check(&config),
        Command::Schema => check::schema(),
        Command::Import { command } => import::import(command),
        Command::Demo(args) => demo::demo(args),
        Command::Up(args) => up::up(args),
        Command::Proxy(args) => proxy::proxy(args),
        Command::Aggregator(args) => control::aggregator(args),
        Command::Controller(args) => control::controller(args),
        Command::Rules { command } => rules::rules(command),
        Command::Sim(args) => sim::sim(args),
        Command::Rls(args) => rls::rls(args),
        Command::Certs { command } => certs::certs(command),
        Command::Configure { command } => configure_command::configure(command),
    }
}
