//! Forwarding to the upstream: HTTP/1.1 requests over a connection of their own downstream
//! connection, HTTP/2 requests (gRPC) over a pooled HTTP/2 prior-knowledge client so they keep
//! their streams and trailers, the removal of hop-by-hop headers, which belong to one connection
//! and must not travel further, and the upstream timeout: how long the upstream may take to
//! answer a request it has received whole.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use http_body_util::{Either, Empty};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::error::ProxyError;

/// How long dialing the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where admitted requests go.
#[derive(Debug)]
pub(crate) struct Upstream {
    authority: Authority,
    /// `host` for requests that arrive without one.
    host: HeaderValue,
    h2: Client<HttpConnector, Sent<Incoming>>,
    /// How long the upstream may take to send a response's head once it has the whole request;
    /// `None` waits as long as the downstream client does.
    timeout: Option<Duration>,
}

/// The upstream connection of one downstream HTTP/1.1 connection, held between its requests.
///
/// HTTP/1.1 answers one request at a time per connection, so a downstream connection needs one
/// upstream connection, no more: its requests go out on it without a pool's checkout, lock and
/// key, and without a second connection's task waiting on another one's. It is opened at the
/// first request and closed with the downstream connection; one the upstream closed in between
/// is replaced at the next request.
///
/// The connection has no task of its own: the downstream connection's task drives it while it
/// waits for the upstream's answer ([`Driven`]), while it relays the answer's body ([`Relay`]),
/// and between requests while it waits to read the next one ([`Link::tend`]), so a request and
/// its answer cross no task boundary and an upstream's close of an idle connection is answered
/// with a close at once.
#[derive(Default)]
pub(crate) struct Link(Mutex<Option<Held>>);

/// An upstream HTTP/1.1 connection: the handle requests are sent through, and the connection
/// itself, which does the reading and writing when polled.
pub(crate) struct Held {
    sender: http1::SendRequest<H1Body>,
    connection: H1Connection,
}

type H1Connection = http1::Connection<TokioIo<TcpStream>, H1Body>;

/// The body of a request sent upstream over HTTP/1.1: the downstream request's own, or none, for
/// a bodiless request sent again ([`replay_of`]).
type H1Body = Either<Sent<Incoming>, Empty<Bytes>>;

/// A request body that says when it has been sent whole, so the upstream timeout runs from
/// then: an upload that takes longer than the timeout is not cut off, only an upstream that
/// keeps a whole request unanswered.
pub(crate) struct Sent<B> {
    body: B,
    done: Option<oneshot::Sender<()>>,
}

impl<B: Body> Sent<B> {
    /// Wraps `body`, and returns the signal of its end, or `None` when it has ended already
    /// (no body): then nothing is allocated.
    fn new(body: B) -> (Self, Option<oneshot::Receiver<()>>) {
        if body.is_end_stream() {
            return (Self { body, done: None }, None);
        }
        let (done, sent) = oneshot::channel();
        (
            Self {
                body,
                done: Some(done),
            },
            Some(sent),
        )
    }
}

impl<B: Body + Unpin> Body for Sent<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        if (frame.is_none() || this.body.is_end_stream())
            && let Some(done) = this.done.take()
        {
            let _ = done.send(());
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Link {
    /// Drives the connection held between requests, if any, and lets it go if it has ended (the
    /// upstream closed it): called while the downstream connection waits for its next request,
    /// so an upstream's close is answered at once rather than at the next request.
    pub(crate) fn tend(&self, cx: &mut Context<'_>) {
        if let Ok(mut slot) = self.0.try_lock()
            && slot
                .as_mut()
                .is_some_and(|held| has_ended(&mut held.connection, cx))
        {
            *slot = None;
        }
    }

    fn take(&self) -> Option<Held> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }

    fn keep(&self, held: Held) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(held);
        }
    }
}

/// `future` (waiting on the upstream connection) with the connection driven by the same poll:
/// the connection first, so what it read or wrote is there for the future to see. A connection
/// that ends is dropped here, which fails the requests it still held, so the future cannot wait
/// on a connection that is gone.
///
/// Only the connection moves the future on (it answers or fails the request, and says when it
/// can take one), and every poll drives it first, so the future is polled without a waker of its
/// own: given this task's, the connection would wake the task for what the same poll goes on to
/// see, and the task would be polled once more for nothing.
struct Driven<'a, F> {
    connection: &'a mut Option<H1Connection>,
    future: F,
}

impl<F: Future + Unpin> Future for Driven<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        drive(this.connection, cx);
        Pin::new(&mut this.future).poll(&mut Context::from_waker(Waker::noop()))
    }
}

/// Polls `connection`, dropping it if it has ended.
fn drive(connection: &mut Option<H1Connection>, cx: &mut Context<'_>) {
    if connection.as_mut().is_some_and(|open| has_ended(open, cx)) {
        *connection = None;
    }
}

