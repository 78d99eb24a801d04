//! Every gRPC listener of Spillway (the control plane's, RLS and RLQS), bounded as the proxy's
//! own listener is: a cap on open connections, `SETTINGS_MAX_CONCURRENT_STREAMS` on each, a
//! deadline for a request message that does not arrive, an idle close and HTTP/2 keepalive.
//!
//! Without these one client costs whatever it likes: one HTTP/2 connection that opens 20,000
//! streams and sends headers but never a message held 20,000 streams open (187 MB). With them a
//! connection holds at most [`GrpcLimits::max_streams`] (the rest are refused with
//! `REFUSED_STREAM`), a unary call gets [`GrpcLimits::request_timeout`] to arrive and be
//! answered, and a silent connection is closed.
//!
//! [`serve_grpc`] accepts, counts and (with TLS) handshakes each connection and serves tonic's
//! [`Routes`] on it with hyper's HTTP/2 server; [`calls`] wraps each call. [`spawn_grpc`] is how
//! every role starts one, in plaintext or over mutual TLS.

mod calls;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use spillway_tls::TlsSource;
use spillway_tls::server::{Acceptor, ClientAuth, HandshakeRejected, OnReject};
use spillway_tls::stop::accept_until;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::transport::server::TcpConnectInfo;

use calls::{Calls, Connection};

