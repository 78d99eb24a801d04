//! `spillway up -c FILE` as a process: one node (rules service, controller, aggregator, linked
//! sidecar) forwards to a real upstream, answers on every admin endpoint, and stops on SIGTERM.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SPILLWAY: &str = env!("CARGO_BIN_EXE_spillway");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// One GET with `connection: close`: (status, body), or `None` when nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer.get(9..12)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// An upstream answering `200 up` once per connection, on a thread.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nup");
        }
    });
    port
}

#[test]
fn up_runs_a_linked_node_that_forwards_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spillway.yaml");
    std::fs::write(
        &config,
        "version: 1\ncontrol:\n  report_interval: 250ms\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s }\n",
    )
    .unwrap();
    let ports: Vec<u16> = (0..7).map(|_| free_port()).collect();
    let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
    let mut child = Command::new(SPILLWAY)
        .args(["up", "-c"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--upstream", &format!("http://127.0.0.1:{}", upstream())])
        .args(["--listen", &addr(0), "--admin", &addr(1)])
        .args(["--rules-listen", &addr(2)])
        .args([
            "--controller-listen",
            &addr(3),
            "--controller-admin",
            &addr(4),
        ])
        .args([
            "--aggregator-listen",
            &addr(5),
            "--aggregator-admin",
            &addr(6),
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spillway up starts");
    let start = Instant::now();
    let linked = loop {
        let metrics = get(ports[1], "/metrics").map(|m| m.1).unwrap_or_default();
        let hosts = get(ports[4], "/v1/hosts").map(|h| h.1).unwrap_or_default();
        if metrics.contains("spillway_control_plane_connected 1") && hosts.contains("local-1") {
            break true;
        }
        if start.elapsed() > Duration::from_secs(20) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let forwarded = get(ports[0], "/hello");
    let rules = get(ports[2], "/healthz");
    let hosts = get(ports[4], "/v1/hosts");
    let dashboard = get(ports[4], "/");
    let aggregator = get(ports[6], "/healthz");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    let _ = child.stdout.take().unwrap().read_to_string(&mut stdout);

    assert!(
        linked,
        "the sidecar never linked to the controller within 20 s"
    );
    assert_eq!(forwarded.map(|f| f.0), Some(200), "the sidecar forwards");
    assert_eq!(rules.map(|r| r.0), Some(200), "the rules service answers");
    let hosts = hosts.expect("the controller's admin answers").1;
    assert!(
        hosts.contains("local-1"),
        "the controller knows the sidecar: {hosts}"
    );
    assert_eq!(aggregator.map(|a| a.0), Some(200));
    let (status_code, page) = dashboard.expect("the controller's admin answers on /");
    assert_eq!(status_code, 200);
    assert!(
        page.contains("<title>spillway controller</title>"),
        "{page}"
    );
    assert!(
        stdout.contains("admin token (shown once): spw_"),
        "a fresh store prints an admin token: {stdout}"
    );
    assert!(
        stdout.contains(&format!("dashboard: http://127.0.0.1:{}/", ports[4])),
        "the dashboard's address is printed: {stdout}"
    );
    assert_eq!(status.map(|s| s.success()), Some(true), "exit 0 on SIGTERM");
}

#[test]
fn up_serves_loopback_only_unless_asked_and_its_admin_ports_always() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spillway.yaml");
    std::fs::write(
        &config,
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 100/s }\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        Command::new(SPILLWAY)
            .args(["up", "-c", config.to_str().unwrap(), "--state-dir"])
            .arg(dir.path().join("state"))
            .args(extra)
            .output()
            .unwrap()
    };
    // Refused before anything binds: these tests listen on loopback only.
    let out = run(&["--rules-listen", "0.0.0.0:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--insecure-plaintext"), "{stderr}");
    let out = run(&["--controller-admin", "0.0.0.0:0", "--insecure-plaintext"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--admin-token-file"), "{stderr}");
}

/// The rules the node's rules service lists, with a token made in its store.
fn listed_rules(up: &crate::support::up::Up, user: &str) -> Vec<serde_json::Value> {
    let token = crate::support::up::user(&up.db, user, "viewer");
    let client = spillway_rules::client::RulesClient::new(
        &format!("http://127.0.0.1:{}", up.rules),
        Some(token),
    );
    let answer = client.get("/v1/rules").unwrap();
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    answer.body.as_array().unwrap().clone()
}

#[test]
fn up_starts_again_on_its_state_with_its_users_and_rules() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: orders, limit: 100/s }\n";
    let mut first = crate::support::up::up(dir.path(), config);
    let rules = listed_rules(&first, "first");
    assert_eq!(rules.len(), 1, "{rules:?}");
    let status = first.proc.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    // The same state: it found its users and the same rules, and made no second copy of either.
    let mut second = crate::support::up::up(dir.path(), config);
    let again = listed_rules(&second, "second");
    assert_eq!(again, rules);
    let status = second.proc.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}
