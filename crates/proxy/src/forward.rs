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

use spillway_core::config::ProxySettings;

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

/// What an HTTP/1.1 request's `upgrade` comes to at this hop ([`upgrade_asked`]).
pub(crate) enum Ask {
    /// No upgrade asked in full: a plain request.
    None,
    /// An upgrade this proxy does not forward (a protocol `proxy.upgrades` does not allow,
    /// `h2c` always, or a WebSocket handshake without its key): removed with its `connection`
    /// options, and the request forwarded as a plain one.
    Removed,
    /// An upgrade to forward.
    Allowed(Upgrade),
}

/// An upgrade the proxy forwards, and what the upstream's `101` must say for it to be one.
pub(crate) struct Upgrade {
    /// The one protocol asked of the upstream: the first allowed one the client named.
    protocol: HeaderValue,
    /// For a WebSocket: the client's `sec-websocket-key`, forwarded as it came, and the
    /// `sec-websocket-accept` the upstream's `101` must carry.
    websocket: Option<(HeaderValue, [u8; ACCEPT_LEN])>,
}

/// The length of a `sec-websocket-accept`: 20 bytes of SHA-1 in base64.
const ACCEPT_LEN: usize = 28;

/// RFC 6455's GUID, appended to the client's key before hashing.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The `sec-websocket-accept` RFC 6455 derives from a client's `sec-websocket-key`:
/// base64(SHA-1(key + GUID)).
fn websocket_accept(key: &[u8]) -> [u8; ACCEPT_LEN] {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut sha1 = sha1::Sha1::new();
    sha1.update(key);
    sha1.update(WEBSOCKET_GUID);
    let digest = sha1.finalize();
    let mut accept = [0; ACCEPT_LEN];
    // 20 bytes always encode to 28 characters.
    let _ = base64::engine::general_purpose::STANDARD.encode_slice(digest, &mut accept);
    accept
}

/// Whether an HTTP/1.1 request asks to upgrade (RFC 9110 §7.8), and to what this hop forwards:
/// asked in full is `upgrade` named in `connection`, an `upgrade` field, and no body (a
/// handshake has none; a request with a body is forwarded as an ordinary one, its `upgrade`
/// dropped). Of the protocols it names the first that `settings` allows is the one asked of the
/// upstream; a WebSocket needs exactly one `sec-websocket-key`, from which its `101` is checked.
/// A request without an `upgrade` field costs one lookup.
pub(crate) fn upgrade_asked(request: &Request<Incoming>, settings: &ProxySettings) -> Ask {
    let headers = request.headers();
    if !headers.contains_key(header::UPGRADE) {
        return Ask::None;
    }
    if request.version() != Version::HTTP_11
        || !request.body().is_end_stream()
        || !tokens(headers, &header::CONNECTION).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
    {
        return Ask::None;
    }
    let Some(protocol) = tokens(headers, &header::UPGRADE).find(|t| settings.allows_upgrade(t))
    else {
        return Ask::Removed;
    };
    let Ok(protocol_value) = HeaderValue::from_bytes(protocol) else {
        return Ask::Removed;
    };
    let websocket = if protocol_name(protocol).eq_ignore_ascii_case(b"websocket") {
        let mut keys = headers.get_all(header::SEC_WEBSOCKET_KEY).iter();
        match (keys.next(), keys.next()) {
            (Some(key), None) if !key.as_bytes().trim_ascii().is_empty() => {
                Some((key.clone(), websocket_accept(key.as_bytes().trim_ascii())))
            }
            // No key, or two: no handshake the upstream's answer could be checked against.
            _ => return Ask::Removed,
        }
    } else {
        None
    };
    Ask::Allowed(Upgrade {
        protocol: protocol_value,
        websocket,
    })
}

/// The comma-separated elements of every `name` field, trimmed, empty ones skipped.
fn tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
}

/// The name of an `upgrade` token, without its version (`websocket` of `websocket/13`).
fn protocol_name(token: &[u8]) -> &[u8] {
    token
        .split(|&b| b == b'/')
        .next()
        .unwrap_or_default()
        .trim_ascii()
}

