//! What every tier's links share: endpoints with the same timeouts and keep-alives, serving
//! until stopped, a stop signal, and a sleep and an accept that give way to it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::Endpoint;
use tonic::transport::server::{Router, TcpIncoming};

use crate::error::ControlError;

/// How long a tier's tasks get to finish after its stop signal before they are aborted.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Fires `stop` and waits for each of `tasks`, aborting one that is still running
/// [`SHUTDOWN_GRACE`] later: how an aggregator and a controller shut down.
pub async fn stop_and_join(stop: &watch::Sender<bool>, tasks: Vec<JoinHandle<()>>) {
    stop.send_replace(true);
    for task in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
            abort.abort();
        }
    }
}

/// How long a connection attempt may take before it counts as a failure.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// An HTTP/2 endpoint for `url` with Nagle off (a report is one small message that should leave
/// at once) and keep-alive pings, so a peer that vanished without closing its socket is noticed.
pub fn endpoint(url: &str) -> Result<Endpoint, ControlError> {
    let bad = |reason: String| ControlError::Url {
        url: url.to_owned(),
        reason,
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(bad("it needs an http:// scheme".into()));
    }
    Ok(Endpoint::from_shared(url.to_owned())
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true))
}

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

/// A stop signal: `true` once the component is shutting down.
pub type Stop = watch::Receiver<bool>;

/// Whether `stop` has fired (or its sender is gone, which means the same).
pub fn stopped(stop: &Stop) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

/// Sleeps for `delay` unless `stop` fires first; true if it did.
pub async fn sleep_or_stop(delay: Duration, stop: &mut Stop) -> bool {
    if stopped(stop) {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(delay) => false,
        _ = stop.changed() => true,
    }
}

/// The next connection on `listener`, or `None` once `stop` fires. A failed accept (out of file
/// descriptors and the like) is logged and retried 50 ms later rather than in a busy loop.
pub async fn accept_or_stop(
    listener: &TcpListener,
    stop: &mut Stop,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => return Some(accepted),
                Err(err) => {
                    tracing::warn!("accept failed: {err}");
                    if sleep_or_stop(Duration::from_millis(50), stop).await {
                        return None;
                    }
                }
            },
            _ = stop.changed() => return None,
        }
    }
}
