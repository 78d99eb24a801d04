//! The proxy's upstream HTTP/1.1 client (`h1.rs`) against hyper's `client::conn::http1`, in the
//! same run and against the same upstream: a hyper HTTP/1.1 server on loopback, on a thread of
//! its own, answering `GET /small` with 13 bytes, `GET /large` with 16 KiB and `POST /post` (a
//! 4 KiB body, read whole) with 13 bytes. Each client keeps one connection alive across the
//! requests, as the proxy keeps one per downstream connection, and runs on a current-thread
//! runtime, as a downstream connection's task does. What is measured is the time per request,
//! head written to body read; the two clients' times read as a ratio (issue 18 part 4).
//!
//! Run: `cargo bench -p spillway-proxy --bench upstream_client -- --warm-up-time 1 --measurement-time 3`.

use std::convert::Infallible;
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use spillway_proxy::bench_support::H1Client;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

const SMALL: &[u8] = b"hello, world\n";
const LARGE: usize = 16 * 1024;
const POSTED: usize = 4 * 1024;

/// Starts the upstream on a thread and runtime of its own, and says where it listens.
fn upstream() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = current_thread();
        runtime.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let large = Bytes::from(vec![b'x'; LARGE]);
            loop {
                let (io, _) = listener.accept().await.unwrap();
                io.set_nodelay(true).unwrap();
                let large = large.clone();
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let large = large.clone();
                    async move {
                        let body = match request.uri().path() {
                            "/large" => large,
                            _ => {
                                // A posted body is read whole before the answer.
                                let _ = request.into_body().collect().await;
                                Bytes::from_static(SMALL)
                            }
                        };
                        Ok::<_, Infallible>(Response::new(Full::new(body)))
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(io), service),
                );
            }
        });
    });
    rx.recv().unwrap()
}

fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// hyper's client over one kept-alive connection.
struct HyperClient {
    send: SendRequest<Full<Bytes>>,
    host: String,
}

impl HyperClient {
    async fn connect(addr: SocketAddr) -> Self {
        let io = TcpStream::connect(addr).await.unwrap();
        io.set_nodelay(true).unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .unwrap();
        tokio::spawn(conn);
        Self {
            send,
            host: addr.to_string(),
        }
    }

    async fn request(&mut self, method: Method, path: &str, body: Bytes) -> Bytes {
        self.send.ready().await.unwrap();
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.host)
            .body(Full::new(body))
            .unwrap();
        let response = self.send.send_request(request).await.unwrap();
        response.into_body().collect().await.unwrap().to_bytes()
    }
}

/// What one request is.
#[derive(Clone, Copy)]
enum Workload {
    GetSmall,
    GetLarge,
    Post,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::GetSmall => "GET 13 B",
            Workload::GetLarge => "GET 16 KiB",
            Workload::Post => "POST 4 KiB",
        }
    }

    fn answer_len(self) -> usize {
        match self {
            Workload::GetLarge => LARGE,
            Workload::GetSmall | Workload::Post => SMALL.len(),
        }
    }
}

/// Times `iters` requests, one after another, on the client's one connection.
fn timed(
    runtime: &Runtime,
    iters: u64,
    expected: usize,
    mut one: impl AsyncFnMut() -> Bytes,
) -> Duration {
    runtime.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let body = one().await;
            debug_assert_eq!(body.len(), expected);
            black_box(body);
        }
        start.elapsed()
    })
}

fn bench(c: &mut Criterion) {
    let addr = upstream();
    let runtime = current_thread();
    let posted = Bytes::from(vec![b'p'; POSTED]);
    for workload in [Workload::GetSmall, Workload::GetLarge, Workload::Post] {
        let mut group = c.benchmark_group(format!("upstream client/{}", workload.name()));
        let expected = workload.answer_len();

        let mut h1 = H1Client::new(addr);
        group.bench_function("h1.rs", |b| {
            b.iter_custom(|iters| {
                timed(&runtime, iters, expected, async || {
                    match workload {
                        Workload::GetSmall => h1.get("/small").await,
                        Workload::GetLarge => h1.get("/large").await,
                        Workload::Post => h1.post("/post", posted.clone()).await,
                    }
                    .unwrap()
                })
            })
        });
        assert_eq!(h1.connections(), 1, "h1.rs kept its connection alive");

        let mut hyper = runtime.block_on(HyperClient::connect(addr));
        group.bench_function("hyper", |b| {
            b.iter_custom(|iters| {
                timed(&runtime, iters, expected, async || match workload {
                    Workload::GetSmall => hyper.request(Method::GET, "/small", Bytes::new()).await,
                    Workload::GetLarge => hyper.request(Method::GET, "/large", Bytes::new()).await,
                    Workload::Post => hyper.request(Method::POST, "/post", posted.clone()).await,
                })
            })
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
