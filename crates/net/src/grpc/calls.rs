//! One connection's calls: each handed to tonic's routes with the connection's peer in its
//! extensions (as tonic's own server does), counted while its stream is open (for the idle
//! close), and held to the listener's deadlines.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};
use tonic::Status;
use tonic::service::Routes;
use tower_service::Service;

use super::{CallKind, GrpcLimits};

/// What a connection knows of its calls: how many streams are open and since when none is.
pub(super) struct Connection {
    born: Instant,
    open: AtomicUsize,
    /// Milliseconds after `born` when the last stream closed (or the connection opened).
    quiet_since_ms: AtomicU64,
}

impl Connection {
    pub(super) fn new() -> Self {
        Connection {
            born: Instant::now(),
            open: AtomicUsize::new(0),
            quiet_since_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// How long the connection has had no open stream, or `None` while one is open.
    pub(super) fn idle_for(&self) -> Option<Duration> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.quiet_since_ms.load(Ordering::Acquire);
        Some(Duration::from_millis(self.now_ms().saturating_sub(since)))
    }
}

/// One open stream, counted out when its answer's body is dropped (the stream is done).
struct Open(Arc<Connection>);

impl Open {
    fn new(connection: &Arc<Connection>) -> Self {
        connection.open.fetch_add(1, Ordering::AcqRel);
        Open(connection.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let connection = &self.0;
        connection
            .quiet_since_ms
            .store(connection.now_ms(), Ordering::Release);
        connection.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection's service for hyper: `I` is the peer as the services read it
/// (`TcpConnectInfo` in plaintext, `PeerInfo` over TLS).
pub(super) struct Calls<I> {
    routes: Routes,
    info: I,
    connection: Arc<Connection>,
    kind: CallKind,
    limits: GrpcLimits,
}

impl<I> Calls<I> {
    pub(super) fn new(
        routes: Routes,
        info: I,
        connection: Arc<Connection>,
        kind: CallKind,
        limits: GrpcLimits,
    ) -> Self {
        Calls {
            routes,
            info,
            connection,
            kind,
            limits,
        }
    }
}

type CallFuture = Pin<Box<dyn Future<Output = Result<Response<Tracked>, Infallible>> + Send>>;

impl<I> hyper::service::Service<Request<Incoming>> for Calls<I>
where
    I: Clone + Send + Sync + 'static,
{
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = CallFuture;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.info.clone());
        let open = Open::new(&self.connection);
        let mut routes = self.routes.clone();
        match self.kind {
            CallKind::Unary => {
                let limit = self.limits.request_timeout;
                Box::pin(async move {
                    let call = async {
                        std::future::poll_fn(|cx| {
                            Service::<Request<Incoming>>::poll_ready(&mut routes, cx)
                        })
                        .await?;
                        routes.call(request).await
                    };
                    let response = match tokio::time::timeout(limit, call).await {
                        Ok(Ok(response)) => response,
                        Ok(Err(never)) => match never {},
                        Err(_) => Status::deadline_exceeded(format!(
                            "the call did not arrive and get its answer within {limit:?} (--grpc-request-timeout)"
                        ))
                        .into_http(),
                    };
                    Ok(response.map(|body| Tracked { body, _open: open }))
                })
            }
            CallKind::Streaming => {
                let request = request.map(|body| Paced::new(body, self.limits.idle_timeout));
                Box::pin(async move {
                    std::future::poll_fn(|cx| {
                        Service::<Request<Paced>>::poll_ready(&mut routes, cx)
                    })
                    .await?;
                    let response = routes.call(request).await?;
                    Ok(response.map(|body| Tracked { body, _open: open }))
                })
            }
        }
    }
}

/// An answer's body, which keeps its stream counted open until hyper drops it.
pub(super) struct Tracked {
    body: tonic::body::Body,
    _open: Open,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A streaming call's request body, held to the message deadline: the first message must begin
/// within it, and a message, once begun, must arrive whole within it (the idle timeout: long,
/// since a controller's 16 MiB sums may cross a slow WAN). Between messages a stream may be
/// silent as long as it likes (a report interval, say): the connection's keepalive finds a peer
/// that vanished.
struct Paced {
    inner: Incoming,
    framing: Framing,
    message_timeout: Duration,
    /// Armed while a message is awaited: the first, or the rest of a begun one.
    deadline: Option<Pin<Box<Sleep>>>,
    expired: bool,
}

impl Paced {
    fn new(inner: Incoming, message_timeout: Duration) -> Self {
        Paced {
            inner,
            framing: Framing::default(),
            message_timeout,
            deadline: Some(Box::pin(tokio::time::sleep(message_timeout))),
            expired: false,
        }
    }

