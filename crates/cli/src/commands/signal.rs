//! How a long-running command learns it is asked to stop.

/// Waits until the process is asked to stop: SIGTERM (how orchestrators stop a service) or SIGINT
/// (Ctrl-C). Without a SIGTERM handler (it cannot be installed), SIGINT alone.
pub async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(err) => {
            tracing::warn!(%err, "cannot listen for SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