/// Polls `connection`: whether it has ended (the upstream closed it, or it failed).
fn has_ended(connection: &mut H1Connection, cx: &mut Context<'_>) -> bool {
    match Pin::new(connection).poll(cx) {
        Poll::Ready(ended) => {
            if let Err(err) = ended {
                tracing::debug!("upstream connection ended with an error: {err}");
            }
            true
        }
        Poll::Pending => false,
    }
}

/// The body of an upstream response, read through the connection it arrives on, which this body
/// drives; once read whole the connection goes back to its [`Link`] for the next request. A
/// response dropped before its end closes the connection, since the rest of it is still coming.
/// An HTTP/2 response carries no connection (the pool's tasks drive those), nor does one whose
/// connection ended with its head.
pub(crate) struct Relay {
    body: Incoming,
    returning: Option<(Held, Arc<Link>)>,
}

impl Relay {
    fn give_back(&mut self) {
        if let Some((held, link)) = self.returning.take() {
            link.keep(held);
        }
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = match &mut this.returning {
            // HTTP/1.1: only the connection fills the body, and it is driven here, so the body is
            // polled without a waker of its own, as in [`Driven`].
            Some((held, _)) => {
                let mut quiet = Context::from_waker(Waker::noop());
                match Pin::new(&mut this.body).poll_frame(&mut quiet) {
                    // The body waits on the connection: read more of it, and look again.
                    Poll::Pending if has_ended(&mut held.connection, cx) => {
                        // Gone: what the body still has, or its error, is all there is.
                        this.returning = None;
                        Pin::new(&mut this.body).poll_frame(cx)
                    }
                    Poll::Pending => Pin::new(&mut this.body).poll_frame(&mut quiet),
                    frame => frame,
                }
            }
            None => Pin::new(&mut this.body).poll_frame(cx),
        };
        let frame = ready!(frame);
        if frame.is_none() || this.body.is_end_stream() {
            this.give_back();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Relay {
    /// A bodiless response (`HEAD`, 204, 304) is never polled: it is whole from the start.
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.give_back();
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
    #[error(transparent)]
    Http1(#[from] hyper::Error),
    #[error(transparent)]
    Http2(#[from] hyper_util::client::legacy::Error),
}

/// Headers that describe one hop (RFC 9110 §7.6.1), plus `te`, handled apart.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of these, or only `connection: keep-alive`: one pass over the
    // names, comparing without hashing, finds which are there.
    let mut present = [false; 6];
    let mut te = false;
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present[i] = true;
        } else if name == header::TE {
            te = true;
        }
    }
    // Headers named in `connection` are hop-by-hop too.
    if present[0] {
        let mut values = headers.get_all(header::CONNECTION).iter();
        let first = values.next().cloned();
        // A second `connection` field is rare; only then is this list allocated.
        let rest: Vec<HeaderValue> = values.cloned().collect();
        for value in first.iter().chain(rest.iter()) {
            let Ok(value) = value.to_str() else { continue };
            for name in value.split(',') {
                let name = name.trim();
                if !name.is_empty() {
                    headers.remove(name);
                }
            }
        }
    }
    for (hop, present) in HOP_BY_HOP.iter().zip(present) {
        if present {
            headers.remove(hop);
        }
    }
    // `te: trailers` is how gRPC says it reads trailers; any other `te` is hop-by-hop.
    if te
        && !headers
            .get(header::TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"))
    {
        headers.remove(header::TE);
    }
}

impl Upstream {
    /// Parses `http://HOST:PORT` and builds the HTTP/2 pool.
    pub(crate) fn new(url: &str, timeout: Option<Duration>) -> Result<Self, ProxyError> {
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
            h2,
            timeout,
        })
    }

    /// Awaits `response` (the upstream's answer to a request being sent), failing with
    /// [`ForwardError::Timeout`] when the upstream holds a whole request longer than the timeout.
    /// The clock starts when `sent` fires (the body has gone out), or at once without it.
    async fn within<F: Future>(
        &self,
        response: F,
        sent: &mut Option<oneshot::Receiver<()>>,
    ) -> Result<F::Output, ForwardError> {
        let Some(limit) = self.timeout else {
            return Ok(response.await);
        };
        let mut response = std::pin::pin!(response);
        if let Some(signal) = sent.as_mut() {
            tokio::select! {
                biased;
                output = &mut response => return Ok(output),
                // Sent whole, or the body was dropped unsent (a failed request): either way
                // the upstream's answer is what is left to wait for.
                _ = signal => {}
            }
            *sent = None;
        }
        tokio::time::timeout(limit, response)
            .await
            .map_err(|_| ForwardError::Timeout(limit))
    }

    /// Sends `request` to the upstream, keeping its method, path, query, headers (but the
    /// hop-by-hop ones) and body, and returns the upstream's response likewise cleaned. An
    /// HTTP/1.1 request goes over `link`, the upstream connection of its downstream connection.
    pub(crate) async fn forward(
        &self,
        mut request: Request<Incoming>,
        link: Arc<Link>,
    ) -> Result<Response<Relay>, ForwardError> {
        strip_hop_by_hop(request.headers_mut());
        let (parts, body) = request.into_parts();
        let (body, mut sent) = Sent::new(body);
        let request = Request::from_parts(parts, body);
        let mut response = if request.version() == Version::HTTP_2 {
            self.forward_h2(request, &mut sent)
                .await?
                .map(|body| Relay {
                    body,
                    returning: None,
                })
        } else {
            self.forward_h1(request, link, &mut sent).await?
        };
        strip_hop_by_hop(response.headers_mut());
        Ok(response)
    }

    async fn forward_h2(
        &self,
        mut request: Request<Sent<Incoming>>,
        sent: &mut Option<oneshot::Receiver<()>>,
    ) -> Result<Response<Incoming>, ForwardError> {
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
        Ok(self.within(self.h2.request(request), sent).await??)
    }

    async fn forward_h1(
        &self,
        mut request: Request<Sent<Incoming>>,
        link: Arc<Link>,
        sent: &mut Option<oneshot::Receiver<()>>,
    ) -> Result<Response<Relay>, ForwardError> {
        *request.version_mut() = Version::HTTP_11;
        // Origin form (`/path?query`): a request in absolute form keeps only its path and query.
        if request.uri().scheme().is_some() || request.uri().authority().is_some() {
            let path = request
                .uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/"));
            *request.uri_mut() = Uri::from(path);
        }
        if !request.headers().contains_key(header::HOST) {
            request
                .headers_mut()
                .insert(header::HOST, self.host.clone());
        }
        // A connection kept from an earlier request may have been closed by the upstream since:
        // a request it gives back unsent goes out once more on a new connection. The upstream
        // may also close it just as the request arrives (its keep-alive timeout running out at
        // that moment): then the request was sent and no answer came, and only a request that
        // is safe to send twice, bodiless with an idempotent method (RFC 9110 §9.2.2), goes out
        // again on a new connection; any other gets the 502.
        let mut request = request.map(Either::Left);
        let mut kept = link.take();
        loop {
            let reused = kept.is_some();
            let Held {
                mut sender,
                connection,
            } = match kept.take() {
                Some(held) => held,
                None => self.connect_h1().await?,
            };
            let mut connection = Some(connection);
            let ready = Driven {
                connection: &mut connection,
                future: std::future::poll_fn(|cx| sender.poll_ready(cx)),
            };
            if let Err(err) = ready.await {
                if reused {
                    continue;
                }
                return Err(err.into());
            }
            let replay = if reused { replay_of(&request) } else { None };
            let response = Driven {
                connection: &mut connection,
                future: std::pin::pin!(sender.try_send_request(request)),
            };
            match self.within(response, sent).await? {
                Ok(response) => {
                    let returning =
                        connection.map(|connection| (Held { sender, connection }, link));
                    return Ok(response.map(|body| Relay { body, returning }));
                }
                Err(mut failed) => match (failed.take_message(), replay) {
                    (Some(unsent), _) if reused => request = unsent,
                    (None, Some(again)) => {
                        tracing::debug!(
                            "the upstream closed a kept connection as a request arrived ({}); sending it again on a new one",
                            failed.error()
                        );
                        request = again;
                    }
                    _ => return Err(failed.into_error().into()),
                },
            }
        }
    }

    /// Opens an HTTP/1.1 connection to the upstream, to be driven by the requests sent on it.
    async fn connect_h1(&self) -> Result<Held, ForwardError> {
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
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        Ok(Held { sender, connection })
    }
}

/// A copy of `request` to send again should the upstream close the connection under it, when
/// that is safe: an idempotent method and no body. `None` for any other request.
fn replay_of(request: &Request<H1Body>) -> Option<Request<H1Body>> {
    if !request.method().is_idempotent() || !request.body().is_end_stream() {
        return None;
    }
    let mut copy = Request::new(Either::Right(Empty::new()));
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    Some(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_and_te_trailers_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "keep-alive, x-secret".parse().unwrap());
        headers.insert("x-secret", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert("te", "trailers".parse().unwrap());
        headers.insert("x-user-id", "alice".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        let mut names: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["te", "x-user-id"]);
        headers.insert("te", "gzip".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        assert!(headers.get("te").is_none());
    }

    #[test]
    fn upstream_urls_are_checked() {
        assert!(Upstream::new("http://127.0.0.1:8080", None).is_ok());
        assert!(Upstream::new("https://127.0.0.1:8080", None).is_err());
        assert!(Upstream::new("http://127.0.0.1:8080/api", None).is_err());
        assert!(Upstream::new("127.0.0.1:8080", None).is_err());
    }
}
