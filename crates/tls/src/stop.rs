//! What every task of a long-running role shares, on either side of a connection: the stop
//! signal ([`Stop`]), a sleep that gives way to it, and the one accept loop of every listener
//! ([`accept_until`]): the lowest crate with sockets, so that the client side (the link) and the
//! server side (net, the TLS listeners, the rules service) use the same ones.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

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

/// How long the accept loop waits after a failed accept (out of file descriptors and the like)
/// before it tries again, rather than spinning.
pub const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// The next connection on `listener`, or `None` once `until` completes (the listener is
/// stopping). A failed accept is logged and retried [`ACCEPT_RETRY`] later. After `None`,
/// `until` has completed and must not be passed again.
pub async fn accept_until<F>(
    listener: &TcpListener,
    until: &mut F,
) -> Option<(TcpStream, SocketAddr)>
where
    F: Future + Unpin,
{
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => return Some(accepted),
                Err(err) => {
                    tracing::warn!("accept failed: {err}");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_RETRY) => {}
                        _ = &mut *until => return None,
                    }
                }
            },
            _ = &mut *until => return None,
        }
    }
}
