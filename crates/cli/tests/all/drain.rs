//! `--drain-timeout` on SIGTERM (issue 19): requests that finish within it are answered by the
//! upstream; a request still waiting on the upstream at the deadline gets `503` with
//! `connection: close`, is logged and counted, and the proxy still exits 0.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::support::{Proxy, upstream_after};

/// Sends one GET on its own thread; the answer's head and body, and when it came.
fn get_in_background(addr: SocketAddr) -> std::thread::JoinHandle<(String, Instant)> {
    std::thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
            .unwrap();
        let mut answer = String::new();
        // The proxy closes the connection after a `connection: close` answer.
        let _ = stream.read_to_string(&mut answer);
        (answer, Instant::now())
    })
}

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let config = dir.join("spillway.yaml");
    std::fs::write(
        &config,
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s }\n",
    )
    .unwrap();
    config
}

#[test]
fn a_request_still_waiting_at_the_drain_deadline_gets_503_and_the_proxy_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    // The upstream would answer after 20 s; the drain allows 1 s.
    let proxy = Proxy::start_logged(
        &config(dir.path()),
        upstream_after(Duration::from_secs(20)),
        &["--drain-timeout", "1s"],
        Some(&log),
    );
    let answer = get_in_background(proxy.listen);
    std::thread::sleep(Duration::from_millis(300));
    let stopped = Instant::now();
    let status = proxy.terminate();
    assert!(status.success(), "a clean stop exits 0: {status:?}");
    let (answer, at) = answer.join().unwrap();
    let after = at.duration_since(stopped);
    assert!(
        answer.starts_with("HTTP/1.1 503"),
        "the request cut at the deadline is answered 503: {answer}"
    );
    let head = answer.to_ascii_lowercase();
    assert!(head.contains("connection: close"), "{answer}");
    assert!(head.contains("urn:spillway:problem:draining"), "{answer}");
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(15),
        "answered at the drain deadline, not before it and not by the upstream: {after:?}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("drain timeout passed") && log.contains("answered_503=1"),
        "the cut is logged with its count:\n{log}"
    );
}

#[test]
fn a_request_that_finishes_within_the_drain_timeout_gets_the_upstreams_answer() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(
        &config(dir.path()),
        upstream_after(Duration::from_millis(700)),
        &["--drain-timeout", "10s"],
    );
    let answer = get_in_background(proxy.listen);
    std::thread::sleep(Duration::from_millis(200));
    let status = proxy.terminate();
    assert!(status.success(), "{status:?}");
    let (answer, _) = answer.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
}
