//! Serving the rules API: plaintext HTTP, which `rules serve` allows on loopback only
//! unless `--insecure-plaintext`, or server TLS whose certificate files are re-read when they
//! change, so that a rotated certificate serves the next connection without a restart.
//!
//! The TLS listener does each handshake in the connection's own task (ten seconds at most), so
//! a client that stalls or fails its handshake never holds up the others; a failure is logged
//! at debug level and the connection dropped.
//!
//! While it serves, the store's liveness is probed in the background (every 250 ms), which is
//! what `/readyz`, `/metrics` and the API's fast 503 go by.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use spillway_tls::server::{Acceptor, ClientAuth};
use spillway_tls::stop::accept_until;
use spillway_tls::{DEFAULT_TRUST_DOMAIN, TlsError, TlsFiles, TlsSource};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::{AppState, router};
use crate::auth::{Authenticator, guard};
use crate::rule::Bounds;
use crate::store::Store;

/// The certificate the service presents. Server TLS only: its clients prove who they are with
/// bearer tokens, not certificates.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: Acceptor,
}

impl ServerTls {
    /// Reads `cert` (the chain, leaf first) and `key` (PEM) once, so that a missing, broken or
    /// mismatched file stops the service at start with the file's name; afterwards every new
    /// connection uses the files as they are then.
    pub fn load(cert: PathBuf, key: PathBuf) -> Result<Self, TlsError> {
        let files = TlsFiles {
            cert,
            key,
            ca: None,
        };
        let source = TlsSource::load(files, DEFAULT_TRUST_DOMAIN)?;
        Ok(ServerTls {
            acceptor: Acceptor::new(source, ClientAuth::None, &[b"h2", b"http/1.1"]),
        })
    }

    /// The certificate files, and what was last read from them.
    pub fn source(&self) -> &Arc<TlsSource> {
        self.acceptor.source()
    }
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files = self.source().files();
        f.debug_struct("ServerTls")
            .field("cert", &files.cert)
            .field("key", &files.key)
            .finish()
    }
}

/// Serves the API in plaintext on `listener` until `shutdown` resolves, probing the store's
/// liveness and deleting expired incident overrides every second meanwhile.
pub async fn serve(
    listener: TcpListener,
    store: Store,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, store, Bounds::default(), shutdown).await
}

/// [`serve`], with bounds on what is stored other than the defaults.
pub async fn serve_with(
    listener: TcpListener,
    store: Store,
    bounds: Bounds,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AppState::with_bounds(store, bounds);
    let _background = background(&state);
    let app = router(state);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// [`serve_with`] over TLS. When `shutdown` resolves the listener closes, handshakes still in
/// progress are abandoned, and the connections finish the requests in flight.
pub async fn serve_tls(
    listener: TcpListener,
    store: Store,
    bounds: Bounds,
    tls: ServerTls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = AppState::with_bounds(store, bounds);
    let _background = background(&state);
    let app = router(state);
    accept_tls(listener, app, tls.acceptor, shutdown).await;
    Ok(())
}

/// Binds `addr` and serves, over TLS when `tls` is given; the address actually bound is logged.
pub async fn bind_and_serve(
    addr: SocketAddr,
    store: Store,
    bounds: Bounds,
    tls: Option<ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    match tls {
        Some(tls) => {
            let cert = tls.source().files().cert.display().to_string();
            tracing::info!(%addr, %cert, "rules service listening (https)");
            serve_tls(listener, store, bounds, tls, shutdown).await
        }
        None => {
            tracing::info!(%addr, "rules service listening (plaintext http)");
            serve_with(listener, store, bounds, shutdown).await
        }
    }
}

/// What runs beside the server, until the handles are dropped: the liveness probe, the sweep
/// of expired overrides, and the return of the token checks' memory after a burst.
fn background(state: &AppState) -> [AbortOnDrop; 3] {
    let probed = state.store.clone();
    [
        AbortOnDrop(tokio::spawn(async move { probed.probe_liveness().await })),
        sweep_overrides(state.store.clone()),
        return_memory(state.auth.clone()),
    ]
}

/// Every few seconds, if bearer tokens were checked with argon2 since the last time and none
/// is being checked now, hands the memory the checks freed back to the system.
fn return_memory(auth: Authenticator) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            if auth.guard().burst_ended() {
                let _ = tokio::task::spawn_blocking(guard::return_free_memory).await;
            }
        }
    }))
}

/// Ends incident overrides whose ttl ran out, every second. Skipped while the store is down, and
/// given up when it is found down half-way: the next sweep after it is back ends them.
fn sweep_overrides(store: Store) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let liveness = store.liveness();
        loop {
            tick.tick().await;
            if !liveness.is_up() {
                continue;
            }
            let failed = tokio::select! {
                swept = store.expire_overrides() => swept.err(),
                _ = liveness.gone_down() => None,
            };
            if let Some(err) = failed {
                liveness.note_failure(&format!("ending expired incident overrides: {err}"));
            }
        }
    }))
}

/// A background task that lives as long as the server future, even one dropped half-way.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn accept_tls(
    listener: TcpListener,
    app: Router,
    acceptor: Acceptor,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = auto::Builder::new(TokioExecutor::new());
    // A timer lets HTTP/1.1 enforce its header read timeout (30 s) on slow clients.
    http.http1().timer(TokioTimer::new());
    let connections = GracefulShutdown::new();
    // Dropped when the service stops, which wakes the handshakes still in progress to give up.
    let (stopping, stopped) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    while let Some((tcp, remote)) = accept_until(&listener, &mut shutdown).await {
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let http = http.clone();
        // The client's address, for the throttling of wrong tokens, as axum's plaintext server
        // gives it.
        let service = TowerToHyperService::new(
            app.clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(remote))),
        );
        let connection = connections.watcher();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            let tls = tokio::select! {
                handshake = acceptor.accept(tcp) => match handshake {
                    Ok((tls, _peer)) => tls,
                    Err(error) => {
                        tracing::debug!(%remote, %error, "TLS handshake failed");
                        return;
                    }
                },
                _ = stopped.changed() => return,
            };
            let serving = http.serve_connection(TokioIo::new(tls), service);
            if let Err(error) = connection.watch(serving).await {
                tracing::debug!(%remote, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    drop(stopping);
    connections.shutdown().await;
}
