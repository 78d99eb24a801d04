//! Serving a tier's gRPC services until its stop signal, in plaintext or over mutual TLS.

use std::sync::Arc;

use spillway_link::Stop;
use spillway_tls::server::{Acceptor, ClientAuth, incoming};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::server::{Router, TcpIncoming};

use crate::trust::Trust;

/// Serves `router` on `listener`, Nagle off, until `stop` fires; a failure is logged as `name`'s.
/// When `trust` has certificate files, every connection first completes a mutual-TLS handshake
/// (a failed one is counted by `trust`), and the services find the peer's identity in each
/// request's extensions.
pub fn serve(
    router: Router,
    listener: TcpListener,
    trust: Arc<Trust>,
    mut stop: Stop,
    name: &'static str,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.changed().await;
        };
        let result = match trust.tls() {
            None => {
                let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
            Some(source) => {
                let acceptor = Acceptor::new(source.clone(), ClientAuth::Required, &[b"h2"]);
                let incoming = incoming(listener, acceptor, trust.on_handshake_failure());
                router
                    .serve_with_incoming_shutdown(incoming, shutdown)
                    .await
            }
        };
        if let Err(err) = result {
            tracing::error!("{name} server failed: {err}");
        }
    })
}
