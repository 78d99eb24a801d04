//! Which upgrades the proxy tunnels: no request may pass the limiter inside a tunnel. An `h2c`
//! upgrade is never forwarded (its requests would be HTTP/2 streams the proxy never sees), so
//! it is decided and forwarded as a plain request; a `101` opens a tunnel only when it is the
//! WebSocket handshake the client asked for (RFC 6455's `sec-websocket-accept`), and otherwise
//! the client gets 502 and nothing it sends afterwards reaches the upstream. The upstreams here
//! are the ones an attacker would pick ([`crate::recording::Mode`]).

use std::net::SocketAddr;
use std::time::Duration;

use crate::recording::{Mode, Recording, read_head};
use crate::support::{admin, proxy, proxy_with};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One bucket that admits two requests in all (a token bucket of 2 an hour).
const TWO: &str = "version: 1\nservices:\n  app:\n    buckets:\n      - { name: two, limit: 2/h, algorithm: token-bucket }\n";

const OPEN: &str =
    "version: 1\nservices:\n  app:\n    buckets:\n      - { name: all, limit: 1000/s }\n";

/// How many HTTP/2 requests a client tries to send in a tunnel it got.
const IN_TUNNEL: usize = 50;

/// An h2c upgrade, as RFC 7540 §3.2 writes it: `HTTP2-Settings` is not named in `connection`
/// (the request), so a proxy that only drops what `connection` names forwards it.
fn h2c_request(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nhost: app\r\nconnection: Upgrade\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
    )
}

/// The status of an answer's head.
fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"))
}

