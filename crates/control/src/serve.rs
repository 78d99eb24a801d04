//! Serving a tier's gRPC services until its stop signal.

use spillway_link::Stop;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::server::{Router, TcpIncoming};

/// Serves `router` on `listener`, Nagle off, until `stop` fires; a failure is logged as `name`'s.
pub fn serve(
    router: Router,
    listener: TcpListener,
    mut stop: Stop,
    name: &'static str,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let result = router
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.changed().await;
            })
            .await;
        if let Err(err) = result {
            tracing::error!("{name} server failed: {err}");
        }
    })
}
