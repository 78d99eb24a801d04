//! Serving a tier's gRPC services until its stop signal, in plaintext or over mutual TLS, within
//! the listener's bounds ([`crate::listener`]).

use std::sync::Arc;

use spillway_link::Stop;
use spillway_tls::server::{Acceptor, ClientAuth};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::listener::{CallKind, GrpcLimits, Listener, serve_grpc};
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
    let tls = trust.tls().map(|source| {
        (
            Acceptor::new(source.clone(), ClientAuth::Required, &[b"h2"]),
            trust.on_handshake_failure(),
        )
    });
    let spec = Listener {
        name,
        limits,
        calls: CallKind::Streaming,
        tls,
    };
    tokio::spawn(serve_grpc(routes, listener, spec, async move {
        let _ = stop.changed().await;
    }))
}
