//! `spillway rls`: Envoy's rate limit service without the proxy, a drop-in for
//! envoyproxy/ratelimit. The engine is the sidecar's (`spillway_proxy::start_engine`: its file,
//! or the control plane's rules with --aggregator), the service `spillway-rls`'s, the admin port
//! the engine's metrics. Wiring only.

use std::process::ExitCode;
use std::sync::Arc;

use spillway_client::{DEFAULT_POLL, watch_file};
use spillway_proxy::{EngineView, start_engine};
use spillway_rls::{Rls, RlsOptions};
use spillway_tls::SanPolicy;
use tokio::sync::watch;

use super::trust;
use crate::args::RlsArgs;

/// Serves RLS until SIGTERM or SIGINT, then lets the calls in flight finish and exits 0. Bad
/// configuration or usage exits 2, any other failure 1.
pub fn rls(args: RlsArgs) -> ExitCode {
    // Decisions are served on every core (tokio's multi-thread runtime): unlike the sidecar, the
    // process does nothing else.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("spillway rls: cannot start the async runtime: {err}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(args))
}

async fn run(args: RlsArgs) -> ExitCode {
    let usage = |message: String| {
        eprintln!("spillway rls: {message}");
        ExitCode::from(2)
    };
    let place = super::proxy::place_of(&args.link);
    // Linked, it is a host of its zone like a sidecar: a proxy's certificate.
    let trust::Transport { tls, place, admin } = match trust::role(
        "proxy",
        place,
        None,
        args.admin,
        args.admin_token_file.as_deref(),
        &args.tls,
    ) {
        Ok(transport) => transport,
        Err(message) => return usage(message),
    };
    if let Err(message) = trust::rls_service_listener(args.listen, tls.is_some(), &args.tls) {
        return usage(message);
    }
    let control =
        match super::proxy::control_options(args.link, place, tls.clone(), args.listen.port()) {
            Ok(control) => control,
            Err(message) => return usage(message),
        };
    let (listener, addr) = match spillway_net::bind(args.listen).await {
        Ok(bound) => bound,
        Err(err) => {
            eprintln!("spillway rls: --listen: {err}");
            return ExitCode::from(1);
        }
    };
    let (client, link) = match start_engine(&args.config, control.as_ref()) {
        Ok(started) => started,
        Err(err) => {
            eprintln!("spillway rls: {err}");
            return ExitCode::from(if err.is_usage() { 2 } else { 1 });
        }
    };
    // Standalone, the file is the rules: reloaded when it changes (linked, the control plane's).
    let watcher = link
        .is_none()
        .then(|| watch_file(client.clone(), args.config.clone(), DEFAULT_POLL));
    let (stop, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let view = Arc::new(EngineView::new(
        client.clone(),
        link.as_ref().map(|l| l.status()),
    ));
    let admin_addr =
        match spillway_net::admin::start_if(args.admin, admin, view, stopped, &mut tasks).await {
            Ok(bound) => bound,
            Err(err) => {
                eprintln!("spillway rls: --admin: {err}");
                return ExitCode::from(1);
            }
        };
    let service = Rls::new(
        client,
        RlsOptions {
            response_headers: args.response_headers,
            ..RlsOptions::default()
        },
    )
    .with_allowed_sans(SanPolicy::new(args.allow_client_san));
    let server = spillway_rls::serve_with(listener, service, tls, args.grpc.limits());
    tracing::info!(%addr, admin = ?admin_addr, linked = link.is_some(), "serving Envoy's rate limit service (RLS v3)");
    super::stop_signal().await;
    tracing::info!("stopping: letting the calls in flight finish");
    server.shutdown().await;
    let _ = stop.send(true);
    for task in tasks {
        let _ = task.await;
    }
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    if let Some(link) = link {
        link.shutdown().await;
    }
    ExitCode::SUCCESS
}