/// How often refused connections are logged at most.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// How long a keepalive ping may go unanswered before the connection is closed as dead.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The bounds of one gRPC listener (`--grpc-max-connections`, `--grpc-max-streams`,
/// `--grpc-request-timeout`, `--grpc-idle-timeout`, `--grpc-keepalive`). The defaults are far
/// above what Envoy or a Spillway fleet uses (an Envoy worker keeps one connection with a few
/// dozen calls in flight at most; a proxy one link stream) and far below what hurts: at most
/// 1,024 streams a connection, about 10 MB of open streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcLimits {
    /// Open connections at most; a new one beyond is accepted and closed at once, and logged.
    pub max_connections: usize,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS`: the calls one connection may have open at once; a
    /// stream beyond is refused (`RST_STREAM` with `REFUSED_STREAM`), which clients retry.
    pub max_streams: u32,
    /// A unary call (RLS) must arrive and be answered within this, or it is answered
    /// `DEADLINE_EXCEEDED`.
    pub request_timeout: Duration,
    /// A connection with no open call for this long is closed (`GOAWAY`); a streaming call whose
    /// first message has not come within it, or whose begun message has not arrived whole
    /// within it, is ended (`DEADLINE_EXCEEDED`).
    pub idle_timeout: Duration,
    /// A connection that has sent nothing for this long is pinged, and closed when the ping is
    /// not answered within [`KEEPALIVE_TIMEOUT`] (a peer that vanished without a FIN).
    pub keepalive: Duration,
}

impl Default for GrpcLimits {
    fn default() -> Self {
        GrpcLimits {
            max_connections: 10_000,
            max_streams: 1_024,
            request_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
            keepalive: Duration::from_secs(30),
        }
    }
}

/// Which calls a listener serves, and so how [`GrpcLimits::request_timeout`] applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// Unary calls only (RLS): the whole call has the request timeout.
    Unary,
    /// Long-lived streams (RLQS, the control plane's links): the first message, and each message
    /// once begun, have the idle timeout.
    Streaming,
}

/// One listener: what it is called in logs, its bounds, its calls and, for mutual TLS, the
/// acceptor and what to do with a failed handshake.
#[derive(Clone)]
pub struct Listener {
    pub name: &'static str,
    pub limits: GrpcLimits,
    pub calls: CallKind,
    pub tls: Option<(Acceptor, OnReject)>,
}

/// Serves `routes` on `listener` until `shutdown` completes: then stops accepting, tells every
/// connection to finish (`GOAWAY`) and returns when the last has closed. Nagle is off (a call is
/// one small frame each way).
pub async fn serve_grpc(
    routes: Routes,
    listener: TcpListener,
    spec: Listener,
    shutdown: impl Future<Output = ()>,
) {
    let routes = routes.prepare();
    let limits = spec.limits;
    let mut h2 = http2::Builder::new(TokioExecutor::new());
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams.max(1))
        .keep_alive_interval(Some(limits.keepalive))
        .keep_alive_timeout(KEEPALIVE_TIMEOUT);
    let shared = Arc::new(Shared {
        routes,
        h2,
        spec,
        open: AtomicUsize::new(0),
        refused: AtomicU64::new(0),
    });
    let (stop, stopped) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    let mut last_log: Option<Instant> = None;
    let mut unlogged = 0u64;
    while let Some((tcp, remote)) = accept_until(&listener, &mut shutdown).await {
        // Only this loop counts connections in, so the check and the count cannot race.
        if shared.open.load(Ordering::Acquire) >= shared.spec.limits.max_connections.max(1) {
            drop(tcp);
            shared.refused.fetch_add(1, Ordering::Relaxed);
            unlogged += 1;
            let now = Instant::now();
            if last_log.is_none_or(|last| now.duration_since(last) >= REFUSAL_LOG_EVERY) {
                tracing::warn!(
                    refused = unlogged,
                    max_connections = shared.spec.limits.max_connections,
                    "{}: {unlogged} connection(s) refused (closed at once) since the last such line: the --grpc-max-connections cap is reached",
                    shared.spec.name,
                );
                last_log = Some(now);
                unlogged = 0;
            }
            continue;
        }
        shared.open.fetch_add(1, Ordering::AcqRel);
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(shared.clone(), tcp, remote, stopped.clone()));
    }
    drop(listener);
    let _ = stop.send(true);
    drop(stopped);
    // Every connection's task holds a receiver: they are all gone when it is closed.
    stop.closed().await;
}

/// Starts serving `routes` on `listener` as `name` (in logs) within `limits` until `shutdown`
/// completes: in plaintext, or, given certificate files, with every connection first completing a
/// mutual-TLS handshake (a failed one handed to its `OnReject`), the services finding the peer's
/// identity in each request's extensions.
pub fn spawn_grpc(
    routes: Routes,
    listener: TcpListener,
    name: &'static str,
    limits: GrpcLimits,
    calls: CallKind,
    tls: Option<(Arc<TlsSource>, OnReject)>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    let tls = tls.map(|(source, on_reject)| {
        (
            Acceptor::new(source, ClientAuth::Required, &[b"h2"]),
            on_reject,
        )
    });
    let spec = Listener {
        name,
        limits,
        calls,
        tls,
    };
    tokio::spawn(serve_grpc(routes, listener, spec, shutdown))
}

/// What every connection of a listener shares.
struct Shared {
    routes: Routes,
    h2: http2::Builder<TokioExecutor>,
    spec: Listener,
    /// Connections open (counted in by the accept loop, out by their task).
    open: AtomicUsize,
    refused: AtomicU64,
}

/// Counts a connection out when its task ends, however it ends.
struct Counted(Arc<Shared>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One accepted connection, from its handshake (with TLS) to its close.
async fn connection(
    shared: Arc<Shared>,
    tcp: TcpStream,
    remote: SocketAddr,
    mut stop: watch::Receiver<bool>,
) {
    let _counted = Counted(shared.clone());
    match &shared.spec.tls {
        None => {
            let info = TcpConnectInfo {
                local_addr: tcp.local_addr().ok(),
                remote_addr: Some(remote),
            };
            drive(&shared, tcp, info, stop).await;
        }
        Some((acceptor, on_reject)) => {
            let accepted = tokio::select! {
                accepted = acceptor.accept(tcp) => accepted,
                _ = stop.changed() => return,
            };
            match accepted {
                Ok((tls, peer)) => drive(&shared, tls, peer, stop).await,
                Err(error) => on_reject(&HandshakeRejected { remote, error }),
            }
        }
    }
}

/// Serves one connection until it ends, the listener stops (`GOAWAY`, then the calls in flight
/// finish) or it has had no open call for the idle timeout.
async fn drive<IO, I>(shared: &Shared, io: IO, info: I, mut stop: watch::Receiver<bool>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    I: Clone + Send + Sync + 'static,
{
    let limits = shared.spec.limits;
    let state = Arc::new(Connection::new());
    let calls = Calls::new(
        shared.routes.clone(),
        info,
        state.clone(),
        shared.spec.calls,
        limits,
    );
    let mut conn = pin!(shared.h2.serve_connection(TokioIo::new(io), calls));
    let idle = limits.idle_timeout;
    let mut check = pin!(tokio::time::sleep(idle));
    let mut closing = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!("{} connection ended: {err}", shared.spec.name);
                }
                return;
            }
            _ = stop.changed(), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = check.as_mut(), if !closing => match state.idle_for() {
                Some(quiet) if quiet >= idle => {
                    tracing::debug!("{}: closing a connection with no call for {idle:?}", shared.spec.name);
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
                Some(quiet) => check.as_mut().reset(Instant::now() + (idle - quiet)),
                None => check.as_mut().reset(Instant::now() + idle),
            },
        }
    }
}
