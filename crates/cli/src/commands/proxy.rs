//! `spillway proxy`: the sidecar, standalone from its file (SPEC §1). Wiring only: the work is
//! in `spillway-proxy`.

use std::process::ExitCode;

use anyhow::Context;
use spillway_proxy::{Proxy, ProxyOptions};

use crate::args::ProxyArgs;

/// Runs the proxy until SIGTERM or SIGINT, then drains the requests in flight and exits 0.
/// Bad configuration or usage exits 2, any other failure 1.
pub fn proxy(args: ProxyArgs) -> ExitCode {
    if args.aggregator.is_some() || args.database.is_some() {
        eprintln!(
            "spillway proxy: --aggregator and --database are not available yet in this build (they arrive with the control-plane and rules-service issues); run without them to use the file standalone"
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
    if args.region.is_some() || args.host_id.is_some() {
        tracing::info!("--region, --zone and --host-id only matter with --aggregator; ignored");
    }
    let mut options = ProxyOptions::new(args.config, args.listen, args.upstream);
    options.admin = args.admin;
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
