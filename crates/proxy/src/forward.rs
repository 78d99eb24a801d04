//! Forwarding to the upstream: HTTP/1.1 requests over the upstream connection of their own
//! downstream connection ([`UpstreamLink`], spoken by hyper's HTTP/1.1 client), HTTP/2 requests
//! (gRPC) over a pooled HTTP/2 prior-knowledge client so they keep their streams and trailers;
//! the connect timeout, and the upstream timeout: how long the upstream may take to answer a
//! request it has received whole.
//!
//! An upstream's answer head is capped at 64 KiB (and 100 fields), as a client's request head
//! is by default: one over it is a 502. A `101 Switching Protocols` opens a tunnel only for an
//! upgrade the request asked for and the `101` answers ([`crate::upgrade`]); to a request that
//! asked for none it is a 502, never a tunnel the client did not ask for.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::answer::{self, Refusal};
use crate::body::{BodyEnd, Early, Sent};
use crate::error::ProxyError;
use crate::hop::strip_hop_by_hop;
use crate::upgrade::{Tunnel, Upgrade, switch_fault};

/// How long dialing the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What an upstream's answer head (status line and fields), or the trailer section of a chunked
/// answer, must take at most: the default cap on a client's request head.
const MAX_UPSTREAM_HEAD: usize = 64 * 1024;

/// A request on its way upstream.
type Outgoing = Sent<Incoming>;

/// Where admitted requests go.
pub(crate) struct Upstream {
    authority: Authority,
    /// `host` for requests that arrive without one.
    host: HeaderValue,
    /// How each HTTP/1.1 upstream connection is set up.
    h1: http1::Builder,
    h2: Client<HttpConnector, Outgoing>,
    /// How long the upstream may take to send a response's head once it has the whole request;
    /// `None` waits as long as the downstream client does.
    timeout: Option<Duration>,
    /// How long a request body may make no progress ([`crate::body::Progress`]); `None`: as
    /// long as the client likes.
    body_timeout: Option<Duration>,
}

/// The upstream connection of one downstream HTTP/1.1 connection, held between its requests.
///
/// HTTP/1.1 answers one request at a time per connection, so a downstream connection needs one
/// upstream connection, no more: its requests go out on it without a pool's lookup by key. It
/// is opened at the first request and closed with the downstream connection; one the upstream
/// closed in between (its task sees the close at once and ends) is replaced at the next request.
#[derive(Default)]
pub(crate) struct UpstreamLink(Mutex<Option<http1::SendRequest<Outgoing>>>);

impl UpstreamLink {
    fn take(&self) -> Option<http1::SendRequest<Outgoing>> {
        let taken = self.0.lock().ok().and_then(|mut slot| slot.take());
        taken.filter(|sender| !sender.is_closed())
    }

    fn keep(&self, sender: http1::SendRequest<Outgoing>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(sender);
        }
    }
}

/// The body of an upstream answer, or of the proxy's own answer to a request whose body
/// stalled ([`answer::body_timed_out`]).
pub(crate) enum Relay {
    Upstream {
        body: Incoming,
        /// For an HTTP/1.1 answer that came before its request's body was sent whole: the
        /// signal the body waits on, let go once the answer has been relayed whole (or dropped),
        /// which cuts the rest of the request body ([`Early::Cut`]).
        answering: Option<oneshot::Receiver<BodyEnd>>,
    },
    Empty,
    Own(Full<Bytes>),
}

