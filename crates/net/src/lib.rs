//! The server side that every long-running role shares (sidecar, aggregator, controller, rules
//! service node): binding with a clear error, an accept loop and a shutdown that give way to the
//! stop signal, the admin listener ([`admin`]), and every gRPC listener's bounds and serving
//! ([`grpc`]).
// The one exception: `memory::return_free_memory` calls glibc's `malloc_trim`.
#![deny(unsafe_code)]

pub mod admin;
pub mod grpc;
pub mod memory;

use std::net::SocketAddr;
use std::time::Duration;

pub use spillway_tls::stop::{Stop, sleep_or_stop, stopped};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use admin::AdminView;

/// A listener that could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds `addr`; returns the listener and the address it got (the real port when `addr` asked
/// for port 0).
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), BindError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| BindError { addr, source })?;
    Ok((listener, local))
}

/// How long a role's tasks get to finish after its stop signal before they are aborted.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Fires `stop` and waits for each of `tasks`, aborting one that is still running
/// [`SHUTDOWN_GRACE`] later: how an aggregator and a controller shut down.
pub async fn stop_and_join(stop: &watch::Sender<bool>, tasks: Vec<JoinHandle<()>>) {
    stop_and_join_within(stop, tasks, SHUTDOWN_GRACE).await;
}

/// Fires `stop` and waits for `tasks` at most `grace` in all (`--drain-timeout`), aborting (and
/// logging) what is still running then; returns how many tasks were aborted.
pub async fn stop_and_join_within(
    stop: &watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    grace: Duration,
) -> usize {
    stop.send_replace(true);
    let deadline = tokio::time::Instant::now() + grace;
    let mut aborted = 0;
    for task in tasks {
        let abort = task.abort_handle();
        if tokio::time::timeout_at(deadline, task).await.is_err() {
            abort.abort();
            aborted += 1;
        }
    }
    if aborted > 0 {
        tracing::warn!(
            aborted,
            ?grace,
            "drain timeout passed; tasks still running were stopped"
        );
    }
    aborted
}

/// The next connection on `listener`, or `None` once `stop` fires. A failed accept (out of file
/// descriptors and the like) is logged and retried 50 ms later rather than in a busy loop.
pub async fn accept_or_stop(
    listener: &TcpListener,
    stop: &mut Stop,
) -> Option<(TcpStream, SocketAddr)> {
    let mut changed = std::pin::pin!(stop.changed());
    spillway_tls::stop::accept_until(listener, &mut changed).await
}
