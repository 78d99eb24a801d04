//! `spillway proxy`: the sidecar, standalone from its file or linked to its zone's aggregator
//!. Wiring only: the work is in `spillway-proxy`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use spillway_client::Client;
use spillway_client::control::{ControlOptions, LinkOptions};
use spillway_core::config::{self, Config};
use spillway_proxy::{ForwardedFields, Proxy, ProxyOptions};
#[cfg(feature = "rls")]
use spillway_rls::{Rls, RlsOptions};
#[cfg(feature = "rls")]
use spillway_tls::SanPolicy;

use super::trust::{self, Place};
use crate::args::{ForwardedArg, LinkArgs, ProxyArgs};

/// Runs the proxy until SIGTERM or SIGINT, then drains the requests in flight and exits 0.
/// Bad configuration or usage exits 2, any other failure 1.
pub fn proxy(args: ProxyArgs) -> ExitCode {
    if args.database.is_some() && !args.link.aggregators.is_empty() {
        eprintln!(
            "spillway proxy: give either --aggregator or --database: linked, the rules come down from the controller, so give --database to the controller instead"
        );
        return ExitCode::from(2);
    }
    if args.link.aggregators.is_empty()
        && args.tls.tls_cert.is_some()
        && args.admin.is_none()
        && args.rls_listen.is_none()
    {
        eprintln!(
            "spillway proxy: --tls-cert secures the link to --aggregator, the --admin port and --rls-listen; give one of them"
        );
        return ExitCode::from(2);
    }
    // The connections are served by worker threads of their own (`ProxyOptions::workers`); this
    // runtime accepts, serves the admin endpoints and keeps the rules and the control link.
    let runtime = match tokio::runtime::Builder::new_current_thread()
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
    let usage = |message: String| {
        eprintln!("spillway proxy: {message}");
        ExitCode::from(2)
    };
    let place = place_of(&args.link);
    // The sidecar's own --listen is the data plane's, any address: no loopback rule for it.
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
    if let Some(addr) = args.rls_listen
        && let Err(message) = trust::rls_listener(addr, tls.is_some(), &args.tls)
    {
        return usage(message);
    }
    #[cfg_attr(not(feature = "rls"), allow(unused_variables))]
    let rls_tls = tls.clone();
    #[cfg_attr(not(feature = "rls"), allow(unused_variables))]
    let grpc = args.grpc.limits();
    let (source, admin_auth) = (tls, admin);
    let mut options = ProxyOptions::new(args.config, args.listen, args.upstream);
    options.admin = args.admin;
    options.admin_auth = admin_auth;
    options.drain_timeout = args.drain_timeout;
    options.workers = workers();
    options.upstream_timeout = args.upstream_timeout.0;
    options.header_timeout = args.header_timeout;
    options.idle_timeout = args.idle_timeout;
    options.body_timeout = args.body_timeout.0;
    options.max_connections = args.max_connections.map(std::num::NonZeroUsize::get);
    options.forwarded = match args.forwarded {
        ForwardedArg::XForwarded => ForwardedFields::XForwarded,
        ForwardedArg::Rfc7239 => ForwardedFields::Rfc7239,
        ForwardedArg::Both => ForwardedFields::Both,
        ForwardedArg::Off => ForwardedFields::Off,
    };
    // Before the proxy derives its default --max-connections from it.
    match spillway_proxy::raise_fd_limit() {
        Ok(limit) => tracing::info!("file descriptor limit: {limit}"),
        Err(err) => tracing::warn!(
            "cannot raise the file descriptor limit to its hard limit ({err}); the soft limit stays"
        ),
    }
    options.control = match control_options(args.link, place, source, args.listen.port()) {
        Ok(control) => control,
        Err(message) => return usage(message),
    };
    // Following the store: the file gives identity, control and redis, and the services the
    // store does not name; the store's services replace the file's of the same name.
    let follow = match &args.database {
        Some(url) => match follow_store(&options.config, url).await {
            Ok(follow) => Some(follow),
            Err(err) => {
                eprintln!("spillway proxy: {err:#}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    options.watch_file = follow.is_none();
    // Bound before the proxy starts, so a port in use stops the start.
    #[cfg_attr(not(feature = "rls"), allow(unused_variables))]
    let rls_listener = match args.rls_listen {
        Some(addr) => match spillway_net::bind(addr).await {
            Ok(bound) => Some(bound),
            Err(err) => {
                eprintln!("spillway proxy: --rls-listen: {err}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let proxy = match Proxy::start(options).await {
        Ok(proxy) => proxy,
        Err(err) => {
            eprintln!("spillway proxy: {err}");
            return ExitCode::from(if err.is_usage() { 2 } else { 1 });
        }
    };
    // Envoy's RLS, decided by the same engine as the proxied requests (without the `rls`
    // feature, --rls-listen was refused above).
    #[cfg(feature = "rls")]
    let rls = rls_listener.map(|(listener, addr)| {
        let options = RlsOptions {
            response_headers: args.rls_response_headers,
            ..RlsOptions::default()
        };
        let service = Rls::new(proxy.client().clone(), options)
            .with_allowed_sans(SanPolicy::new(args.allow_client_san));
        tracing::info!(%addr, "serving Envoy's rate limit service (RLS v3)");
        spillway_rls::serve_with(listener, service, rls_tls, grpc)
    });
    let following = follow.map(|(base, watcher)| {
        let client = proxy.client().clone();
        tokio::spawn(apply_store_rules(client, base, watcher))
    });
    super::stop_signal().await;
    tracing::info!("stopping: no new connections, draining the requests in flight");
    if let Some(task) = following {
        task.abort();
    }
    #[cfg(feature = "rls")]
    if let Some(rls) = rls {
        rls.shutdown().await;
    }
    proxy.shutdown().await;
    ExitCode::SUCCESS
}

/// The file's configuration and a watcher on the rules service's store.
async fn follow_store(
    file: &Path,
    url: &str,
) -> anyhow::Result<(Config, spillway_rules::RulesWatcher)> {
    let base = config::load_file(file).map_err(|err| anyhow::anyhow!("{err}"))?;
    let watcher = spillway_rules::RulesWatcher::start(url)
        .await
        .with_context(|| format!("cannot follow the rules store {url}"))?;
    Ok((base, watcher))
}

/// Applies every rule set the store announces, until the proxy stops. A rule set the proxy
/// cannot run (a `store: redis` rule without a `redis` section in the file) is logged and the
/// rules in force stay.
async fn apply_store_rules(
    client: Arc<Client>,
    base: Config,
    watcher: spillway_rules::RulesWatcher,
) {
    spillway_rules::apply_each(&watcher, |set| {
        let mut config = base.clone();
        for service in &set.config.services {
            match config.services.iter_mut().find(|s| s.name == service.name) {
                Some(own) => *own = service.clone(),
                None => config.services.push(service.clone()),
            }
        }
        match client.reload(config) {
            Ok(version) => {
                tracing::info!(
                    store_version = set.version,
                    rules_version = version,
                    "rules from the store in force"
                )
            }
            Err(err) => {
                tracing::warn!(store_version = set.version, %err, "rules from the store refused; the rules in force stay")
            }
        }
    })
    .await;
}

/// Where a host stands before its certificate is read (`--region`, `--zone`, `--host-id`),
/// which only matters linked.
pub(super) fn place_of(link: &LinkArgs) -> Place {
    if link.aggregators.is_empty()
        && (link.region.is_some() || link.zone.is_some() || link.host_id.is_some())
    {
        tracing::info!("--region, --zone and --host-id only matter with --aggregator; ignored");
    }
    Place {
        region: link.region.clone(),
        zone: link.zone.clone(),
        host: link.host_id.clone(),
    }
}

/// The control-plane link of a host given `--aggregator` (`None` standalone): its place as the
/// flags and the certificate agreed on, its TLS, and `port` for the default host id
/// (HOSTNAME:PORT).
pub(super) fn control_options(
    link: LinkArgs,
    place: Place,
    tls: Option<Arc<spillway_tls::TlsSource>>,
    port: u16,
) -> Result<Option<ControlOptions>, String> {
    let Some(aggregator) = link.aggregators.first().cloned() else {
        return Ok(None);
    };
    let (Some(region), Some(zone)) = (place.region, place.zone) else {
        return Err(
            "--aggregator needs --region and --zone (or a --tls-cert that names them), for example --region eu-west --zone eu-west-1a".into(),
        );
    };
    let host_id = place
        .host
        .unwrap_or_else(|| format!("{}:{port}", hostname()));
    let mut options = LinkOptions::new(aggregator, host_id, region, zone);
    options.aggregators = link.aggregators;
    options.tls = tls;
    let mut control = ControlOptions::new(options);
    control.state_dir = link.state_dir;
    Ok(Some(control))
}

/// One serving thread per core, or `TOKIO_WORKER_THREADS` of them when set (as for any tokio
/// program).
fn workers() -> usize {
    std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|n| n.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1)
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