/// Why an upstream's `101` does not open a tunnel: it did not switch to what was asked the way
/// that protocol's handshake says it must. Answered 502, both connections closed.
fn switch_fault(response: &HeaderMap, asked: &Upgrade) -> Option<&'static str> {
    let mut protocols = response.get_all(header::UPGRADE).iter();
    let (Some(protocol), None) = (protocols.next(), protocols.next()) else {
        return Some("the upstream's 101 named no single protocol in its upgrade field");
    };
    if !protocol_name(protocol.as_bytes())
        .eq_ignore_ascii_case(protocol_name(asked.protocol.as_bytes()))
    {
        return Some("the upstream's 101 switched to a protocol the request did not ask for");
    }
    if let Some((_, expected)) = &asked.websocket {
        let mut accepts = response.get_all(header::SEC_WEBSOCKET_ACCEPT).iter();
        match (accepts.next(), accepts.next()) {
            (Some(accept), None) if accept.as_bytes().trim_ascii() == expected => {}
            (None, _) => {
                return Some(
                    "the upstream's 101 carried no sec-websocket-accept: not a WebSocket handshake",
                );
            }
            _ => {
                return Some(
                    "the upstream's 101 carried a sec-websocket-accept that does not answer the client's key: not a WebSocket handshake",
                );
            }
        }
    }
    None
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

/// Headers that describe one hop (RFC 9110 §7.6.1), plus `te`, handled apart. `http2-settings`
/// belongs to an `h2c` upgrade (RFC 7540 §3.2.1), which is never forwarded, so it always goes.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("http2-settings"),
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of these, or only `connection: keep-alive`: one pass over the
    // names, comparing without hashing, finds which are there.
    let mut present = [false; 7];
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
        upgrade: Option<Upgrade>,
    ) -> Result<Forwarded, ForwardError> {
        let upgrade = upgrade.map(|asked| (asked, hyper::upgrade::on(&mut request)));
        // Every upgrade field goes here, and with it whatever `connection` named; an upgrade to
        // forward is asked again below.
        strip_hop_by_hop(request.headers_mut());
        let h2 = request.version() == Version::HTTP_2;
        let mut client = None;
        if let Some((asked, on)) = upgrade {
            // This hop's upgrade, asked again of the next: the one protocol chosen, its key, and
            // nothing else the client's `connection` named.
            let headers = request.headers_mut();
            headers.insert(header::UPGRADE, asked.protocol.clone());
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            if let Some((key, _)) = &asked.websocket {
                headers.insert(header::SEC_WEBSOCKET_KEY, key.clone());
            }
            client = Some((asked, on));
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
        let (Some(upstream), Some((asked, client))) = (upstream, client) else {
            strip_hop_by_hop(response.headers_mut());
            return Ok(Forwarded::Answer(response));
        };
        // The upstream switched. Only a handshake that answers what was asked opens a tunnel:
        // a `101` from an upstream that switches to anything (and then goes on reading HTTP/1.1
        // requests, undecided) is refused, and the upstream connection dropped here closes.
        if let Some(fault) = switch_fault(response.headers(), &asked) {
            drop(upstream);
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
    fn the_websocket_accept_is_rfc_6455s_example() {
        assert_eq!(
            &websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn http2_settings_always_goes() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "upgrade".parse().unwrap());
        headers.insert("upgrade", "h2c".parse().unwrap());
        headers.insert(
            "http2-settings",
            "AAMAAABkAARAAAAAAAIAAAAA".parse().unwrap(),
        );
        strip_hop_by_hop(&mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }

    #[test]
    fn upstream_urls_are_checked() {
        assert!(Upstream::new("http://127.0.0.1:8080", None, None).is_ok());
        assert!(Upstream::new("https://127.0.0.1:8080", None, None).is_err());
        assert!(Upstream::new("http://127.0.0.1:8080/api", None, None).is_err());
        assert!(Upstream::new("127.0.0.1:8080", None, None).is_err());
    }
}
