//! `spillway proxy`: the sidecar, standalone from its file or linked to its zone's aggregator
//! (SPEC §1). Wiring only: the work is in `spillway-proxy`.

use std::process::ExitCode;

use anyhow::Context;
use spillway_client::control::{ControlOptions, LinkOptions};
use spillway_proxy::{Proxy, ProxyOptions};

use crate::args::ProxyArgs;

/// Runs the proxy until SIGTERM or SIGINT, then drains the requests in flight and exits 0.
/// Bad configuration or usage exits 2, any other failure 1.
pub fn proxy(args: ProxyArgs) -> ExitCode {
    if args.database.is_some() {
        eprintln!(
            "spillway proxy: --database is not available yet in this build (it arrives with the rules-service issue); use --aggregator, whose controller follows the store, or the file standalone"
        );
        return ExitCode::from(2);
    }
    if args.aggregator.is_some() && args.region.is_none() {
        eprintln!(
            "spillway proxy: --aggregator needs --region and --zone, for example --region eu-west --zone eu-west-1a"
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("spillway proxy: {err:#}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(args))
}

async fn run(args: ProxyArgs) -> ExitCode {
    if args.aggregator.is_none() && (args.region.is_some() || args.host_id.is_some()) {
        tracing::info!("--region, --zone and --host-id only matter with --aggregator; ignored");
    }
    let mut options = ProxyOptions::new(args.config, args.listen, args.upstream);
    options.admin = args.admin;
    if let (Some(aggregator), Some(region), Some(zone)) = (args.aggregator, args.region, args.zone)
    {
        let host_id = args
            .host_id
            .unwrap_or_else(|| format!("{}:{}", hostname(), args.listen.port()));
        let mut control = ControlOptions::new(LinkOptions::new(aggregator, host_id, region, zone));
        control.state_dir = args.state_dir;
        options.control = Some(control);
    }
    let proxy = match Proxy::start(options).await {
        Ok(proxy) => proxy,
        Err(err) => {
            eprintln!("spillway proxy: {err}");
            return ExitCode::from(if err.is_usage() { 2 } else { 1 });
        }
    };
    if let Err(err) = stop_signal().await {
        eprintln!("spillway proxy: {err:#}");
        proxy.shutdown().await;
        return ExitCode::from(1);
    }
    tracing::info!("stopping: no new connections, draining the requests in flight");
    proxy.shutdown().await;
    ExitCode::SUCCESS
}

/// Waits for SIGTERM (how orchestrators stop a sidecar) or SIGINT (Ctrl-C).
async fn stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    tokio::select! {
        _ = term.recv() => {}
        interrupted = tokio::signal::ctrl_c() => interrupted.context("cannot listen for SIGINT")?,
    }
    Ok(())
}

/// This machine's name, for the default host id.
fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
