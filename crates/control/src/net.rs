//! What every tier's links share: endpoints with the same timeouts and keep-alives, a stop
//! signal, and a sleep that gives way to it.

use std::time::Duration;

use tokio::sync::watch;
use tonic::transport::Endpoint;

use crate::error::ControlError;

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