impl Relay {
    fn upstream(body: Incoming) -> Self {
        Relay::Upstream {
            body,
            answering: None,
        }
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Relay::Upstream { body, answering } => {
                let frame = Pin::new(&mut *body).poll_frame(cx);
                if let Poll::Ready(None | Some(Err(_))) = frame {
                    *answering = None;
                }
                frame
            }
            Relay::Empty => Poll::Ready(None),
            Relay::Own(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Relay::Upstream { body, .. } => body.is_end_stream(),
            Relay::Empty => true,
            Relay::Own(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Relay::Upstream { body, .. } => body.size_hint(),
            Relay::Empty => SizeHint::with_exact(0),
            Relay::Own(body) => body.size_hint(),
        }
    }
}

/// Why a request could not be forwarded (answered 502).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] std::io::Error),
    #[error("connecting to the upstream timed out")]
    ConnectTimeout,
    #[error("the upstream sent no response within {0:?} of receiving the whole request")]
    Timeout(Duration),
    #[error("upstream connection: {0}")]
    Http1(#[source] hyper::Error),
    #[error("the upstream answered 101 Switching Protocols to a request that asked for no upgrade")]
    UnaskedUpgrade,
    #[error("the request body could not be read: {0}")]
    RequestBody(#[source] hyper::Error),
    #[error("the request body made no progress for {0:?}")]
    BodyTimeout(Duration),
    #[error("CONNECT is not forwarded")]
    Tunnel,
    /// The upstream answered an upgrade with a `101` that is not the handshake asked for.
    #[error("{0}")]
    Handshake(&'static str),
    #[error(transparent)]
    Http2(#[from] hyper_util::client::legacy::Error),
}

/// What forwarding a request came to.
pub(crate) enum Forwarded {
    /// The upstream's answer, cleaned.
    Answer(Response<Relay>),
    /// The proxy's own answer to a fault of the client's found while forwarding (a body that
    /// stalled or could not be read): never counted as an upstream error.
    Refused(Refusal, Response<Relay>),
    /// The upstream switched protocols (`101`): its answer, and the tunnel to run once the
    /// client has it.
    Tunnel(Response<Relay>, Tunnel),
}

impl Upstream {
    /// Parses `http://HOST:PORT` and builds the HTTP/2 pool.
    pub(crate) fn new(
        url: &str,
        timeout: Option<Duration>,
        body_timeout: Option<Duration>,
    ) -> Result<Self, ProxyError> {
        let fail = |problem: &str| ProxyError::Upstream {
            url: url.to_owned(),
            problem: problem.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|_| fail("not a URL"))?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(fail("the scheme must be http"));
        }
        let authority = uri.authority().cloned().ok_or_else(|| fail("no host"))?;
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(fail(
                "a path is not supported; requests keep their own paths",
            ));
        }
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| fail("a bad host"))?;
        let mut h1 = http1::Builder::new();
        h1.max_header_size(MAX_UPSTREAM_HEAD);
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let h2 = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Self {
            authority,
            host,
            h1,
            h2,
            timeout,
            body_timeout,
        })
    }

    /// Awaits `response` (the upstream's answer to a request being sent), failing with
    /// [`ForwardError::Timeout`] when the upstream holds a whole request longer than the timeout.
    /// The clock starts when `sent` fires (the body has gone out), or at once without it. A body
    /// that stalls before the answer begins fails it with [`ForwardError::BodyTimeout`]. `sent`
    /// is left in place while the body is still going out.
    async fn within<F: Future>(
        &self,
        response: F,
        sent: &mut Option<oneshot::Receiver<BodyEnd>>,
    ) -> Result<F::Output, ForwardError> {
        let mut response = std::pin::pin!(response);
        if let Some(signal) = sent.as_mut() {
            tokio::select! {
                // The body's end first: a stalled body also fails the answer.
                biased;
                end = signal => {
                    *sent = None;
                    match end {
                        Ok(BodyEnd::Stalled(after)) => return Err(ForwardError::BodyTimeout(after)),
                        Ok(BodyEnd::Broken(err)) => return Err(ForwardError::RequestBody(err)),
                        // Sent whole, or the body was dropped unsent (a failed request): either
                        // way the upstream's answer is what is left to wait for.
                        Ok(BodyEnd::Whole) | Err(_) => {}
                    }
                },
                output = &mut response => return Ok(output),
            }
        }
        self.timed(response).await
    }

    /// `future` (the upstream's answer to a request it has whole), within the upstream timeout.
    async fn timed<F: Future>(&self, future: F) -> Result<F::Output, ForwardError> {
        match self.timeout {
            Some(limit) => tokio::time::timeout(limit, future)
                .await
                .map_err(|_| ForwardError::Timeout(limit)),
            None => Ok(future.await),
        }
    }

