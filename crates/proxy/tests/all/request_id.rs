//! Request ids (docs/operations.md "Request ids"): the upstream receives the client's
//! `x-request-id` when it is usable and a new one otherwise, the proxy's own answers (a 429, a
//! 502) carry it back, and the proxy's log line about a failed request names it. Raw bytes over
//! real sockets, the proxy on the test's thread so that its log lines are the test's.

use std::io::Write;
use std::sync::{Arc, Mutex};

use crate::support::{Upstream, proxy, send_raw};

const FILE: &str = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: tiny, match: {procedure: /tiny}, limit: 1/h, algorithm: token-bucket }\n      - { name: all, limit: 1000/s }\n";

fn is_new_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The value of header `name` in a raw answer's head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test]
async fn the_upstream_gets_the_clients_id_or_a_new_one() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let addr = running.proxy.addr();
    let ask = |extra: &'static str| {
        let request =
            format!("GET /request-id HTTP/1.1\r\nhost: app\r\n{extra}connection: close\r\n\r\n");
        async move { send_raw(addr, request.as_bytes()).await }
    };
    let kept = ask("x-request-id: checkout-7f3a\r\n").await;
    assert_eq!((kept.status, kept.body.as_str()), (200, "checkout-7f3a"));

    let first = ask("").await.body;
    let second = ask("").await.body;
    assert!(is_new_id(&first) && is_new_id(&second), "{first} {second}");
    assert_ne!(first, second);
    // One proxy's ids share their first half; the second half counts.
    assert_eq!(first[..16], second[..16]);

    // Unusable ids are replaced, never forwarded beside the new one.
    for bad in [
        "x-request-id: has space\r\n",
        "x-request-id: a\r\nx-request-id: b\r\n",
    ] {
        let replaced = ask(bad).await.body;
        assert!(is_new_id(&replaced), "{bad:?} gave {replaced:?}");
    }
    let long = format!("x-request-id: {}\r\n", "x".repeat(129)).leak();
    assert!(is_new_id(&ask(long).await.body));
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn a_429_carries_the_requests_id() {
    let upstream = Upstream::start().await;
    let running = proxy(FILE, &upstream.url()).await;
    let addr = running.proxy.addr();
    let mut limited = Vec::new();
    for n in 0..5 {
        let request = format!(
            "GET /tiny HTTP/1.1\r\nhost: app\r\nx-request-id: tiny-{n}\r\nconnection: close\r\n\r\n"
        );
        let answer = send_raw(addr, request.as_bytes()).await;
        if answer.status == 429 {
            assert_eq!(
                header(&answer.head, "x-request-id"),
                Some(format!("tiny-{n}").as_str()),
                "{}",
                answer.head
            );
            limited.push(n);
        }
    }
    assert!(!limited.is_empty(), "1/h let 5 requests through");
    // Without an id of its own, the client learns the new one from the 429.
    let answer = send_raw(
        addr,
        b"GET /tiny HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 429, "{}", answer.head);
    let id = header(&answer.head, "x-request-id").expect("an id");
    assert!(is_new_id(id), "{id}");
    running.proxy.shutdown().await;
}

/// Log lines, as the proxy writes them, into a buffer the test reads.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_failed_upstream_request_is_answered_and_logged_with_its_id() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    // Nothing listens on the upstream's port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let running = proxy(FILE, &url).await;
    let answer = send_raw(
        running.proxy.addr(),
        b"GET /orders HTTP/1.1\r\nhost: app\r\nx-request-id: order-991\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 502, "{}", answer.head);
    assert_eq!(header(&answer.head, "x-request-id"), Some("order-991"));
    running.proxy.shutdown().await;
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("upstream request failed"))
        .unwrap_or_else(|| panic!("no log line of the failure in:\n{text}"));
    assert!(line.contains("request_id=\"order-991\""), "{line}");
}
