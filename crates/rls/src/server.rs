//! The gRPC side: the tonic service and its listener, in plaintext (h2c, for an Envoy on the
//! same host) or mutual TLS with the process's certificate files.

use std::sync::Arc;
use std::time::Duration;

use spillway_client::Client;
use spillway_net::grpc::{CallKind, GrpcLimits, spawn_grpc};
use spillway_tls::server::OnReject;
use spillway_tls::{SanPolicy, TlsSource};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::decide::{BadRequest, RlsOptions, decide};
use crate::pb;
use crate::peer::refusal;
use crate::rlqs::Rlqs;

/// `RateLimitService` answered from `client`, the engine the process decides everything else
/// with (the sidecar's own, whose rules reload and follow the control plane).
#[derive(Clone)]
pub struct Rls {
    client: Arc<Client>,
    options: RlsOptions,
    allow: SanPolicy,
}

impl Rls {
    pub fn new(client: Arc<Client>, options: RlsOptions) -> Self {
        Self {
            client,
            options,
            allow: SanPolicy::default(),
        }
    }

    /// Answers only clients whose certificate has a URI SAN that `allow` matches (Envoy's mesh
    /// identities, `--allow-client-san`); others get `PERMISSION_DENIED`. Needs mutual
    /// TLS: without a client certificate every call is refused. An empty policy admits every
    /// client the listener admits.
    pub fn with_allowed_sans(mut self, allow: SanPolicy) -> Self {
        self.allow = allow;
        self
    }

    /// Why the peer of `request` may not call, if it may not.
    fn refusal<T>(&self, request: &Request<T>) -> Option<Status> {
        refusal(&self.allow, request, "RLS call")
    }
}

impl From<BadRequest> for Status {
    fn from(err: BadRequest) -> Self {
        Status::invalid_argument(err.to_string())
    }
}

#[tonic::async_trait]
impl pb::RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        if let Some(refusal) = self.refusal(&request) {
            return Err(refusal);
        }
        let request = request.into_inner();
        match decide(&self.client, &request, &self.options).await {
            Ok(response) => Ok(Response::new(response)),
            Err(err) => {
                tracing::debug!(domain = %request.domain, "ShouldRateLimit refused: {err}");
                Err(err.into())
            }
        }
    }
}

/// How long the answers in flight get at shutdown before the server is aborted.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A running RLS listener; dropping it stops the server too.
pub struct RlsServer {
    stop: oneshot::Sender<()>,
    /// Ends the open streams (RLQS), which a graceful stop would otherwise wait for.
    streams: Option<watch::Sender<bool>>,
    task: JoinHandle<()>,
}

impl RlsServer {
    /// Stops accepting, lets the calls in flight finish (5 s at most) and returns.
    pub async fn shutdown(self) {
        if let Some(streams) = &self.streams {
            let _ = streams.send(true);
        }
        let _ = self.stop.send(());
        let mut task = self.task;
        if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// Serves `rls` on `listener` until [`RlsServer::shutdown`], within the default [`GrpcLimits`].
/// With `tls`, every connection first completes a mutual-TLS handshake against the certificate
/// files' CA (a failed one is logged); without it, h2c.
pub fn serve(listener: TcpListener, rls: Rls, tls: Option<Arc<TlsSource>>) -> RlsServer {
    serve_with(listener, rls, tls, GrpcLimits::default())
}

/// [`serve`] within `limits` (`--grpc-max-streams` and the other listener flags). Each call is
/// unary: it must arrive and be answered within the request timeout.
pub fn serve_with(
    listener: TcpListener,
    rls: Rls,
    tls: Option<Arc<TlsSource>>,
    limits: GrpcLimits,
) -> RlsServer {
    let routes = Routes::new(pb::RateLimitServiceServer::new(rls));
    run(listener, routes, tls, limits, CallKind::Unary, "RLS", None)
}

/// Serves `rlqs` on `listener` as [`serve`] serves RLS; at [`RlsServer::shutdown`] every open
/// stream ends first (each Envoy reconnects to another aggregator or lets its assignments lapse).
pub fn serve_rlqs(listener: TcpListener, rlqs: Rlqs, tls: Option<Arc<TlsSource>>) -> RlsServer {
    serve_rlqs_with(listener, rlqs, tls, GrpcLimits::default())
}

/// [`serve_rlqs`] within `limits`. The calls are streams: a stream's first message must come,
/// and each message once begun must arrive whole, within the idle timeout.
pub fn serve_rlqs_with(
    listener: TcpListener,
    rlqs: Rlqs,
    tls: Option<Arc<TlsSource>>,
    limits: GrpcLimits,
) -> RlsServer {
    let streams = rlqs.stopper();
    let routes = Routes::new(
        crate::rlqs::pb::RateLimitQuotaServiceServer::new(rlqs)
            .max_decoding_message_size(crate::rlqs::MAX_MESSAGE_BYTES),
    );
    run(
        listener,
        routes,
        tls,
        limits,
        CallKind::Streaming,
        "RLQS",
        Some(streams),
    )
}

fn run(
    listener: TcpListener,
    routes: Routes,
    tls: Option<Arc<TlsSource>>,
    limits: GrpcLimits,
    calls: CallKind,
    name: &'static str,
    streams: Option<watch::Sender<bool>>,
) -> RlsServer {
    let (stop, stopped) = oneshot::channel::<()>();
    let tls = tls.map(|source| {
        let on_reject: OnReject = Arc::new(move |rejected| {
            tracing::warn!(
                peer = %rejected.remote,
                "{name} TLS handshake failed: {}",
                rejected.error
            );
        });
        (source, on_reject)
    });
    let task = spawn_grpc(routes, listener, name, limits, calls, tls, async move {
        let _ = stopped.await;
    });
    RlsServer {
        stop,
        streams,
        task,
    }
}
