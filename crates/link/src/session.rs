//! What every reconnecting link shares: endpoints with the same timeouts and keep-alives, a stop
//! signal, a sleep that gives way to it, and [`reconnect`], the one loop that opens a session,
//! waits out a backoff when it is lost and opens it again (a client to its aggregator, an
//! aggregator to its controller, a controller to each peer).

use std::future::Future;
use std::time::Duration;

pub use spillway_tls::stop::{Stop, sleep_or_stop, stopped};
use spillway_tls::{Connector, Expect, TlsSource};
use std::sync::Arc;
use tonic::transport::{Channel, Endpoint};

use crate::backoff::Backoff;

/// How long a connection attempt may take before it counts as a failure.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A control-plane address that cannot be dialled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{url}\" is not a usable gRPC address ({reason}); write it like http://127.0.0.1:7001")]
pub struct UrlError {
    pub url: String,
    pub reason: String,
}

/// An HTTP/2 endpoint for `url` with Nagle off (a report is one small message that should leave
/// at once) and keep-alive pings, so a peer that vanished without closing its socket is noticed.
pub fn endpoint(url: &str) -> Result<Endpoint, UrlError> {
    let bad = |reason: String| UrlError {
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

/// Where a link dials and how: an endpoint, and for mutual TLS the connector that
/// presents the process's certificate and verifies the server's identity. The URL's scheme and
/// the transport must agree (`https://` with TLS, `http://` without), so a link never downgrades
/// silently.
#[derive(Debug, Clone)]
pub struct Target {
    url: String,
    endpoint: Endpoint,
    tls: Option<Connector>,
}

impl Target {
    /// A plaintext target (`http://`).
    pub fn plain(url: &str) -> Result<Self, UrlError> {
        Self::new(url, None)
    }

    /// A target dialled with mutual TLS from `source` when given, accepting as the server only
    /// an identity that `expect` admits.
    pub fn new(url: &str, tls: Option<(Arc<TlsSource>, Expect)>) -> Result<Self, UrlError> {
        let bad = |reason: &str| UrlError {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let https = url.starts_with("https://");
        match (https, tls.is_some()) {
            (true, false) => {
                return Err(bad(
                    "https:// needs --tls-cert, --tls-key and --tls-ca; without them write http://",
                ));
            }
            (false, true) if url.starts_with("http://") => {
                return Err(bad(
                    "with --tls-cert the link speaks mutual TLS: write https://, never http://",
                ));
            }
            _ => {}
        }
        Ok(Self {
            url: url.to_owned(),
            endpoint: endpoint(url)?,
            tls: tls.map(|(source, expect)| Connector::new(source, expect)),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the link speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Opens a channel: TCP, then the TLS handshake when the target has one.
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        match &self.tls {
            None => self.endpoint.connect().await,
            Some(connector) => {
                self.endpoint
                    .connect_with_connector(connector.clone())
                    .await
            }
        }
    }
}

/// Why a session ended other than by the stop signal.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot connect: {}", chain(.0))]
    Connect(#[source] tonic::transport::Error),
    #[error("the stream was refused: {}", .0.message())]
    Refused(tonic::Status),
    #[error("the other side ended the stream")]
    Ended,
    #[error("stream error: {}", .0.message())]
    Stream(tonic::Status),
    #[error("the stream closed")]
    Closed,
    #[error("nothing came on the stream for {} ms", .0.as_millis())]
    Silent(Duration),
}

/// An error with its causes, `: `-separated: a transport error says only "transport error", and
/// why (a refused connection, a server certificate of the wrong identity) is in its sources.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl SessionError {
    /// Whether the stream had been open: the next attempt starts from the initial backoff.
    pub fn was_open(&self) -> bool {
        !matches!(self, SessionError::Connect(_) | SessionError::Refused(_))
    }
}

/// Runs sessions with `target` until `stop` fires: each connects, then runs `session` on the
/// channel until it returns. `Ok` means it saw the stop signal; an error is logged with `what`
/// and `target`, and the next attempt comes after the backoff's next delay (from its initial
/// step again when the lost stream had been open), so a fleet that lost its aggregator at once
/// does not come back at once.
pub async fn reconnect<S, F>(
    what: &'static str,
    target: &Target,
    backoff: Backoff,
    stop: Stop,
    mut session: S,
) where
    S: FnMut(Channel, Stop) -> F,
    F: Future<Output = Result<(), SessionError>>,
{
    reconnect_any(
        what,
        std::slice::from_ref(target),
        |_| None,
        backoff,
        stop,
        |channel, stop, _| session(channel, stop),
    )
    .await;
}

/// The metadata key in which a server that is not the one to talk to (a standby controller)
/// names the one that is, as a URL: the link dials it next.
pub const LEADER_HINT: &str = "spillway-leader";

/// The longest wait between two attempts of a link with several addresses: the next address
/// is likely up (a standby about to lead, a zone's other aggregator), so it is not left
/// waiting for the backoff's cap.
pub const FAILOVER_MAX_WAIT: Duration = Duration::from_millis(500);

/// With several addresses, how long a server may take to accept a stream: one that was paused
/// (SIGSTOP) keeps its socket's backlog but answers nothing, and the link should move on.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// With several addresses, how many report intervals without a message from the server make
/// the link move to the next one: a controller instructs every zone, and an aggregator every
/// host, each interval, so three silent ones mean it stalled without ending the stream.
pub const SILENT_INTERVALS: u32 = 3;

/// Opens a stream with `open`: with `several` addresses to try, within [`OPEN_TIMEOUT`].
pub async fn open_stream<T>(
    several: bool,
    open: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, SessionError> {
    let opened = if several {
        tokio::time::timeout(OPEN_TIMEOUT, open)
            .await
            .unwrap_or_else(|_| {
                Err(tonic::Status::deadline_exceeded(
                    "the server did not accept the stream in time",
                ))
            })
    } else {
        open.await
    };
    opened.map_err(SessionError::Refused)
}

/// How long a stream of a link with `several` addresses may stay silent before it counts as
/// lost, at report interval `interval`: [`SILENT_INTERVALS`] of them, doubled for each time in
/// a row (`streak`, at most 4) the link already moved on for silence without hearing anything
/// since, so a zone whose every aggregator is silent (its controller is gone) is not dialled
/// round and round each few intervals. With one address, never: it is waited for however
/// long it is silent.
pub fn silence_limit(several: bool, interval: Duration, streak: u32) -> Duration {
    if several {
        interval * SILENT_INTERVALS * (1 << streak.min(4))
    } else {
        Duration::from_secs(86_400 * 365)
    }
}

/// [`reconnect`] over several addresses of the same service, in order: a session that ends or
/// fails moves on to the next address at once (a session is given the target it runs on); a
/// refusal that names another address in
/// [`LEADER_HINT`] dials that one next (made into a target by `hinted`, which may refuse it),
/// and a whole round of failures waits for the backoff's next delay, at most
/// [`FAILOVER_MAX_WAIT`]. With one address it is [`reconnect`] exactly.
pub async fn reconnect_any<H, S, F>(
    what: &'static str,
    targets: &[Target],
    hinted: H,
    mut backoff: Backoff,
    mut stop: Stop,
    mut session: S,
) where
    H: Fn(&str) -> Option<Target>,
    S: FnMut(Channel, Stop, &Target) -> F,
    F: Future<Output = Result<(), SessionError>>,
{
    let Some(first) = targets.first() else {
        return;
    };
    let several = targets.len() > 1;
    let mut next = 0;
    let mut hint: Option<Target> = None;
    loop {
        if stopped(&stop) {
            return;
        }
        let followed_hint = hint.is_some();
        let target = hint
            .take()
            .unwrap_or_else(|| targets.get(next).unwrap_or(first).clone());
        let result = tokio::select! {
            connected = target.connect() => match connected {
                Ok(channel) => session(channel, stop.clone(), &target).await,
                Err(err) => Err(SessionError::Connect(err)),
            },
            _ = stop.changed() => return,
        };
        let err = match result {
            Ok(()) => return,
            Err(err) => err,
        };
        if err.was_open() {
            backoff.reset();
        }
        tracing::warn!(target = %target.url(), "{what} link down: {err}");
        if !several {
            if sleep_or_stop(backoff.next_delay(), &mut stop).await {
                return;
            }
            continue;
        }
        if !followed_hint {
            next = (next + 1) % targets.len();
            if err.was_open() {
                tracing::info!(
                    from = %target.url(),
                    to = %targets.get(next).unwrap_or(first).url(),
                    "{what} link: moving to the next address"
                );
            }
        }
        // A hint is followed once per refusal, so two standbys naming each other cannot keep
        // the link from waiting.
        if !followed_hint
            && let SessionError::Refused(status) | SessionError::Stream(status) = &err
            && let Some(url) = status
                .metadata()
                .get(LEADER_HINT)
                .and_then(|v| v.to_str().ok())
            && url != target.url()
            && let Some(leader) = hinted(url)
        {
            tracing::info!(leader = %url, "{what} link: following the standby's hint");
            hint = Some(leader);
            continue;
        }
        // The stream that was open is lost: the next address gets its chance at once.
        if err.was_open() {
            continue;
        }
        if next == 0 && sleep_or_stop(backoff.next_delay().min(FAILOVER_MAX_WAIT), &mut stop).await
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::watch;

    #[test]
    fn an_address_without_a_scheme_says_how_to_write_it() {
        let err = endpoint("127.0.0.1:7001").unwrap_err();
        assert!(err.to_string().contains("http://127.0.0.1:7001"), "{err}");
        assert!(endpoint("http://127.0.0.1:7001").is_ok());
    }

    #[test]
    fn scheme_and_transport_must_agree() {
        let err = Target::plain("https://127.0.0.1:7001").unwrap_err();
        assert!(err.to_string().contains("--tls-cert"), "{err}");
        assert!(!Target::plain("http://127.0.0.1:7001").unwrap().is_tls());
    }

    #[tokio::test]
    async fn reconnect_runs_no_session_without_a_connection_and_ends_when_stopped() {
        // A port nobody listens on: every attempt fails to connect.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let (stop_tx, stop) = watch::channel(false);
        let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        let counted = attempts.clone();
        let target = Target::plain(&url).unwrap();
        let task = tokio::spawn(async move {
            reconnect("test", &target, backoff, stop, move |_, _| {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                async { Ok(()) }
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop_tx.send_replace(true);
        task.await.unwrap();
        assert_eq!(
            attempts.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "no session runs without a connection"
        );
    }
}
