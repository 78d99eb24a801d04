//! What one client can hold of the proxy, and for how long: HTTP/2 connections with
//! no open stream close after the idle timeout, a request body that makes no progress is cut
//! with `408`, connections beyond `max_connections` are refused at once, and a request head past
//! the cap is answered `431`. Black-box, over real sockets, with raw bytes where the finding is
//! about bytes.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::support::{Upstream, admin, config, get, proxy_with};
use bytes::Bytes;
use http::StatusCode;
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A bucket these tests never fill.
const UNHIT: &str = "{ name: b, limit: 100/h, algorithm: token-bucket }";
/// The client connection preface of HTTP/2 and an empty SETTINGS frame: all a client must send
/// before its first stream.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Reads from `client` until the proxy closes the connection (end of stream or reset); fails the
/// test when it is still open after `within`. Returns how long that took and what was read.
async fn closed_within(client: &mut TcpStream, within: Duration) -> (Duration, Vec<u8>) {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    let mut read = Vec::new();
    loop {
        let n = tokio::time::timeout_at((started + within).into(), client.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("the connection was still open after {within:?}"));
        match n {
            Ok(0) | Err(_) => return (started.elapsed(), read),
            Ok(n) => read.extend_from_slice(&buf[..n]),
        }
    }
}

/// What the proxy sends on `client` until it has sent a whole head and `content-length` bytes
/// after it, or `within` passes; as text.
async fn answer_within(client: &mut TcpStream, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if data.len() >= end + 4 + length {
                return String::from_utf8_lossy(&data).into_owned();
            }
        }
        match tokio::time::timeout_at(deadline.into(), client.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) | Err(_) => return String::from_utf8_lossy(&data).into_owned(),
            Ok(Ok(n)) => data.extend_from_slice(&buf[..n]),
        }
    }
}

/// A request body that sends `sent` and then nothing, ever, without ending.
struct Stalled(Option<Bytes>);

impl hyper::body::Body for Stalled {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.0.take() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }
}

/// An h2c connection to `addr` (prior knowledge), driven on a task of its own.
async fn h2_client<B>(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
)
where
    B: hyper::body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    (sender, tokio::spawn(connection))
}

/// Waits (5 s at most) for `connection` to end; returns how long that took.
async fn ended_within(
    connection: &mut tokio::task::JoinHandle<Result<(), hyper::Error>>,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    tokio::time::timeout(within, connection)
        .await
        .unwrap_or_else(|_| panic!("the proxy kept the connection open past {within:?}"))
        .unwrap()
        .ok();
    started.elapsed()
}

/// An HTTP/2 connection that sent only its preface is closed after the idle timeout (it has no
/// open stream), not held forever; the header timeout, longer here, does not apply to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preface_only_http2_connection_is_closed_after_the_idle_timeout() {
    let upstream = Upstream::start().await;
    let running = proxy_with(&config(&[UNHIT]), &upstream.url(), |options| {
        options.header_timeout = Duration::from_secs(30);
        options.idle_timeout = Duration::from_millis(600);
    })
    .await;
    let mut client = TcpStream::connect(running.proxy.addr()).await.unwrap();
    client.write_all(H2_PREFACE).await.unwrap();
    let (idle, read) = closed_within(&mut client, Duration::from_secs(5)).await;
    // The server's preface (a SETTINGS frame, type 4) came first: it was an HTTP/2 connection.
    assert!(read.len() >= 9 && read[3] == 4, "{read:?}");
    assert!(idle >= Duration::from_millis(550), "closed after {idle:?}");
    running.proxy.shutdown().await;
}

/// An HTTP/2 connection stays open while a stream is open, however long (a slow answer), and
/// between streams closer together than the idle timeout; with no open stream for the idle
/// timeout it is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_with_no_open_stream_for_the_idle_timeout_is_closed() {
    let mut upstream = Upstream::start().await;
    let running = proxy_with(&config(&[UNHIT]), &upstream.url(), |options| {
        options.header_timeout = Duration::from_millis(200);
        options.idle_timeout = Duration::from_millis(700);
    })
    .await;
    let addr = running.proxy.addr();
    let (mut sender, mut connection) = h2_client(addr).await;
    let request = |path: &str| {
        http::Request::get(format!("http://{addr}{path}"))
            .version(http::Version::HTTP_2)
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap()
    };
    // Gaps shorter than the idle timeout (longer than the header timeout) keep it.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let response = sender.send_request(request("/")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // A stream open for three idle timeouts keeps it too.
    let slow = tokio::spawn(sender.send_request(request("/slow")));
    upstream.arrived.recv().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert!(!connection.is_finished(), "closed with a stream open");
    upstream.release.notify_one();
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
    // Then, with no stream open, it is closed after the idle timeout.
    let idle = ended_within(&mut connection, Duration::from_secs(5)).await;
    assert!(idle >= Duration::from_millis(600), "closed after {idle:?}");
    running.proxy.shutdown().await;
}

