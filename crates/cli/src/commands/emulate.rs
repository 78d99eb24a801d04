//! `spillway emulate`: runs a fleet of emulated hosts against an aggregator and prints the
//! run's JSON summary on stdout.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use spillway_emulate::{Backoff, FleetOptions, HostCerts, LoadShape, run};

use crate::args::EmulateArgs;

/// Descriptors kept for everything but the hosts' streams: the runtime, logs, files.
const FD_RESERVE: u64 = 256;

pub fn emulate(args: EmulateArgs) -> ExitCode {
    match start(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("spillway emulate: {message}");
            ExitCode::from(2)
        }
    }
}

fn start(args: EmulateArgs) -> Result<ExitCode, String> {
    let config = spillway_core::config::load_file(&args.config).map_err(|e| e.to_string())?;
    let hosts = args.hosts.get();
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(format!(
            "--seconds {}: give a number of seconds above zero",
            args.seconds
        ));
    }
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate >= 0.0)
    {
        return Err(format!(
            "--rate {rate}: give requests per second, at least 0"
        ));
    }
    // One descriptor per host's stream: raise the soft limit to the hard one, and stop here
    // rather than fail host by host with EMFILE.
    let limit = spillway_proxy::raise_fd_limit()
        .map_err(|err| format!("cannot raise the file descriptor limit: {err}"))?;
    let needed = hosts as u64 + FD_RESERVE;
    if let Some(soft) = limit.soft
        && soft < needed
    {
        return Err(format!(
            "--hosts {hosts} needs about {needed} file descriptors (one per host's stream), and the limit is {limit}: raise the hard limit (ulimit -Hn, systemd's LimitNOFILE=) or run fewer hosts per process"
        ));
    }
    let buckets = match args.buckets {
        Some(b) => b,
        None => spillway_emulate::control_buckets(&config).len(),
    };
    let options = FleetOptions {
        config: Arc::new(config),
        hosts,
        buckets,
        aggregators: args.aggregators,
        region: args.region,
        zone: args.zone,
        host_prefix: args.host_prefix,
        seconds: Duration::from_secs_f64(args.seconds),
        rate: args.rate,
        shape: LoadShape { step: args.step },
        tls: args.tls_dir.map(|dir| HostCerts {
            dir,
            trust_domain: args.trust_domain,
        }),
        backoff: Backoff::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| format!("cannot start the async runtime: {err}"))?;
    let summary = runtime.block_on(async move {
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            super::stop_signal().await;
            stop_tx.send_replace(true);
        });
        run(options, stop).await
    });
    let summary = summary.map_err(|e| e.to_string())?;
    match serde_json::to_string_pretty(&summary) {
        Ok(json) => println!("{json}"),
        Err(err) => {
            eprintln!("spillway emulate: cannot write the summary: {err}");
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}
