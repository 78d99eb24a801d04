//! Test support: a small real upstream (HTTP/1.1 and h2c, with a gRPC method), a proxy started
//! in-process on 127.0.0.1:0 from a real file, and plain HTTP/1.1 and HTTP/2 clients.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use spillway_proxy::{Proxy, ProxyOptions};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinSet;

/// A real upstream: answers `200 upstream saw PATH`, counts requests, holds `/slow` until
/// released, and answers gRPC calls by echoing the request message (three times for a method
/// named `Stream`) with `grpc-status: 0` in trailers.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<AtomicUsize>,
    pub release: Arc<Notify>,
    pub arrived: mpsc::UnboundedReceiver<()>,
    tasks: JoinSet<()>,
}

type UpBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

async fn answer(
    request: Request<Incoming>,
    seen: Arc<AtomicUsize>,
    release: Arc<Notify>,
    arrived: mpsc::UnboundedSender<()>,
) -> Result<Response<UpBody>, Infallible> {
    seen.fetch_add(1, Ordering::SeqCst);
    let path = request.uri().path().to_owned();
    let request_headers = request.headers().clone();
    let grpc = request
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if path == "/slow" {
        let _ = arrived.send(());
        release.notified().await;
    }
    let collected = request.into_body().collect().await;
    if path == "/trailers" {
        // What arrived: the body, and the trailer fields by name, sorted.
        let Ok(collected) = collected else {
            return Ok(Response::new(BodyExt::boxed(Full::new(Bytes::from(
                "body failed",
            )))));
        };
        let mut names: Vec<String> = collected
            .trailers()
            .map(|t| {
                t.iter()
                    .map(|(n, v)| format!("{n}={}", v.to_str().unwrap_or("?")))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        let text = format!(
            "body={}\ntrailers={}",
            String::from_utf8_lossy(&collected.to_bytes()),
            names.join(",")
        );
        return Ok(Response::new(BodyExt::boxed(Full::new(Bytes::from(text)))));
    }
    let body = collected.map(|b| b.to_bytes());
    if grpc {
        // Echo the request message back, then trailers: a unary gRPC call. A method named
        // `.../Stream` answers the message three times, like a server-streaming call.
        let message = body.unwrap_or_default();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", "0".parse().unwrap());
        trailers.insert("grpc-message", "echoed".parse().unwrap());
        trailers.insert("x-upstream-trailer", "intact".parse().unwrap());
        let copies = if path.ends_with("/Stream") { 3 } else { 1 };
        let mut frames: Vec<_> = (0..copies).map(|_| Frame::data(message.clone())).collect();
        frames.push(Frame::trailers(trailers));
        let body = Frames(frames.into_iter());
        let mut response = Response::new(BodyExt::boxed(body));
        response
            .headers_mut()
            .insert("content-type", "application/grpc".parse().unwrap());
        return Ok(response);
    }
    if path == "/forwarded" {
        // What the proxy added: the forwarded headers, each line as received.
        let lines = |name: &str| {
            request_headers
                .get_all(name)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let mut text = format!(
            "xff={}\nxfp={}",
            lines("x-forwarded-for"),
            lines("x-forwarded-proto")
        );
        if request_headers.contains_key("forwarded") {
            text.push_str(&format!("\nfwd={}", lines("forwarded")));
        }
        return Ok(Response::new(BodyExt::boxed(Full::new(Bytes::from(text)))));
    }
    if path == "/request-id" {
        // The request ids the upstream received, each line as received.
        let ids: Vec<String> = request_headers
            .get_all("x-request-id")
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        return Ok(Response::new(BodyExt::boxed(Full::new(Bytes::from(
            ids.join(" | "),
        )))));
    }
    let text = format!("upstream saw {path}");
    Ok(Response::new(BodyExt::boxed(Full::new(Bytes::from(text)))))
}

/// A body made of ready frames: data, then trailers.
struct Frames(std::vec::IntoIter<Frame<Bytes>>);

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        std::task::Poll::Ready(self.0.next().map(Ok))
    }
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(Notify::new());
        let (arrived_tx, arrived) = mpsc::unbounded_channel();
        let mut tasks = JoinSet::new();
        let (s, r) = (seen.clone(), release.clone());
        tasks.spawn(async move {
            // Connections live in this set, so killing the upstream closes them too.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (s, r, a) = (s.clone(), r.clone(), arrived_tx.clone());
                let service = service_fn(move |req| answer(req, s.clone(), r.clone(), a.clone()));
                connections.spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            seen,
            release,
            arrived,
            tasks,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }

    /// Stops listening and closes every connection, like a crashed process.
    pub async fn kill(mut self) {
        self.tasks.shutdown().await;
    }
}

/// A proxy in front of `upstream`, with its rules in a real file.
pub struct Running {
    pub proxy: Proxy,
    pub config: PathBuf,
    _dir: tempfile::TempDir,
}

pub async fn proxy(yaml: &str, upstream: &str) -> Running {
    proxy_on(yaml, upstream, 0).await
}

/// A proxy serving on `workers` threads of its own (0: on the test's runtime).
pub async fn proxy_on(yaml: &str, upstream: &str, workers: usize) -> Running {
    proxy_with(yaml, upstream, |options| options.workers = workers).await
}

/// A proxy whose options `configure` changes from the tests' defaults.
pub async fn proxy_with(
    yaml: &str,
    upstream: &str,
    configure: impl FnOnce(&mut ProxyOptions),
) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spillway.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut options = ProxyOptions::new(
        config.clone(),
        "127.0.0.1:0".parse().unwrap(),
        upstream.to_owned(),
    );
    options.admin = Some("127.0.0.1:0".parse().unwrap());
    options.reload_every = Duration::from_millis(50);
    options.drain_timeout = Duration::from_secs(10);
    configure(&mut options);
    let proxy = Proxy::start(options).await.unwrap();
    Running {
        proxy,
        config,
        _dir: dir,
    }
}

/// What a test looks at in a response.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    pub trailers: Option<HeaderMap>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn read(response: Response<Incoming>) -> Answer {
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
        trailers,
    }
}