/// An upstream that serves at most `max` connections at a time (the rest wait in its backlog),
/// reading each request whole and answering `200 ok`; returns its address and how many
/// connections it has open.
async fn limited_upstream(max: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let permits = Arc::new(tokio::sync::Semaphore::new(max));
    let counted = open.clone();
    tokio::spawn(async move {
        loop {
            let permit = permits.clone().acquire_owned().await.unwrap();
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let open = counted.clone();
            open.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                while read_request(&mut stream).await {
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(answer).await.is_err() {
                        break;
                    }
                }
                open.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            });
        }
    });
    (addr, open)
}

/// Reads one request head and its `content-length` body; `false` at the end of the stream.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if data.len() >= end + 4 + length {
                return true;
            }
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
}

/// A request head announcing a body, a few bytes of it, then nothing: answered `408` with a
/// problem document after the body timeout, and its upstream connection closed, not kept. With
/// 25 such requests holding every connection an upstream serves, a legitimate request waits
/// only until they are cut, then gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_answered_408_and_frees_its_upstream_connection() {
    const STALLED: usize = 25;
    let (upstream, open) = limited_upstream(STALLED).await;
    let running = proxy_with(
        &config(&[UNHIT]),
        &format!("http://{upstream}"),
        |options| {
            options.body_timeout = Some(Duration::from_millis(800));
            options.upstream_timeout = Some(Duration::from_secs(4));
        },
    )
    .await;
    let addr = running.proxy.addr();
    let started = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"POST /upload HTTP/1.1\r\nhost: app\r\ncontent-length: 1000000\r\n\r\nabc")
            .await
            .unwrap();
        stalled.push(client);
    }
    // Every connection the upstream serves is held by a stalled upload.
    for _ in 0..100 {
        if open.load(Ordering::SeqCst) == STALLED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open.load(Ordering::SeqCst), STALLED);
    let legitimate = tokio::spawn(get(addr, "/", &[]));
    for client in &mut stalled {
        let answer = answer_within(client, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
        assert!(
            answer.contains("content-type: application/problem+json"),
            "{answer}"
        );
        assert!(
            answer.contains("urn:spillway:problem:body-timeout"),
            "{answer}"
        );
        let (_, rest) = closed_within(client, Duration::from_secs(2)).await;
        assert!(rest.is_empty(), "{rest:?}");
    }
    assert!(started.elapsed() >= Duration::from_millis(800));
    let answer = tokio::time::timeout(Duration::from_secs(3), legitimate)
        .await
        .expect("the legitimate request was still unanswered 3 s after the stalled ones were cut")
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    // The stalled exchanges' upstream connections were closed, not kept for reuse.
    for _ in 0..100 {
        if open.load(Ordering::SeqCst) <= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(open.load(Ordering::SeqCst) <= 1, "{open:?}");
    // Counted as the clients' fault, not the upstream's.
    let refused = "spillway_requests_refused_total{reason=\"body_timeout\"}";
    assert_eq!(metric(&running, refused).await, STALLED as u64);
    assert_eq!(metric(&running, "spillway_upstream_errors_total").await, 0);
    running.proxy.shutdown().await;
}

/// A body that keeps making progress, a chunk every 300 ms for 1.2 s, is not cut by a 500 ms
/// body timeout: the timeout is about no progress, not about a slow upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_that_keeps_making_progress_is_not_cut() {
    let (upstream, _) = limited_upstream(4).await;
    let running = proxy_with(
        &config(&[UNHIT]),
        &format!("http://{upstream}"),
        |options| {
            options.body_timeout = Some(Duration::from_millis(500));
        },
    )
    .await;
    let mut client = TcpStream::connect(running.proxy.addr()).await.unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nhost: app\r\ncontent-length: 8\r\n\r\n")
        .await
        .unwrap();
    for part in [b"ab", b"cd", b"ef", b"gh"] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.write_all(part).await.unwrap();
    }
    let answer = answer_within(&mut client, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    running.proxy.shutdown().await;
}

/// An HTTP/2 request whose body stalls is answered `408` too (gRPC: `DEADLINE_EXCEEDED` in a
/// trailers-only answer), and its connection stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_http2_request_body_is_answered_408() {
    let upstream = Upstream::start().await;
    let running = proxy_with(&config(&[UNHIT]), &upstream.url(), |options| {
        options.body_timeout = Some(Duration::from_millis(500));
    })
    .await;
    let addr = running.proxy.addr();
    let (mut sender, _connection) = h2_client::<Stalled>(addr).await;
    for grpc in [false, true] {
        let mut request = http::Request::post(format!("http://{addr}/upload"))
            .version(http::Version::HTTP_2)
            .body(Stalled(Some(Bytes::from_static(b"\0\0\0\0\x10abc"))))
            .unwrap();
        if grpc {
            request
                .headers_mut()
                .insert("content-type", "application/grpc".parse().unwrap());
        }
        let started = Instant::now();
        let response = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
            .await
            .expect("no answer to a stalled HTTP/2 body within 5 s")
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(450));
        if grpc {
            // Trailers-only, as gRPC clients read a status: HTTP 200.
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()["grpc-status"], "4");
        } else {
            assert_eq!(response.status(), StatusCode::REQUEST_TIMEOUT);
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json"
            );
        }
    }
    running.proxy.shutdown().await;
}