    fn received(&mut self, data: &Bytes) {
        let began = self.framing.at_boundary();
        self.framing.feed(data.chunk());
        if self.framing.at_boundary() {
            if self.framing.messages > 0 {
                self.deadline = None;
            }
        } else if began {
            let until = Instant::now() + self.message_timeout;
            match &mut self.deadline {
                Some(deadline) if deadline.deadline() <= until => {}
                Some(deadline) => deadline.as_mut().reset(until),
                None => self.deadline = Some(Box::pin(tokio::time::sleep_until(until))),
            }
        }
    }
}

impl Body for Paced {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.expired {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.received(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                Poll::Ready(Some(Err(Status::from_error(Box::new(err)))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let Some(deadline) = &mut self.deadline else {
                    return Poll::Pending;
                };
                ready!(deadline.as_mut().poll(cx));
                let first = self.framing.messages == 0 && self.framing.at_boundary();
                self.expired = true;
                self.deadline = None;
                Poll::Ready(Some(Err(Status::deadline_exceeded(if first {
                    "no request message arrived within --grpc-idle-timeout of the call's start"
                } else {
                    "a request message did not arrive whole within --grpc-idle-timeout of its start"
                }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.expired || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where a request body is in gRPC's framing: each message is a flag byte, a four-byte
/// big-endian length and that many bytes.
#[derive(Debug, Default)]
struct Framing {
    /// Prefix bytes read of the message being begun (0 to 4; 5 completes it).
    prefix: u8,
    length: u32,
    /// Message bytes still to come (0: at a boundary or in a prefix).
    left: u32,
    /// Whole messages seen.
    messages: u64,
}

impl Framing {
    fn at_boundary(&self) -> bool {
        self.prefix == 0 && self.left == 0
    }

    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.left > 0 {
                let n = data.len().min(self.left as usize);
                self.left -= n as u32;
                data = &data[n..];
                if self.left == 0 {
                    self.messages += 1;
                }
                continue;
            }
            if self.prefix > 0 {
                self.length = (self.length << 8) | u32::from(data[0]);
            }
            self.prefix += 1;
            data = &data[1..];
            if self.prefix == 5 {
                self.prefix = 0;
                self.left = self.length;
                self.length = 0;
                if self.left == 0 {
                    self.messages += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Framing;

    #[test]
    fn framing_finds_message_boundaries_across_chunks() {
        let mut framing = Framing::default();
        // An empty message, then one of 3 bytes split across chunks.
        framing.feed(&[0, 0, 0, 0, 0]);
        assert!(framing.at_boundary());
        assert_eq!(framing.messages, 1);
        framing.feed(&[0, 0, 0]);
        assert!(!framing.at_boundary());
        framing.feed(&[0, 3, 7]);
        assert!(!framing.at_boundary());
        framing.feed(&[8, 9, 0, 0]);
        assert_eq!(framing.messages, 2);
        assert!(!framing.at_boundary(), "a new prefix has begun");
        framing.feed(&[0, 0, 1, 5]);
        assert!(framing.at_boundary());
        assert_eq!(framing.messages, 3);
    }

    #[test]
    fn a_large_length_is_read_big_endian() {
        let mut framing = Framing::default();
        framing.feed(&[1, 0x00, 0x01, 0x00, 0x00]);
        assert_eq!(framing.left, 65_536);
        framing.feed(&vec![0; 65_535]);
        assert!(!framing.at_boundary());
        framing.feed(&[0]);
        assert!(framing.at_boundary());
    }
}
