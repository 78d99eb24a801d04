//! `spillway import envoy-ratelimit FILE...`: envoyproxy/ratelimit's files printed as
//! one Spillway configuration. Wiring only: the conversion is
//! `spillway_core::import::envoy_ratelimit`.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::TypedValueParser as _;
use clap::{Args, Subcommand, ValueEnum};
use spillway_core::config::{self, Algorithm, ConfigError, StateStore};
use spillway_core::import::envoy_ratelimit::{self, File, Options};

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Print a Spillway configuration for envoyproxy/ratelimit's YAML files: one service per
    /// domain, one descriptor bucket per descriptor.
    EnvoyRatelimit(EnvoyRatelimitArgs),
}

#[derive(Debug, Args)]
pub struct EnvoyRatelimitArgs {
    /// envoyproxy/ratelimit's configuration files, one domain each.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Where the buckets count: `redis` (the default), shared by every process as
    /// envoyproxy/ratelimit's replicas share theirs, or `local`, in each process apart. The
    /// control plane's algorithms (drop-ratio, adaptive-token-bucket) count in the control plane.
    #[arg(long, value_enum)]
    pub store: Option<StoreArg>,
    /// The buckets' algorithm; envoyproxy/ratelimit's is a fixed window. With drop-ratio or
    /// adaptive-token-bucket every limited descriptor needs a value on each entry, since such a
    /// bucket keeps one count.
    #[arg(
        long,
        default_value = "fixed-window",
        value_parser = clap::builder::PossibleValuesParser::new(Algorithm::ALL.map(Algorithm::name))
            .map(|name| Algorithm::from_name(&name).expect("a possible value is a name")),
    )]
    pub algorithm: Algorithm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreArg {
    Local,
    Redis,
}

pub fn import(command: ImportCommand) -> ExitCode {
    match command {
        ImportCommand::EnvoyRatelimit(args) => envoy_ratelimit(args),
    }
}

fn envoy_ratelimit(args: EnvoyRatelimitArgs) -> ExitCode {
    let control_plane = !args.algorithm.stores().contains(&StateStore::Redis);
    let store = match (args.store, control_plane) {
        (None, true) => StateStore::ControlPlane,
        (None, false) | (Some(StoreArg::Redis), false) => StateStore::Redis,
        (Some(StoreArg::Local), false) => StateStore::Local,
        (Some(store), true) => {
            eprintln!(
                "spillway import envoy-ratelimit: --algorithm {} counts in the control plane (store: control-plane), not in {}: leave out --store, or choose a counting algorithm (fixed-window, token-bucket, leaky-bucket, sliding-window-log, sliding-window-counter or gcra)",
                args.algorithm,
                match store {
                    StoreArg::Local => "local",
                    StoreArg::Redis => "redis",
                }
            );
            return ExitCode::from(2);
        }
    };
    let mut texts = Vec::with_capacity(args.files.len());
    for path in &args.files {
        match std::fs::read(path) {
            Ok(bytes) => texts.push((path.display().to_string(), bytes)),
            Err(source) => {
                eprintln!(
                    "{}",
                    ConfigError::Read {
                        path: path.clone(),
                        source
                    }
                );
                return ExitCode::from(2);
            }
        }
    }
    let files: Vec<File<'_>> = texts
        .iter()
        .map(|(name, bytes)| File { name, text: bytes })
        .collect();
    let options = Options {
        algorithm: args.algorithm,
        store,
    };
    let converted = match envoy_ratelimit::convert(&files, &options) {
        Ok(converted) => converted,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(2);
        }
    };
    for note in &converted.notes {
        eprintln!("{note}");
    }
    // What the importer writes must load; if it does not, that is the importer's fault.
    if let Err(err) = config::load_str(&converted.yaml, "the converted configuration") {
        eprintln!(
            "spillway import envoy-ratelimit: the converted configuration does not load ({err}); this is a bug in the importer, please report it with the input files"
        );
        return ExitCode::from(1);
    }
    match io::stdout().lock().write_all(converted.yaml.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("spillway: cannot write to stdout: {err}");
            ExitCode::from(1)
        }
    }
}