/// One HTTP/1.1 GET on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = Request::get(path).header("host", addr.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    read(response).await
}

/// `n` GETs; returns how many got each status.
pub async fn statuses(addr: SocketAddr, path: &str, n: usize) -> (usize, usize) {
    let (mut ok, mut limited) = (0, 0);
    for _ in 0..n {
        match get(addr, path, &[]).await.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (ok, limited)
}

/// One unary gRPC call over h2c (prior knowledge) carrying `message`.
pub async fn grpc_call(addr: SocketAddr, method: &str, message: &[u8]) -> Answer {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    // gRPC framing: a zero compression flag, a big-endian length, the message.
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.extend_from_slice(&[0]);
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    let request = Request::post(format!("http://{addr}{method}"))
        .version(http::Version::HTTP_2)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(frame.freeze()))
        .unwrap();
    read(sender.send_request(request).await.unwrap()).await
}

/// The admin listener's answer at `path`.
pub async fn admin(running: &Running, path: &str) -> Answer {
    get(running.proxy.admin_addr().unwrap(), path, &[]).await
}

/// The config written as one bucket per line.
pub fn config(buckets: &[&str]) -> String {
    let mut yaml = String::from("version: 1\nservices:\n  api:\n    buckets:\n");
    for b in buckets {
        yaml.push_str("      - ");
        yaml.push_str(b);
        yaml.push('\n');
    }
    yaml
}

/// An answer read off a raw connection: the status, the head as text, the body.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// Sends `request` (whole, as bytes) on a fresh connection and reads the answer to the end (the
/// request should say `connection: close`), within 5 s.
pub async fn send_raw(addr: SocketAddr, request: &[u8]) -> Raw {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    Raw {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}