    /// Sends `request` to the upstream, keeping its method, path, query, headers (but the
    /// hop-by-hop ones) and body, and returns the upstream's response likewise cleaned. An
    /// HTTP/1.1 request goes over `link`, the upstream connection of its downstream connection.
    ///
    /// A request whose body made no progress for the body timeout before any answer began is no
    /// fault of the upstream's: it is answered here, `408` ([`answer::body_timed_out`]), its
    /// upstream exchange abandoned (the HTTP/1.1 connection closed, the HTTP/2 stream reset).
    pub(crate) async fn forward(
        &self,
        mut request: Request<Incoming>,
        link: &UpstreamLink,
        grpc: bool,
        upgrade: Option<Upgrade>,
    ) -> Result<Forwarded, ForwardError> {
        let client = upgrade.map(|asked| (asked, hyper::upgrade::on(&mut request)));
        // Every upgrade field goes here, and with it whatever `connection` named; an upgrade to
        // forward is asked again.
        strip_hop_by_hop(request.headers_mut());
        if let Some((asked, _)) = &client {
            asked.ask(request.headers_mut());
        }
        let h2 = request.version() == Version::HTTP_2;
        let forwarded = if h2 {
            self.forward_h2(request).await
        } else {
            self.forward_h1(request, link, client.is_some()).await
        };
        let mut response = match forwarded {
            Ok(response) => response,
            Err(ForwardError::BodyTimeout(after)) => {
                tracing::debug!(
                    "a request body made no progress for {after:?}: answered 408, its upstream exchange abandoned"
                );
                // The rest of an HTTP/1.1 body will not be read: the connection closes.
                let answer = answer::body_timed_out(after, grpc, !h2);
                return Ok(Forwarded::Refused(
                    Refusal::BodyTimeout,
                    answer.map(Relay::Own),
                ));
            }
            Err(ForwardError::RequestBody(err)) => {
                tracing::debug!("a request body could not be read: {err}; answered 400");
                let answer = answer::bad_body(&err, grpc, !h2);
                return Ok(Forwarded::Refused(Refusal::BadBody, answer.map(Relay::Own)));
            }
            Err(err) => return Err(err),
        };
        // A `101` reaches here only for a request that asked for an upgrade.
        let (StatusCode::SWITCHING_PROTOCOLS, Some((asked, client))) = (response.status(), client)
        else {
            strip_hop_by_hop(response.headers_mut());
            return Ok(Forwarded::Answer(response));
        };
        let upstream = hyper::upgrade::on(&mut response);
        // The upstream switched. Only a handshake that answers what was asked opens a tunnel:
        // a `101` from an upstream that switches to anything (and then goes on reading HTTP/1.1
        // requests, undecided) is refused, and the upstream connection, dropped here, closes.
        if let Some(fault) = switch_fault(response.headers(), &asked) {
            return Err(ForwardError::Handshake(fault));
        }
        strip_hop_by_hop(response.headers_mut());
        // Its `101` goes back with the protocol it named, and the two connections become one
        // tunnel.
        let headers = response.headers_mut();
        headers.insert(header::UPGRADE, asked.protocol);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        Ok(Forwarded::Tunnel(response, Tunnel { client, upstream }))
    }

