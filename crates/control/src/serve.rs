//! Serving a tier's gRPC services until its stop signal, in plaintext or over mutual TLS, within
//! the listener's bounds ([`crate::listener`]).

use std::sync::Arc;

use spillway_link::Stop;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::listener::{CallKind, GrpcLimits, spawn_grpc};
use crate::trust::Trust;

/// Serves `routes` on `listener` within `limits` until `stop` fires; `name` names it in logs.
/// When `trust` has certificate files, every connection first completes a mutual-TLS handshake
/// (a failed one is counted by `trust`), and the services find the peer's identity in each
/// request's extensions.
pub fn serve(
    routes: Routes,
    listener: TcpListener,
    trust: Arc<Trust>,
    limits: GrpcLimits,
    mut stop: Stop,
    name: &'static str,
) -> JoinHandle<()> {
    let tls = trust
        .tls()
        .map(|source| (source.clone(), trust.on_handshake_failure()));
    spawn_grpc(
        routes,
        listener,
        name,
        limits,
        CallKind::Streaming,
        tls,
        async move {
            let _ = stop.changed().await;
        },
    )
}