/// The metric `name` (a plain counter or gauge) on the proxy's admin listener.
async fn metric(running: &crate::support::Running, name: &str) -> u64 {
    let metrics = admin(running, "/metrics").await.body;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
        .parse()
        .unwrap()
}

/// Beyond `max_connections` a new connection is accepted and closed at once, unanswered, and
/// counted; once one closes, a new one is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once_and_counted() {
    let upstream = Upstream::start().await;
    let running = proxy_with(&config(&[UNHIT]), &upstream.url(), |options| {
        options.max_connections = Some(2);
    })
    .await;
    let addr = running.proxy.addr();
    const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: app\r\n\r\n";
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(GET).await.unwrap();
        let answer = answer_within(&mut client, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        held.push(client);
    }
    assert_eq!(metric(&running, "spillway_connections").await, 2);
    let mut refused = TcpStream::connect(addr).await.unwrap();
    let _ = refused.write_all(GET).await;
    let (after, read) = closed_within(&mut refused, Duration::from_secs(2)).await;
    assert!(read.is_empty(), "{}", String::from_utf8_lossy(&read));
    assert!(after < Duration::from_secs(1), "closed after {after:?}");
    assert_eq!(
        metric(&running, "spillway_connections_refused_total").await,
        1
    );
    drop(held.pop());
    for _ in 0..100 {
        if metric(&running, "spillway_connections").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(addr, "/", &[]).await.status, StatusCode::OK);
    running.proxy.shutdown().await;
}

/// An h2c (and HTTP/1.1) upstream that takes header lists of up to 1 MiB and answers `200 ok`;
/// returns its address and how many requests it has answered.
async fn roomy_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = counted.clone();
            let service = hyper::service::service_fn(move |_request| {
                seen.fetch_add(1, Ordering::SeqCst);
                async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        http_body_util::Full::new(Bytes::from_static(b"ok")),
                    ))
                }
            });
            tokio::spawn(async move {
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder.http2().max_header_list_size(1 << 20);
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A request head over the cap (64 KiB by default) gets `431` with a problem document, on
/// HTTP/1.1 and its connection closed; one under it is forwarded. On HTTP/2 the header list is
/// capped alike (its `431` is the HTTP/2 library's, without a body; hyper's default was 16 KiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_over_64_kib_is_answered_431() {
    let (upstream, seen) = roomy_upstream().await;
    let running = proxy_with(&config(&[UNHIT]), &format!("http://{upstream}"), |_| {}).await;
    let addr = running.proxy.addr();
    let head = |size: usize| {
        format!(
            "GET / HTTP/1.1\r\nhost: app\r\nx-big: {}\r\n\r\n",
            "a".repeat(size)
        )
    };
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(head(60 * 1024).as_bytes()).await.unwrap();
    let answer = answer_within(&mut client, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:.40?}");

    let mut client = TcpStream::connect(addr).await.unwrap();
    // The proxy may close before it has read everything: a failed write is fine.
    let _ = client.write_all(head(70 * 1024).as_bytes()).await;
    let answer = answer_within(&mut client, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert!(
        answer.contains("content-type: application/problem+json"),
        "{answer}"
    );
    assert!(
        answer.contains("urn:spillway:problem:head-too-large"),
        "{answer}"
    );
    assert_eq!(seen.load(Ordering::SeqCst), 1);

    let (mut sender, _connection) = h2_client::<http_body_util::Empty<Bytes>>(addr).await;
    for (size, status) in [
        (30 * 1024, StatusCode::OK),
        (70 * 1024, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE),
    ] {
        let request = http::Request::get(format!("http://{addr}/"))
            .version(http::Version::HTTP_2)
            .header("x-big", "b".repeat(size))
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), status, "{size} bytes of header");
    }
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    running.proxy.shutdown().await;
}

/// The body timeout cuts only requests that no answer has begun for: an upstream that answers
/// before reading the body (as a gRPC server may open a bidirectional stream) gets its answer
/// relayed, on HTTP/1.1 and HTTP/2, however long the client's body then pauses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_begun_before_the_body_stalls_is_relayed_not_cut() {
    let (upstream, _) = roomy_upstream().await;
    let running = proxy_with(
        &config(&[UNHIT]),
        &format!("http://{upstream}"),
        |options| {
            options.body_timeout = Some(Duration::from_millis(300));
        },
    )
    .await;
    let addr = running.proxy.addr();
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"POST /upload HTTP/1.1\r\nhost: app\r\ncontent-length: 1000\r\n\r\nabc")
        .await
        .unwrap();
    let answer = answer_within(&mut client, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");

    let (mut sender, _connection) = h2_client::<Stalled>(addr).await;
    let request = http::Request::post(format!("http://{addr}/upload"))
        .version(http::Version::HTTP_2)
        .body(Stalled(Some(Bytes::from_static(b"abc"))))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"ok");
    running.proxy.shutdown().await;
}
