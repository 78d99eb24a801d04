//! Every admin page and API answer carries the security headers, on each kind of listener,
//! through the real binary: the proxy's, the aggregator's and the controller's admin listeners
//! (the controller's dashboard and its script included) and the rules service.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::fleet::{Proc, aggregator, controller};
use crate::support::{SPILLWAY, free_port};

const EXPECTED: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; \
         frame-ancestors 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
];

/// Header names (in lower case) and values, in the order they came.
type Headers = Vec<(String, String)>;

/// A GET on 127.0.0.1:`port`: the status, the headers and the body, or `None` while nothing
/// answers.
fn get(port: u16, path: &str) -> Option<(u16, Headers, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Some((status, headers, body.to_owned()))
}

/// Waits (20 s at most) until `port` answers `path` with 200, and returns that answer.
fn ready(port: u16, path: &str, what: &str) -> (Headers, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((200, headers, body)) = get(port, path) {
            return (headers, body);
        }
        assert!(Instant::now() < deadline, "{what} never answered {path}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Asserts the security headers on `port`'s answers to each of `paths`, whatever their status.
fn assert_headers(port: u16, paths: &[&str], what: &str) {
    for path in paths {
        let (status, headers, _) =
            get(port, path).unwrap_or_else(|| panic!("{what} answers {path}"));
        for (name, value) in EXPECTED {
            assert_eq!(
                header(&headers, name),
                Some(value),
                "{what}: {name} on {path} ({status})"
            );
        }
    }
}

#[test]
fn every_kind_of_listener_sends_the_security_headers() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "version: 1\nservices:\n  orders:\n    buckets:\n      - { name: all, limit: 100/s }\n",
    )
    .unwrap();

    let (grpc, admin) = (free_port(), free_port());
    let _controller = controller(grpc, &rules, &["--admin", &format!("127.0.0.1:{admin}")]);
    let (_, page) = ready(admin, "/", "the controller's dashboard");
    // The page runs no inline script: every script is a file the listener serves.
    for tag in page.split("<script").skip(1) {
        let tag = &tag[..tag.find('>').unwrap()];
        assert!(tag.contains("src=\"/"), "an inline script: <script{tag}>");
    }
    let (headers, script) = ready(admin, "/dashboard.js", "the controller's dashboard script");
    assert_eq!(
        header(&headers, "content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert!(script.contains("setInterval(refresh"), "{script}");
    assert_headers(
        admin,
        &[
            "/",
            "/dashboard.js",
            "/healthz",
            "/metrics",
            "/v1/buckets",
            "/nowhere",
        ],
        "the controller's admin listener",
    );

    let (zone_grpc, zone_admin) = (free_port(), free_port());
    let _aggregator = aggregator(
        zone_grpc,
        "z1",
        grpc,
        &["--admin", &format!("127.0.0.1:{zone_admin}")],
    );
    ready(zone_admin, "/healthz", "the aggregator's admin listener");
    assert_headers(
        zone_admin,
        &["/healthz", "/metrics", "/nowhere"],
        "the aggregator's admin listener",
    );

    let proxy = crate::support::Proxy::start(&rules, crate::support::upstream());
    assert_headers(
        proxy.admin.port(),
        &["/healthz", "/readyz", "/metrics", "/nowhere"],
        "the proxy's admin listener",
    );

    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let port = free_port();
    let _rules = Proc(
        Command::new(SPILLWAY)
            .args(["rules", "serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", &database])
            .stderr(Stdio::null())
            .spawn()
            .expect("rules serve starts"),
    );
    ready(port, "/healthz", "the rules service");
    assert_headers(
        port,
        &[
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/v1/whoami",
            "/nowhere",
        ],
        "the rules service",
    );
}
