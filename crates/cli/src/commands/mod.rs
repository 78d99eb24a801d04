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
mod emulate;
pub mod import;
mod proxy;
#[cfg(feature = "rls")]
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
/// lines from its many components would scroll away, and the emulator's thousands of links
/// would log a line each; every other command logs at `info`.
pub fn default_log_level(command: &Command) -> &'static str {
    match command {
        Command::Demo(_) | Command::Emulate(_) => "warn",
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
        Command::Emulate(args) => emulate::emulate(args),
        #[cfg(feature = "rls")]
        Command::Rls(args) => rls::rls(args),
        #[cfg(not(feature = "rls"))]
        Command::Rls(_) => without_feature("rls", "spillway rls"),
        Command::Certs { command } => certs::certs(command),
        Command::Configure { command } => configure_command::configure(command),
    }
}

/// `Ok` when this binary was built with `feature`; otherwise the usage error that says how to
/// build one that has it. The quick start's lean build (`--no-default-features`) leaves out
/// Envoy's services (`rls`), the PostgreSQL driver (`postgres`), the OpenTelemetry exporter
/// (`otlp`) and the Redis client (`redis`, which the sidecar's client refuses by itself).
pub fn needs_feature(feature: &str, what: &str) -> Result<(), String> {
    let built = (feature == "rls" && cfg!(feature = "rls"))
        || (feature == "postgres" && cfg!(feature = "postgres"))
        || (feature == "otlp" && cfg!(feature = "otlp"));
    if built {
        return Ok(());
    }
    Err(format!(
        "{what} needs the `{feature}` feature, which this spillway was built without; build the full binary (the default features): cargo build --release -p spillway-cli"
    ))
}

/// A subcommand this build lacks: its usage error, exit 2.
#[cfg(not(feature = "rls"))]
fn without_feature(feature: &str, what: &str) -> ExitCode {
    if let Err(message) = needs_feature(feature, what) {
        eprintln!("error: {message}");
    }
    ExitCode::from(2)
}

#[cfg(test)]
mod tests {
    use super::needs_feature;

    #[test]
    fn a_feature_this_build_has_passes_and_one_it_lacks_says_how_to_get_it() {
        assert_eq!(
            needs_feature("rls", "--rls-listen").is_ok(),
            cfg!(feature = "rls")
        );
        assert_eq!(
            needs_feature("postgres", "postgres://").is_ok(),
            cfg!(feature = "postgres")
        );
        let message = needs_feature("no-such-feature", "spillway nothing").unwrap_err();
        assert!(message.starts_with("spillway nothing needs the `no-such-feature` feature"));
        assert!(
            message.contains("cargo build --release -p spillway-cli"),
            "{message}"
        );
    }
}
