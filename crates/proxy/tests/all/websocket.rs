//! HTTP/1.1 upgrades through the proxy: a real WebSocket client and server
//! (Python's `websockets`, from the virtual environment scripts/test makes, SPILLWAY_PYTHON)
//! talk through the proxy once the limiter admitted the handshake; a handshake over the limit is
//! answered 429 and never reaches the upstream; an upgraded connection is not cut by the idle
//! timeout; an upstream that declines the upgrade is answered like any request.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::{admin, proxy, proxy_with, send_raw};

fn python() -> String {
    // scripts/test gives a virtual environment with websockets installed.
    std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/websocket.py")
}

/// The Python echo server, and the lines it prints after its port ("connected" per connection).
struct EchoServer {
    child: Child,
    port: u16,
    lines: std::sync::mpsc::Receiver<String>,
}

impl EchoServer {
    fn start() -> Self {
        let mut child = Command::new(python())
            .arg(script())
            .arg("server")
            .args(["--timeout", "60"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python runs (scripts/test makes SPILLWAY_PYTHON, a venv with websockets)");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let port = first
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the echo server printed {first:?}, not its port"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, port, lines }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How many connections it has accepted so far.
    fn connections(&self) -> usize {
        self.lines.try_iter().filter(|l| l == "connected").count()
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs the Python client against `url` on a blocking thread; its one line of output.
async fn client(url: String, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(python())
            .arg(script())
            .arg("client")
            .arg(&url)
            .args(&args)
            .args(["--timeout", "30"])
            .output()
            .expect("python runs");
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(
            out.status.success(),
            "the client failed: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    })
    .await
    .unwrap()
}

const OPEN: &str =
    "version: 1\nservices:\n  chat:\n    buckets:\n      - { name: all, limit: 1000/s }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_echoes_through_the_proxy_in_text_and_binary() {
    let upstream = EchoServer::start();
    let running = proxy(OPEN, &upstream.url()).await;
    let url = format!("ws://{}/chat", running.proxy.addr());
    let out = client(url, &["--messages", "40"]).await;
    assert_eq!(
        out, "echoed 40",
        "every message, up to 256 KiB, came back intact"
    );
    let metrics = admin(&running, "/metrics").await.body;
    assert!(
        metrics.contains("spillway_upgrades_total 1"),
        "the tunnel is counted: {metrics}"
    );
    assert!(
        metrics.contains("spillway_bucket_upgrades_total{service=\"chat\",bucket=\"all\"} 1"),
        "by the bucket its handshake matched: {metrics}"
    );
    assert!(
        metrics.contains(
            "spillway_requests_total{service=\"chat\",bucket=\"all\",decision=\"allowed\",criticality=\"critical\"} 1"
        ),
        "the handshake was decided like any request: {metrics}"
    );
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_over_the_limit_gets_429_and_never_reaches_the_upstream() {
    let upstream = EchoServer::start();
    let yaml = "version: 1\nservices:\n  chat:\n    buckets:\n      - { name: all, limit: 1/h, algorithm: token-bucket }\n";
    let running = proxy(yaml, &upstream.url()).await;
    let url = format!("ws://{}/chat", running.proxy.addr());
    assert_eq!(client(url.clone(), &["--messages", "2"]).await, "echoed 2");
    assert_eq!(client(url, &["--messages", "2"]).await, "refused 429");
    // The first connection's line may still be on its way.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        upstream.connections(),
        1,
        "only the admitted handshake got through"
    );
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_connection_outlives_the_idle_timeout() {
    let upstream = EchoServer::start();
    let running = proxy_with(OPEN, &upstream.url(), |options| {
        options.idle_timeout = Duration::from_millis(300);
        options.header_timeout = Duration::from_millis(300);
    })
    .await;
    let url = format!("ws://{}/chat", running.proxy.addr());
    // Four quiet gaps of 0.5 s, each longer than both timeouts.
    let out = client(url, &["--messages", "5", "--pause", "0.5"]).await;
    assert_eq!(out, "echoed 5");
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn an_upstream_that_declines_the_upgrade_is_answered_like_any_request() {
    // The tests' upstream speaks plain HTTP and answers 200 to a handshake.
    let upstream = crate::support::Upstream::start().await;
    let running = proxy(OPEN, &upstream.url()).await;
    let answer = send_raw(
        running.proxy.addr(),
        b"GET /chat HTTP/1.1\r\nhost: app\r\nconnection: upgrade, close\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body, "upstream saw /chat");
    running.proxy.shutdown().await;
}
