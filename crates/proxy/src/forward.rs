//! Forwarding to the upstream: HTTP/1.1 requests over the upstream connection of their own
//! downstream connection, spoken by [`crate::h1`], HTTP/2 requests (gRPC) over a pooled HTTP/2 prior-knowledge client so they keep
//! their streams and trailers, the removal of hop-by-hop headers, which belong to one connection
//! and must not travel further, the upstream timeout: how long the upstream may take to
//! answer a request it has received whole, and the body timeout: how long a request body may
//! make no progress before the request is cut ([`Progress`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, Uri, Version};
use http_body_util::Full;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use crate::answer::{self, Refusal};
use crate::error::ProxyError;
use crate::h1::{self, Conn, H1Error, Head, Outgoing, Reading, UpstreamSlot};

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
    /// How long a request body may make no progress ([`Progress`]); `None`: as long as the
    /// client likes.
    body_timeout: Option<Duration>,
}

/// The body timeout of one request body: how long the proxy has been ready for its next frame
/// without one coming. The clock runs only while the body is polled and has nothing (not while
/// the upstream is slow to take what came), and restarts at every frame, as nginx's
/// `client_body_timeout` runs between two reads.
pub(crate) struct Progress {
    timeout: Duration,
    /// When the current wait for a frame began; `None` between waits.
    since: Option<Instant>,
    /// Made at the body's first wait, and moved on only when it fires early: one timer a body.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Progress {
    fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            since: None,
            timer: None,
        }
    }

    /// The body gave a frame (or ended): the next wait starts afresh.
    fn advanced(&mut self) {
        self.since = None;
    }

    /// The body has nothing yet: whether it has now had nothing for the whole timeout. Registers
    /// the task to be woken when it will have.
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = *self.since.get_or_insert_with(Instant::now) + self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            if Instant::now() >= deadline {
                return true;
            }
            // Set for an earlier wait that got its frame in time.
            timer.as_mut().reset(deadline);
        }
    }

    /// The next frame of `body`, or the timeout once the body has made no progress for it.
    fn poll_frame<B: Body + Unpin>(
        progress: &mut Option<Self>,
        body: &mut B,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<FrameOf<B>>, Duration>> {
        match Pin::new(body).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(progress) = progress {
                    progress.advanced();
                }
                Poll::Ready(Ok(frame))
            }
            Poll::Pending => match progress {
                Some(progress) => {
                    if progress.stalled(cx) {
                        Poll::Ready(Err(progress.timeout))
                    } else {
                        Poll::Pending
                    }
                }
                None => Poll::Pending,
            },
        }
    }
}

/// One frame of a body `B`, or its error.
type FrameOf<B> = Result<Frame<<B as Body>::Data>, <B as Body>::Error>;

/// How a request body forwarded over HTTP/2 ended, told to the request waiting for its answer.
#[derive(Debug)]
enum BodyEnd {
    /// Sent whole: the upstream timeout runs from here.
    Whole,
    /// Cut after making no progress for this long, before any answer: answered 408.
    Stalled(Duration),
    /// The client's body failed (a reset stream, a malformed frame) before any answer:
    /// answered 400.
    Broken(hyper::Error),
}

/// Why a request body forwarded over HTTP/2 stopped short.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the client's request body failed")]
    Read,
    #[error("the request body made no progress for {0:?}")]
    Stalled(Duration),
}

/// A request body that says when it has been sent whole, so the upstream timeout runs from
/// then: an upload that takes longer than the timeout is not cut off, only an upstream that
/// keeps a whole request unanswered. Until the upstream's answer begins it also keeps the body
/// timeout, and when that passes it ends the body with an error (so the upstream stream is
/// reset) and says so; once an answer has begun the exchange is a stream of the upstream's
/// choosing (a gRPC bidirectional call) and the body may pause as long as it likes.
pub(crate) struct Sent<B> {
    body: B,
    done: Option<oneshot::Sender<BodyEnd>>,
    progress: Option<Progress>,
}