/// Sends an h2c upgrade; when it is switched, speaks HTTP/2 in the tunnel and sends
/// [`IN_TUNNEL`] requests. Returns the status of the upgrade's answer and how many requests in
/// the tunnel got an answer.
async fn try_h2c(proxy: SocketAddr, path: &str) -> (u16, usize) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(h2c_request(path).as_bytes())
        .await
        .unwrap();
    let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut stream))
        .await
        .expect("an answer within 5 s")
        .expect("an answer's head");
    let code = status(&head);
    if code != 101 {
        return (code, 0);
    }
    let Ok((mut sender, connection)) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await
    else {
        return (code, 0);
    };
    tokio::spawn(connection);
    let mut answered = 0;
    for i in 0..IN_TUNNEL {
        let request = Request::get(format!("http://app/tunnelled/{i}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        match tokio::time::timeout(Duration::from_secs(5), sender.send_request(request)).await {
            Ok(Ok(response)) => {
                let _ = response.into_body().collect().await;
                answered += 1;
            }
            _ => break,
        }
    }
    (code, answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upgrade_is_decided_and_forwarded_as_a_plain_request() {
    let upstream = Recording::start(Mode::H2c).await;
    let running = proxy(TWO, &upstream.url()).await;
    let mut statuses = Vec::new();
    let mut tunnelled = 0;
    for i in 0..5 {
        let (code, answered) = try_h2c(running.proxy.addr(), &format!("/h2c/{i}")).await;
        statuses.push(code);
        tunnelled += answered;
    }
    let seen = upstream.seen();
    assert_eq!(
        tunnelled, 0,
        "no HTTP/2 request passed in a tunnel; the upstream saw {seen:?}"
    );
    assert_eq!(
        statuses,
        [200, 200, 429, 429, 429],
        "every upgrade was decided as a request: the bucket's two admitted, the rest limited"
    );
    assert_eq!(seen.len(), 2, "only the admitted two reached it: {seen:?}");
    for head in &seen {
        assert!(
            head.starts_with("get /h2c/"),
            "a plain HTTP/1.1 request: {head:?}"
        );
        assert!(
            !head.contains("\nupgrade:") && !head.contains("http2-settings"),
            "without its upgrade and its HTTP/2 settings: {head:?}"
        );
    }
    let metrics = admin(&running, "/metrics").await.body;
    assert!(
        metrics.contains("spillway_upgrades_refused_total{reason=\"protocol\"} 5"),
        "each removed upgrade is counted: {metrics}"
    );
    assert!(metrics.contains("spillway_upgrades_total 0"), "{metrics}");
    running.proxy.shutdown().await;
}

/// A WebSocket handshake with RFC 6455's example key.
const HANDSHAKE: &str = "GET /chat HTTP/1.1\r\nhost: app\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";

/// Reads whatever the proxy still sends until it closes the connection (an end of stream or a
/// reset); fails if it is still open after 5 s.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => rest.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the proxy closed the connection");
    rest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_101_without_the_websocket_accept_gets_502_and_nothing_after_it_reaches_the_upstream() {
    for mode in [Mode::LenientWrongAccept, Mode::LenientNoAccept] {
        let upstream = Recording::start(mode).await;
        let running = proxy(OPEN, &upstream.url()).await;
        let mut stream = TcpStream::connect(running.proxy.addr()).await.unwrap();
        // A request pipelined right behind the handshake, as if the tunnel were already open.
        let first = format!("{HANDSHAKE}GET /inside/0 HTTP/1.1\r\nhost: app\r\n\r\n");
        stream.write_all(first.as_bytes()).await.unwrap();
        let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut stream))
            .await
            .expect("an answer within 5 s")
            .expect("an answer's head");
        assert_eq!(status(&head), 502, "{mode:?}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{mode:?}: a problem document: {head}"
        );
        // More requests, written after the refusal, to a connection that should be closing.
        for i in 1..=20 {
            let request = format!("GET /inside/{i} HTTP/1.1\r\nhost: app\r\n\r\n");
            if stream.write_all(request.as_bytes()).await.is_err() {
                break;
            }
        }
        let rest = read_until_closed(&mut stream).await;
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            !rest.contains("HTTP/1.1 200"),
            "{mode:?}: no request after the refused 101 was answered: {rest}"
        );
        // The upstream's connection is closed too; anything in flight has had time to land.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let seen = upstream.seen();
        assert_eq!(
            seen.len(),
            1,
            "{mode:?}: the upstream saw the handshake and nothing after it: {seen:?}"
        );
        assert!(seen[0].starts_with("get /chat"), "{seen:?}");
        let metrics = admin(&running, "/metrics").await.body;
        assert!(
            metrics.contains("spillway_upgrades_refused_total{reason=\"handshake\"} 1"),
            "{mode:?}: the refused 101 is counted: {metrics}"
        );
        assert!(metrics.contains("spillway_upgrades_total 0"), "{metrics}");
        running.proxy.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_handshake_without_a_key_is_forwarded_as_a_plain_request() {
    let upstream = Recording::start(Mode::LenientWrongAccept).await;
    let running = proxy(OPEN, &upstream.url()).await;
    let mut stream = TcpStream::connect(running.proxy.addr()).await.unwrap();
    let keyless = "GET /chat HTTP/1.1\r\nhost: app\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\r\n";
    stream.write_all(keyless.as_bytes()).await.unwrap();
    let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut stream))
        .await
        .expect("an answer within 5 s")
        .expect("an answer's head");
    assert_eq!(
        status(&head),
        200,
        "the upstream answered a plain request: {head}"
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        !seen[0].contains("\nupgrade:"),
        "no upgrade asked: {seen:?}"
    );
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_upgrades_can_forward_no_upgrade_at_all() {
    let upstream = Recording::start(Mode::LenientWrongAccept).await;
    let yaml = format!("{OPEN}proxy:\n  upgrades: []\n");
    let running = proxy_with(&yaml, &upstream.url(), |_| {}).await;
    let mut stream = TcpStream::connect(running.proxy.addr()).await.unwrap();
    stream.write_all(HANDSHAKE.as_bytes()).await.unwrap();
    let head = tokio::time::timeout(Duration::from_secs(5), read_head(&mut stream))
        .await
        .expect("an answer within 5 s")
        .expect("an answer's head");
    assert_eq!(status(&head), 200, "{head}");
    let seen = upstream.seen();
    assert!(!seen[0].contains("\nupgrade:"), "{seen:?}");
    running.proxy.shutdown().await;
}
