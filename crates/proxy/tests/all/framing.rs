//! The request framing the proxy refuses or cleans before the upstream sees it (the edge's rules,
//! issue 18): a malformed body is the client's fault (`400`, never a `502`, never counted as an
//! upstream error); a client that half-closes after its request still gets the answer; request
//! trailers lose the fields a trailer section must not carry; a transfer coding other than
//! `chunked` is refused with `501` rather than forwarded with its coding lost. Raw bytes over a
//! real socket.

use std::time::Duration;

use crate::support::{Upstream, admin, proxy, send_raw};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const FILE: &str =
    "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s }\n";

/// Sends `request`, shuts the connection's write side, and reads the answer to its end.
async fn send_then_half_close(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {metrics}"))
}

#[tokio::test]
async fn a_malformed_body_gets_400_and_is_no_upstream_error() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let addr = running.proxy.addr();
    // A chunk size that is not hexadecimal.
    let chunk = send_raw(
        addr,
        b"POST /a HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(chunk.status, 400, "{chunk:?}");
    assert!(
        chunk.body.contains("urn:spillway:problem:bad-body"),
        "{chunk:?}"
    );
    assert!(
        chunk
            .head
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{chunk:?}"
    );
    // A body shorter than its content-length, the client's side then closed.
    let short = send_then_half_close(
        addr,
        b"POST /a HTTP/1.1\r\nhost: app\r\ncontent-length: 10\r\n\r\nabc",
    )
    .await;
    assert!(short.starts_with("HTTP/1.1 400"), "{short}");
    let metrics = admin(&running, "/metrics").await.body;
    assert_eq!(
        metric(&metrics, "spillway_upstream_errors_total"),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "spillway_requests_refused_total{reason=\"bad_body\"}"
        ),
        2.0
    );
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let answer = send_then_half_close(
        running.proxy.addr(),
        b"GET /half HTTP/1.1\r\nhost: app\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(answer.ends_with("upstream saw /half"), "{answer:?}");
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn request_trailers_lose_framing_routing_and_authentication_fields() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let answer = send_raw(
        running.proxy.addr(),
        b"POST /trailers HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\nconnection: close\r\n\r\n5\r\nhello\r\n0\r\nx-checksum: 5d41\r\ncontent-length: 999\r\ntransfer-encoding: chunked\r\nhost: admin.internal\r\nauthorization: Bearer x\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.body, "body=hello\ntrailers=x-checksum=5d41",
        "only the announced checksum is left"
    );
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn a_coding_other_than_chunked_gets_501_and_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let addr = running.proxy.addr();
    let gzip = send_raw(
        addr,
        b"POST /a HTTP/1.1\r\nhost: app\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(gzip.status, 501, "{gzip:?}");
    assert!(gzip.body.contains("gzip, chunked"), "{gzip:?}");
    // Two lines are one list.
    let lines = send_raw(
        addr,
        b"POST /a HTTP/1.1\r\nhost: app\r\ntransfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(lines.status, 501, "{lines:?}");
    assert_eq!(upstream.seen(), 0, "neither reached the upstream");
    // Chunked alone is forwarded.
    let chunked = send_raw(
        addr,
        b"POST /a HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(chunked.status, 200, "{chunked:?}");
    let metrics = admin(&running, "/metrics").await.body;
    assert_eq!(
        metric(
            &metrics,
            "spillway_requests_refused_total{reason=\"unsupported_transfer_coding\"}"
        ),
        2.0
    );
    running.proxy.shutdown().await;
}