impl<B: Body> Sent<B> {
    /// Wraps `body`, and returns the signal of its end, or `None` when it has ended already
    /// (no body): then nothing is allocated.
    fn new(body: B, body_timeout: Option<Duration>) -> (Self, Option<oneshot::Receiver<BodyEnd>>) {
        if body.is_end_stream() {
            return (
                Self {
                    body,
                    done: None,
                    progress: None,
                },
                None,
            );
        }
        let (done, sent) = oneshot::channel();
        (
            Self {
                body,
                done: Some(done),
                progress: body_timeout.map(Progress::new),
            },
            Some(sent),
        )
    }
}

impl<B: Body<Error = hyper::Error> + Unpin> Body for Sent<B> {
    type Data = B::Data;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        // The answer has begun (the request dropped its end of the signal): no body timeout.
        if this.done.as_ref().is_none_or(oneshot::Sender::is_closed) {
            this.progress = None;
        }
        let frame = match ready!(Progress::poll_frame(&mut this.progress, &mut this.body, cx)) {
            Ok(frame) => frame,
            Err(after) => {
                if let Some(done) = this.done.take() {
                    let _ = done.send(BodyEnd::Stalled(after));
                }
                return Poll::Ready(Some(Err(BodyError::Stalled(after))));
            }
        };
        let mut frame = match frame {
            None => None,
            Some(Ok(frame)) => Some(frame),
            Some(Err(err)) => {
                if let Some(done) = this.done.take() {
                    let _ = done.send(BodyEnd::Broken(err));
                }
                return Poll::Ready(Some(Err(BodyError::Read)));
            }
        };
        if let Some(trailers) = frame.as_mut().and_then(Frame::trailers_mut) {
            filter_trailers(trailers);
        }
        if (frame.is_none() || this.body.is_end_stream())
            && let Some(done) = this.done.take()
        {
            let _ = done.send(BodyEnd::Whole);
        }
        Poll::Ready(frame.map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The body of an upstream answer: an HTTP/1.1 one read off its connection ([`Reading`]), an
/// HTTP/2 one from the pool's stream, or none; or of the proxy's own answer to a request whose
/// body stalled ([`answer::body_timed_out`]).
pub(crate) enum Relay {
    H1(Reading),
    H2(Incoming),
    Empty,
    Own(Full<Bytes>),
}

/// Why an answer's body could not be relayed whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    #[error(transparent)]
    H1(#[from] H1Error),
    #[error(transparent)]
    H2(#[from] hyper::Error),
}

impl Body for Relay {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        match self.get_mut() {
            Relay::H1(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Relay::H2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Relay::Empty => Poll::Ready(None),
            Relay::Own(body) => Pin::new(body)
                .poll_frame(cx)
                .map_err(|never| match never {}),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Relay::H1(body) => body.is_end_stream(),
            Relay::H2(body) => body.is_end_stream(),
            Relay::Empty => true,
            Relay::Own(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Relay::H1(body) => body.size_hint(),
            Relay::H2(body) => body.size_hint(),
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
    #[error(transparent)]
    Http1(#[from] H1Error),
    #[error("the request body could not be read: {0}")]
    RequestBody(#[source] hyper::Error),
    #[error("the request body made no progress for {0:?}")]
    BodyTimeout(Duration),
    #[error("CONNECT is not forwarded")]
    Tunnel,
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

/// An HTTP/1.1 upgrade both sides agreed to (a WebSocket): the client's connection, once hyper
/// has sent it the `101`, and the upstream connection that answered it, each byte of one
/// copied to the other until either ends.
pub(crate) struct Tunnel {
    client: hyper::upgrade::OnUpgrade,
    upstream: Conn,
}

impl Tunnel {
    /// Copies both ways until one side ends: first what the upstream sent right after its `101`
    /// (already read with the head), then everything. Returns the bytes copied each way
    /// (client to upstream, upstream to client).
    pub(crate) async fn run(self) -> std::io::Result<(u64, u64)> {
        use tokio::io::AsyncWriteExt as _;
        let upgraded = self.client.await.map_err(std::io::Error::other)?;
        let mut client = hyper_util::rt::TokioIo::new(upgraded);
        let (mut upstream, early) = self.upstream.into_parts();
        if !early.is_empty() {
            client.write_all(&early).await?;
        }
        let (up, down) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
        Ok((up, down + early.len() as u64))
    }
}

/// The protocol an HTTP/1.1 request asks to upgrade to (RFC 9110 §7.8), when it asks in full:
/// `upgrade` named in `connection`, an `upgrade` field, and no body (a handshake has none; a
/// request with a body is forwarded as an ordinary one, its `upgrade` dropped).
fn upgrade_asked(request: &Request<Incoming>) -> Option<HeaderValue> {
    if request.version() != Version::HTTP_11 || !request.body().is_end_stream() {
        return None;
    }
    let headers = request.headers();
    let protocol = headers.get(header::UPGRADE)?;
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
        .then(|| protocol.clone())
}

/// Fields a trailer section must not carry (RFC 9110 §6.5.1), removed from request trailers
/// before they go on: framing (a `content-length` or `transfer-encoding` in trailers is how a
/// request would be made to mean two things), routing, request modifiers, authentication,
/// and how the content is to be read. Hop-by-hop fields go too.
const NOT_IN_TRAILERS: [HeaderName; 25] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::CONTENT_LENGTH,
    header::HOST,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::EXPECT,
    header::MAX_FORWARDS,
    header::RANGE,
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

/// Removes from a request's trailer section what may not be in one ([`NOT_IN_TRAILERS`]).
fn filter_trailers(trailers: &mut HeaderMap) {
    for name in &NOT_IN_TRAILERS {
        trailers.remove(name);
    }
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
            body_timeout,
        })
    }

    /// Awaits `response` (the upstream's answer to a request being sent), failing with
    /// [`ForwardError::Timeout`] when the upstream holds a whole request longer than the timeout.
    /// The clock starts when `sent` fires (the body has gone out), or at once without it. A body
    /// that stalls before the answer begins fails it with [`ForwardError::BodyTimeout`].
    async fn within<F: Future>(
        &self,
        response: F,
        sent: Option<oneshot::Receiver<BodyEnd>>,
    ) -> Result<F::Output, ForwardError> {
        let mut response = std::pin::pin!(response);
        if let Some(signal) = sent {
            tokio::select! {
                // The body's end first: a stalled body also fails the answer (its stream reset).
                biased;
                end = signal => match end {
                    Ok(BodyEnd::Stalled(after)) => return Err(ForwardError::BodyTimeout(after)),
                    Ok(BodyEnd::Broken(err)) => return Err(ForwardError::RequestBody(err)),
                    // Sent whole, or the body was dropped unsent (a failed request): either way
                    // the upstream's answer is what is left to wait for.
                    Ok(BodyEnd::Whole) | Err(_) => {}
                },
                output = &mut response => return Ok(output),
            }
        }
        self.timed(response).await
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
        link: Arc<UpstreamSlot>,
        grpc: bool,
    ) -> Result<Forwarded, ForwardError> {
        // Asked before the hop-by-hop fields go: `upgrade` is one of them.
        let upgrade =
            upgrade_asked(&request).map(|protocol| (protocol, hyper::upgrade::on(&mut request)));
        strip_hop_by_hop(request.headers_mut());
        let h2 = request.version() == Version::HTTP_2;
        let mut client = None;
        if let Some((protocol, on)) = upgrade {
            // This hop's upgrade, asked again of the next: the same protocol, and nothing else
            // the client's `connection` named.
            let headers = request.headers_mut();
            headers.insert(header::UPGRADE, protocol);
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            client = Some(on);
        }
        let forwarded = if h2 {
            self.forward_h2(request)
                .await
                .map(|r| (r.map(Relay::H2), None))
        } else {
            self.forward_h1(request, link, client.is_some()).await
        };
        let (mut response, upstream) = match forwarded {
            Ok(forwarded) => forwarded,
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
        let switched = response.headers().get(header::UPGRADE).cloned();
        strip_hop_by_hop(response.headers_mut());
        let (Some(upstream), Some(client)) = (upstream, client) else {
            return Ok(Forwarded::Answer(response));
        };
        // The upstream switched: its `101` goes back with the protocol it named, and the two
        // connections become one tunnel.
        let headers = response.headers_mut();
        if let Some(protocol) = switched {
            headers.insert(header::UPGRADE, protocol);
        }
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        Ok(Forwarded::Tunnel(response, Tunnel { client, upstream }))
    }

    async fn forward_h2(
        &self,
        request: Request<Incoming>,
    ) -> Result<Response<Incoming>, ForwardError> {
        let (parts, body) = request.into_parts();
        let (body, sent) = Sent::new(body, self.body_timeout);
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
        Ok(self.within(self.h2.request(request), sent).await??)
    }

    async fn forward_h1(
        &self,
        request: Request<Incoming>,
        link: Arc<UpstreamSlot>,
        upgrade: bool,
    ) -> Result<(Response<Relay>, Option<Conn>), ForwardError> {
        if request.method() == Method::CONNECT {
            return Err(ForwardError::Tunnel);
        }
        let (parts, mut body) = request.into_parts();
        let outgoing = if body.is_end_stream() {
            Outgoing::Empty {
                length_field: parts.headers.contains_key(header::CONTENT_LENGTH),
            }
        } else if let Some(length) = body.size_hint().exact() {
            Outgoing::Length(length)
        } else {
            Outgoing::Chunked
        };
        // A connection kept from an earlier request may have been closed by the upstream since:
        // a request whose head could not be written on it at all goes out once more on a new
        // connection (nothing of its body has been read yet). The upstream may also close it
        // just as the request arrives (its keep-alive timeout running out at that moment): then
        // the request was sent and no answer came, and only a request that is safe to send
        // twice, bodiless with an idempotent method (RFC 9110 §9.2.2), goes out again on a new
        // connection; any other gets the 502.
        let safe_twice = parts.method.is_idempotent() && matches!(outgoing, Outgoing::Empty { .. });
        let (mut conn, mut reused) = match link.take() {
            Some(conn) => (conn, true),
            None => (self.connect_h1().await?, false),
        };
        // Origin form (`/path?query`): a request in absolute form keeps only its path and query.
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        h1::encode_head(
            &mut conn.head,
            &parts.method,
            target,
            &parts.headers,
            &self.host,
            outgoing,
        );
        let head = loop {
            match self
                .exchange(&mut conn, &mut body, outgoing, &parts.method, upgrade)
                .await
            {
                Ok(head) => break head,
                Err(Failed::Unsent(err)) if reused => tracing::debug!(
                    "a kept upstream connection was closed before a request went out ({err}); sending it on a new one"
                ),
                Err(Failed::Unanswered(err)) if reused && safe_twice => tracing::debug!(
                    "the upstream closed a kept connection as a request arrived ({err}); sending it again on a new one"
                ),
                Err(Failed::Unsent(err) | Failed::Unanswered(err) | Failed::Other(err)) => {
                    return Err(err);
                }
            }
            let head = std::mem::take(&mut conn.head);
            conn = self.connect_h1().await?;
            conn.head = head;
            reused = false;
        };
        let Head {
            response,
            framing,
            keep,
            switched,
        } = head;
        if switched {
            return Ok((response.map(|()| Relay::Empty), Some(conn)));
        }
        let body = match framing {
            Some(framing) => Relay::H1(Reading::new(conn, framing, keep, link)),
            None => {
                if keep {
                    link.keep(conn);
                }
                Relay::Empty
            }
        };
        Ok((response.map(|()| body), None))
    }

    /// One request and its answer's head over `conn`, whose head buffer holds the request's
    /// head: the head written, the body sent while the answer is watched for (an upstream may
    /// answer before it has read the whole body, and then the answer is taken and the connection
    /// not reused), then the answer's head read within the upstream timeout.
    async fn exchange(
        &self,
        conn: &mut Conn,
        body: &mut Incoming,
        outgoing: Outgoing,
        method: &Method,
        upgrade: bool,
    ) -> Result<Head, Failed> {
        let (io, read, scratch) = conn.parts();
        if let Err((err, written)) = h1::write_all(io, scratch).await {
            let err = ForwardError::Http1(err.into());
            return Err(if written {
                Failed::Unanswered(err)
            } else {
                Failed::Unsent(err)
            });
        }
        let mut reading = std::pin::pin!(h1::read_head(io, read, method, upgrade));
        if !matches!(outgoing, Outgoing::Empty { .. }) {
            // The head buffer frames the body's chunks from here on: only a bodiless request,
            // whose head is still in it, is ever sent again after this point.
            let sending = std::pin::pin!(send_body(io, scratch, body, outgoing, self.body_timeout));
            let early = tokio::select! {
                biased;
                head = &mut reading => Some(head),
                sent = sending => match sent {
                    Ok(()) => None,
                    // The client's fault, not the upstream's: no answer is waited for.
                    Err(err @ (ForwardError::RequestBody(_) | ForwardError::BodyTimeout(_))) => {
                        return Err(Failed::Other(err));
                    }
                    // The upstream stopped reading: it may have answered already, and if it
                    // did, that answer is what the client gets.
                    Err(err) => {
                        return match self.timed(&mut reading).await {
                            Ok(Ok(mut head)) => {
                                head.keep = false;
                                Ok(head)
                            }
                            _ => Err(Failed::Other(err)),
                        };
                    }
                },
            };
            if let Some(head) = early {
                let mut head = head.map_err(|err| Failed::Other(err.into()))?;
                head.keep = false;
                return Ok(head);
            }
        }
        match self.timed(reading).await {
            Ok(Ok(head)) => Ok(head),
            Ok(Err(H1Error::Unanswered)) => Err(Failed::Unanswered(H1Error::Unanswered.into())),
            Ok(Err(err)) => Err(Failed::Other(err.into())),
            Err(err) => Err(Failed::Other(err)),
        }
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

    /// Opens an HTTP/1.1 connection to the upstream.
    async fn connect_h1(&self) -> Result<Conn, ForwardError> {
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
        Ok(Conn::new(stream))
    }
}

/// How an exchange failed, which says whether its request may go again on a new connection.
enum Failed {
    /// Nothing of the request was written.
    Unsent(ForwardError),
    /// The request (or part of it) was written, and the connection ended before any answer.
    Unanswered(ForwardError),
    Other(ForwardError),
}

/// Sends a request's body after its head: as it is, when its length was given, or in chunks,
/// with its trailers. `scratch` holds the chunks' framing. A body that makes no progress for
/// `body_timeout` fails with [`ForwardError::BodyTimeout`].
async fn send_body(
    io: &TcpStream,
    scratch: &mut Vec<u8>,
    body: &mut Incoming,
    outgoing: Outgoing,
    body_timeout: Option<Duration>,
) -> Result<(), ForwardError> {
    let chunked = outgoing == Outgoing::Chunked;
    let mut trailers = None;
    let written = |err: std::io::Error| ForwardError::Http1(err.into());
    let mut progress = body_timeout.map(Progress::new);
    loop {
        let next = std::future::poll_fn(|cx| Progress::poll_frame(&mut progress, body, cx));
        let Some(frame) = next.await.map_err(ForwardError::BodyTimeout)? else {
            break;
        };
        let frame = frame.map_err(ForwardError::RequestBody)?;
        match frame.into_data() {
            Ok(data) if data.is_empty() => {}
            Ok(data) if chunked => h1::write_chunk(io, scratch, &data).await.map_err(written)?,
            Ok(data) => h1::write_whole(io, &data).await.map_err(written)?,
            Err(frame) => {
                if let Ok(mut fields) = frame.into_trailers() {
                    filter_trailers(&mut fields);
                    trailers = Some(fields);
                }
            }
        }
    }
    if chunked {
        h1::write_last_chunk(io, scratch, trailers.as_ref())
            .await
            .map_err(written)?;
    }
    Ok(())
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
        assert!(Upstream::new("http://127.0.0.1:8080", None, None).is_ok());
        assert!(Upstream::new("https://127.0.0.1:8080", None, None).is_err());
        assert!(Upstream::new("http://127.0.0.1:8080/api", None, None).is_err());
        assert!(Upstream::new("127.0.0.1:8080", None, None).is_err());
    }
}