    async fn forward_h2(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Relay>, ForwardError> {
        let (parts, body) = request.into_parts();
        let (body, mut sent) = Sent::new(body, self.body_timeout, Early::Stream);
        let mut request = Request::from_parts(parts, body);
        // The pool is keyed by the absolute URI.
        let path = request
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTP);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path);
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        let response = self.within(self.h2.request(request), &mut sent).await??;
        Ok(response.map(Relay::upstream))
    }

    /// Sends an HTTP/1.1 request over `link`'s connection, or a new one.
    ///
    /// A connection kept from an earlier request may have been closed by the upstream since: a
    /// request not sent on it at all goes out on a new connection. The upstream may also close
    /// it just as the request arrives (its keep-alive timeout running out at that moment): then
    /// the request was sent and no answer came, and only a request that is safe to send twice,
    /// bodiless with an idempotent method, goes out again on a new connection; any other gets
    /// the 502.
    async fn forward_h1(
        &self,
        request: Request<Incoming>,
        link: &UpstreamLink,
        upgrade: bool,
    ) -> Result<Response<Relay>, ForwardError> {
        if request.method() == Method::CONNECT {
            return Err(ForwardError::Tunnel);
        }
        let (mut parts, body) = request.into_parts();
        // Origin form (`/path?query`): a request in absolute form keeps only its path and query.
        if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
            parts.uri = parts
                .uri
                .path_and_query()
                .cloned()
                .map_or_else(|| Uri::from_static("/"), Uri::from);
        }
        parts.version = Version::HTTP_11;
        if !parts.headers.contains_key(header::HOST) {
            parts.headers.insert(header::HOST, self.host.clone());
        }
        let safe_twice = parts.method.is_idempotent() && body.is_end_stream();
        let (body, mut sent) = Sent::new(body, self.body_timeout, Early::Cut);
        let mut request = Request::from_parts(parts, body);
        let (mut sender, mut reused) = match link.take() {
            Some(sender) => (sender, true),
            None => (self.connect_h1().await?, false),
        };
        let mut response = loop {
            if reused && sender.ready().await.is_err() {
                (sender, reused) = (self.connect_h1().await?, false);
                continue;
            }
            // Kept only while it may be needed: a request on a kept connection that is safe to
            // send twice.
            let copy = (reused && safe_twice).then(|| copy_of(&request));
            let mut failed = match self
                .within(sender.try_send_request(request), &mut sent)
                .await?
            {
                Ok(response) => break response,
                Err(failed) => failed,
            };
            let again = if reused && failed.message().is_some() {
                tracing::debug!(
                    "a kept upstream connection was closed before a request went out ({}); sending it on a new one",
                    failed.error()
                );
                failed.take_message()
            } else if reused && closed_under(failed.error()) && copy.is_some() {
                tracing::debug!(
                    "the upstream closed a kept connection as a request arrived ({}); sending it again on a new one",
                    failed.error()
                );
                copy
            } else {
                None
            };
            let Some(again) = again else {
                return Err(ForwardError::Http1(failed.into_error()));
            };
            request = again;
            (sender, reused) = (self.connect_h1().await?, false);
        };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            // The connection now speaks another protocol: never kept. Unasked, it is refused,
            // and closes with the answer dropped.
            if !upgrade {
                return Err(ForwardError::UnaskedUpgrade);
            }
            return Ok(response.map(|_| Relay::Empty));
        }
        link.keep(sender);
        // A `content-length` beside a `transfer-encoding` says nothing (the coding frames the
        // body), and would frame the relayed body wrongly once the coding is gone.
        if response.headers().contains_key(header::TRANSFER_ENCODING) {
            response.headers_mut().remove(header::CONTENT_LENGTH);
        }
        // An HTTP/1.0 upstream's answer is relayed as this hop's own HTTP/1.1 answer: how the
        // upstream connection ends says nothing of how the client's does.
        *response.version_mut() = Version::HTTP_11;
        Ok(response.map(|body| Relay::Upstream {
            body,
            answering: sent,
        }))
    }

    /// Opens an HTTP/1.1 connection to the upstream, its task spawned.
    async fn connect_h1(&self) -> Result<http1::SendRequest<Outgoing>, ForwardError> {
        let host = self.authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let port = self.authority.port_u16().unwrap_or(80);
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port)))
            .await
            .map_err(|_| ForwardError::ConnectTimeout)?
            .map_err(ForwardError::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = self
            .h1
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ForwardError::Http1)?;
        tokio::spawn(async move {
            if let Err(err) = connection.with_upgrades().await {
                tracing::debug!("an upstream connection ended: {err}");
            }
        });
        Ok(sender)
    }
}

/// A bodiless request again, for a second try on a new connection.
fn copy_of(request: &Request<Outgoing>) -> Request<Outgoing> {
    let mut copy = Request::new(Sent::none(Early::Cut));
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    copy
}

/// Whether an exchange failed because its connection ended under it, before any answer: the
/// upstream closed it, or reset it, rather than answered something malformed.
fn closed_under(err: &hyper::Error) -> bool {
    err.is_incomplete_message()
        || err.is_canceled()
        || err.is_closed()
        || std::error::Error::source(err).is_some_and(|source| source.is::<std::io::Error>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls_are_checked() {
        assert!(Upstream::new("http://127.0.0.1:8080", None, None).is_ok());
        assert!(Upstream::new("https://127.0.0.1:8080", None, None).is_err());
        assert!(Upstream::new("http://127.0.0.1:8080/api", None, None).is_err());
        assert!(Upstream::new("127.0.0.1:8080", None, None).is_err());
    }
}
