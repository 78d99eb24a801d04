//! The sidecar end to end: a real upstream, the proxy on 127.0.0.1:0 with its rules in a real
//! file, and real clients over HTTP/1.1 and h2c.

use std::time::Duration;

use crate::support::{
    Upstream, admin, config, get, grpc_call, proxy, proxy_on, proxy_with, statuses,
};
use http::StatusCode;
use spillway_core::algo::Ratio;

/// A bucket these tests never fill.
const UNHIT: &str = "{ name: b, limit: 100/h, algorithm: token-bucket }";
/// What the raw upstreams below answer.
const OK_ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_local_algorithm_is_enforced_through_the_proxy() {
    let upstream = Upstream::start().await;
    let algorithms = [
        "token-bucket",
        "leaky-bucket",
        "fixed-window",
        "sliding-window-log",
        "sliding-window-counter",
        "gcra",
    ];
    let buckets: Vec<String> = algorithms
        .iter()
        .map(|a| {
            format!(
                "{{ name: {a}, match: {{ procedure: /{a} }}, limit: 5/h, algorithm: {a}, store: local }}"
            )
        })
        .collect();
    let buckets: Vec<&str> = buckets.iter().map(String::as_str).collect();
    let running = proxy(&config(&buckets), &upstream.url()).await;
    let addr = running.proxy.addr();
    let mut admitted = 0;
    for algorithm in algorithms {
        // 5 an hour: within the test nothing refills, so the count is the definition's. Every
        // algorithm admits the 5 of its limit, except the leaky bucket, which admits the request
        // that finds its queue empty plus a backlog of `burst` (5 by default) intervals: 6.
        let expected = if algorithm == "leaky-bucket" { 6 } else { 5 };
        let (ok, limited) = statuses(addr, &format!("/{algorithm}"), 8).await;
        assert_eq!((ok, limited), (expected, 8 - expected), "{algorithm}");
        admitted += expected;
    }
    assert_eq!(upstream.seen(), admitted);
    // A path no bucket matches is never limited.
    assert_eq!(statuses(addr, "/free", 20).await, (20, 0));
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_gets_every_header_of_spec_section_3() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &config(&["{ name: search-quota, limit: 10 per 60s, algorithm: token-bucket }"]),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    assert_eq!(statuses(addr, "/search", 10).await, (10, 0));
    let answer = get(addr, "/search", &[]).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    // A token comes back every 6 s (10 per 60 s), so the wait is at most 6 whole seconds.
    let retry: u64 = answer.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=6).contains(&retry), "retry-after {retry}");
    assert_eq!(
        answer.header("ratelimit-policy"),
        Some("\"search-quota\";q=10;w=60")
    );
    assert_eq!(
        answer.header("ratelimit"),
        Some(format!("\"search-quota\";r=0;t={retry}").as_str())
    );
    assert_eq!(answer.header("x-spillway-bucket"), Some("search-quota"));
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["bucket"], "search-quota");
    assert_eq!(body["service"], "api");
    assert_eq!(body["retry_after"], retry);
    assert!(body["detail"].as_str().unwrap().contains("search-quota"));
    assert_eq!(
        upstream.seen(),
        10,
        "the dropped request never reached the upstream"
    );
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_subject_buckets_limit_each_user_apart() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &config(&["{ name: per-user, match: { user: \"*\" }, limit: 2/h, algorithm: gcra }"]),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    for user in ["alice", "bob"] {
        let codes: Vec<u16> = {
            let mut codes = Vec::new();
            for _ in 0..3 {
                codes.push(get(addr, "/", &[("x-user-id", user)]).await.status.as_u16());
            }
            codes
        };
        assert_eq!(codes, [200, 200, 429], "{user}");
    }
    // No user id: the per-user bucket does not apply.
    assert_eq!(statuses(addr, "/", 5).await, (5, 0));
    let metrics = admin(&running, "/metrics").await.body;
    assert!(metrics.contains("spillway_subjects{service=\"api\",bucket=\"per-user\"} 2"));
    assert!(!metrics.contains("alice"), "subjects never become labels");
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_bucket_forwards_everything_and_metrics_show_virtual_drops() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &config(&["{ name: trial, limit: 2/h, algorithm: fixed-window, mode: shadow }"]),
        &upstream.url(),
    )
    .await;
    assert_eq!(statuses(running.proxy.addr(), "/", 6).await, (6, 0));
    assert_eq!(upstream.seen(), 6);
    let metrics = admin(&running, "/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    for line in [
        "spillway_requests_total{service=\"api\",bucket=\"trial\",decision=\"allowed\",criticality=\"critical\"} 2",
        "spillway_requests_total{service=\"api\",bucket=\"trial\",decision=\"shadow_dropped\",criticality=\"critical\"} 4",
        "spillway_requests_total{service=\"api\",bucket=\"trial\",decision=\"dropped\",criticality=\"critical\"} 0",
        "spillway_rules_version 1",
        "spillway_control_plane_connected 0",
    ] {
        assert!(
            metrics.body.contains(line),
            "missing {line:?} in\n{}",
            metrics.body
        );
    }
    assert_eq!(admin(&running, "/healthz").await.status, StatusCode::OK);
    assert_eq!(admin(&running, "/readyz").await.status, StatusCode::OK);
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_is_tried_in_shadow_beside_the_limit_in_force() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &config(&[
            "{ name: quota, limit: 5/h, algorithm: fixed-window, candidate: { limit: 2/h, since: 2026-12-03T07:00:00Z } }",
        ]),
        &upstream.url(),
    )
    .await;
    // The limit in force decides: 5 of 8 pass, whatever the candidate says.
    assert_eq!(statuses(running.proxy.addr(), "/", 8).await, (5, 3));
    assert_eq!(upstream.seen(), 5);
    let drop = get(running.proxy.addr(), "/", &[]).await;
    assert_eq!(drop.header("x-spillway-bucket"), Some("quota"));
    let metrics = admin(&running, "/metrics").await.body;
    // The candidate saw all nine and would have dropped all but two; it is the bucket's
    // `candidate_dropped`, never a bucket of its own.
    for line in [
        "spillway_requests_total{service=\"api\",bucket=\"quota\",decision=\"allowed\",criticality=\"critical\"} 5",
        "spillway_requests_total{service=\"api\",bucket=\"quota\",decision=\"dropped\",criticality=\"critical\"} 4",
        "spillway_requests_total{service=\"api\",bucket=\"quota\",decision=\"candidate_dropped\",criticality=\"critical\"} 7",
        "spillway_bucket_limit_rps{service=\"api\",bucket=\"quota\"}",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    assert!(!metrics.contains("~candidate"), "{metrics}");
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_ratio_buckets_follow_instructions_and_admit_without_one() {
    let upstream = Upstream::start().await;
    let running = proxy(
        &config(&["{ name: global, limit: 100/s }"]),
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    // Standalone, no instruction: fail-open.
    assert_eq!(statuses(addr, "/", 10).await, (10, 0));
    let client = running.proxy.client();
    client
        .set_drop_ratio("api", "global", Ratio::ONE, Duration::from_secs(60))
        .unwrap();
    assert_eq!(statuses(addr, "/", 10).await, (0, 10));
    let metrics = admin(&running, "/metrics").await.body;
    assert!(metrics.contains("spillway_drop_ratio{service=\"api\",bucket=\"global\"} 1"));
    client
        .set_drop_ratio("api", "global", Ratio::ZERO, Duration::from_secs(60))
        .unwrap();
    assert_eq!(statuses(addr, "/", 10).await, (10, 0));
    running.proxy.shutdown().await;
}

/// Log lines, as the proxy writes them, into a buffer the test reads.
#[derive(Clone, Default)]
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn contain(&self, text: &str) -> bool {
        String::from_utf8_lossy(&self.0.lock().unwrap()).contains(text)
    }
}

/// Waits until `done` holds, looking every 20 ms for at most 10 s; whether it came to hold.
async fn until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// The file watcher reloads a good edit (the new limit is in force) and refuses a broken one:
/// the refusal is waited for in the proxy's log, so the rules are seen to stay only after the
/// watcher has read the broken file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_the_file_changes_behaviour_and_a_broken_edit_changes_nothing() {
    let lines = Lines::default();
    let writer = lines.clone();
    // Global: the watcher's task runs on any of the runtime's threads.
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish(),
    )
    .expect("this test's process has no other subscriber");
    let upstream = Upstream::start().await;
    let bucket = |limit: &str| {
        config(&[&format!(
            "{{ name: b, limit: {limit}, algorithm: token-bucket }}"
        )])
    };
    let running = proxy(&bucket("1/h"), &upstream.url()).await;
    let addr = running.proxy.addr();
    let version = || running.proxy.client().rules().version();
    assert_eq!(statuses(addr, "/", 2).await, (1, 1));

    std::fs::write(&running.config, bucket("4/h")).unwrap();
    assert!(until(|| version() == 2).await, "the edit was not picked up");
    assert_eq!(statuses(addr, "/", 5).await, (4, 1));

    std::fs::write(
        &running.config,
        bucket("100/h").replace("limit:", "limit: ["),
    )
    .unwrap();
    assert!(
        until(|| lines.contain("the file was not applied")).await,
        "the watcher never refused the broken file"
    );
    assert_eq!(version(), 2, "a broken file replaced the rules");
    assert_eq!(statuses(addr, "/", 1).await, (0, 1));
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_upstream_gives_502_not_429() {
    killed_upstream_gives_502(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_give_502_for_a_killed_upstream() {
    killed_upstream_gives_502(2).await;
}

async fn killed_upstream_gives_502(workers: usize) {
    let upstream = Upstream::start().await;
    let running = proxy_on(&config(&[UNHIT]), &upstream.url(), workers).await;
    let addr = running.proxy.addr();
    assert_eq!(get(addr, "/", &[]).await.status, StatusCode::OK);
    upstream.kill().await;
    let answer = get(addr, "/", &[]).await;
    assert_eq!(answer.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["status"], 502);
    assert!(answer.header("x-spillway-bucket").is_none());
    let metrics = admin(&running, "/metrics").await.body;
    assert!(
        metrics.contains("spillway_upstream_errors_total 1"),
        "{metrics}"
    );
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_h2c_passes_through_then_gets_resource_exhausted() {
    grpc_passes_then_is_exhausted(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_pass_grpc_over_h2c_with_trailers() {
    grpc_passes_then_is_exhausted(2).await;
}

async fn grpc_passes_then_is_exhausted(workers: usize) {
    let upstream = Upstream::start().await;
    let running = proxy_on(
        &config(&[
            "{ name: charge, match: { procedure: /payments.v1.Payments/Charge }, limit: 1/h, algorithm: token-bucket }",
        ]),
        &upstream.url(),
        workers,
    )
    .await;
    let addr = running.proxy.addr();
    let method = "/payments.v1.Payments/Charge";
    let first = grpc_call(addr, method, b"hello").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        &first.body.as_bytes()[5..],
        b"hello",
        "the message came back"
    );
    let trailers = first
        .trailers
        .expect("the upstream's trailers arrive intact");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    assert_eq!(trailers.get("grpc-message").unwrap(), "echoed");

    let second = grpc_call(addr, method, b"again").await;
    assert_eq!(
        second.status,
        StatusCode::OK,
        "gRPC errors travel as HTTP 200"
    );
    assert_eq!(second.header("grpc-status"), Some("8"));
    assert!(second.header("grpc-message").unwrap().contains("charge"));
    assert_eq!(second.header("x-spillway-bucket"), Some("charge"));
    assert!(second.body.is_empty(), "trailers-only: no message");
    assert_eq!(upstream.seen(), 1);
    running.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight() {
    drains_requests_in_flight(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_drain_requests_in_flight() {
    drains_requests_in_flight(2).await;
}

async fn drains_requests_in_flight(workers: usize) {
    let mut upstream = Upstream::start().await;
    let running = proxy_on(&config(&[UNHIT]), &upstream.url(), workers).await;
    let addr = running.proxy.addr();
    let in_flight = tokio::spawn(async move { get(addr, "/slow", &[]).await });
    // The request has reached the upstream, which holds it.
    upstream.arrived.recv().await.unwrap();
    let shutdown = tokio::spawn(running.proxy.shutdown());
    // New connections are refused once the listener has closed (bounded: 100 tries).
    let mut refused = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "the proxy kept accepting after shutdown began");
    assert!(
        !shutdown.is_finished(),
        "shutdown returned with a request in flight"
    );
    upstream.release.notify_one();
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, "upstream saw /slow");
    shutdown.await.unwrap();
}

/// An upstream that answers one request per connection and then closes it without saying so
/// (as one does whose keep-alive timeout passed): the upstream connection a downstream
/// connection keeps between its requests is closed under it, and the next request goes out on a
/// new one instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_connection_closed_between_requests_is_replaced() {
    use tokio::io::AsyncWriteExt;
    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let (upstream, _, serving) = serve_raw(move |mut stream| {
        let closed_tx = closed_tx.clone();
        async move {
            read_request(&mut stream).await;
            let _ = stream.write_all(OK_ANSWER).await;
            drop(stream);
            let _ = closed_tx.send(());
        }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut sender = h1_client(running.proxy.addr()).await;
    for _ in 0..3 {
        let (status, body) = exchange(&mut sender, http::Method::GET, "/", "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"ok");
        // The upstream has closed that connection before the next request is sent.
        closed.recv().await.unwrap();
    }
    running.proxy.shutdown().await;
    serving.abort();
}

/// A downstream connection's requests all go over one upstream connection, whatever their
/// answers' bodies: one larger than the socket buffers (relayed in many reads), a chunked one,
/// the bodiless answers to a `HEAD` and a 204, and a plain one. Each body arrives whole, and the
/// upstream connection is handed on to the next request after each of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_connection_keeps_one_upstream_connection_across_every_kind_of_body() {
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncWriteExt;

    const BIG: usize = 1 << 20;
    let (upstream, connections, serving) = serve_raw(|mut stream| async move {
                    while let Some(head) = read_request(&mut stream).await {
                        let answer: Vec<u8> = match head.lines().next().unwrap_or_default() {
                            "get /big http/1.1" => {
                                let mut answer =
                                    format!("HTTP/1.1 200 OK\r\ncontent-length: {BIG}\r\n\r\n")
                                        .into_bytes();
                                answer.resize(answer.len() + BIG, b'x');
                                answer
                            }
                            "get /chunked http/1.1" => b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n".to_vec(),
                            "head / http/1.1" => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n".to_vec(),
                            "get /none http/1.1" => b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
                            _ => OK_ANSWER.to_vec(),
                        };
                        if stream.write_all(&answer).await.is_err() {
                            return;
                        }
                    }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut sender = h1_client(running.proxy.addr()).await;
    for _ in 0..2 {
        for (method, path, status, body) in [
            (http::Method::GET, "/big", StatusCode::OK, vec![b'x'; BIG]),
            (
                http::Method::GET,
                "/chunked",
                StatusCode::OK,
                b"hello world".to_vec(),
            ),
            (http::Method::HEAD, "/", StatusCode::OK, Vec::new()),
            (
                http::Method::GET,
                "/none",
                StatusCode::NO_CONTENT,
                Vec::new(),
            ),
            (http::Method::GET, "/", StatusCode::OK, b"ok".to_vec()),
        ] {
            let (got_status, got) = exchange(&mut sender, method, path, "").await;
            assert_eq!(got_status, status, "{path}");
            assert!(
                got[..] == body[..],
                "{path}: {} bytes, not {}",
                got.len(),
                body.len()
            );
        }
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    running.proxy.shutdown().await;
    serving.abort();
}

/// A client that goes away in the middle of an answer takes the upstream connection with it: the
/// rest of that answer would be unread, so the connection cannot serve another request, and it is
/// closed, not leaked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_answer_closes_its_upstream_connection() {
    use tokio::io::AsyncWriteExt;

    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let (upstream, _, serving) = serve_raw(move |mut stream| {
        let closed_tx = closed_tx.clone();
        async move {
            read_request(&mut stream).await;
            // An answer far larger than the socket buffers, written until the proxy hangs up.
            let length = 1u64 << 32;
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n\r\n");
            let chunk = vec![b'x'; 64 * 1024];
            let mut written = 0u64;
            if stream.write_all(head.as_bytes()).await.is_ok() {
                while written < length && stream.write_all(&chunk).await.is_ok() {
                    written += chunk.len() as u64;
                }
            }
            let _ = closed_tx.send(written);
        }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut client = raw_request(
        running.proxy.addr(),
        b"GET /big HTTP/1.1\r\nhost: app\r\n\r\n",
    )
    .await;
    assert!(next_read(&mut client).await.starts_with("HTTP/1.1 200 OK"));
    drop(client);
    let written = tokio::time::timeout(Duration::from_secs(10), closed.recv())
        .await
        .expect("the upstream connection stayed open after its client left")
        .unwrap();
    assert!(
        written < 1u64 << 32,
        "the whole answer was read: {written} bytes"
    );
    running.proxy.shutdown().await;
    serving.abort();
}

/// An upstream that closes a kept connection while its client sits idle gets the connection
/// closed back at once: the proxy does not hold it half-closed until the client's next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_closing_an_idle_connection_is_answered_with_a_close() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let (upstream, _, serving) = serve_raw(move |mut stream| {
        let closed_tx = closed_tx.clone();
        async move {
            read_request(&mut stream).await;
            stream.write_all(OK_ANSWER).await.unwrap();
            // Its keep-alive timeout: it closes its side, then waits for the proxy to close.
            tokio::time::sleep(Duration::from_millis(100)).await;
            stream.shutdown().await.unwrap();
            let mut rest = Vec::new();
            let _ = closed_tx.send(stream.read_to_end(&mut rest).await.map(|_| rest.len()));
        }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut sender = h1_client(running.proxy.addr()).await;
    let (status, _) = exchange(&mut sender, http::Method::GET, "/", "").await;
    assert_eq!(status, StatusCode::OK);
    // The client stays connected and idle while the upstream closes.
    let read = tokio::time::timeout(Duration::from_secs(5), closed.recv())
        .await
        .expect("the proxy held the closed upstream connection open while its client was idle")
        .unwrap();
    assert_eq!(
        read.unwrap(),
        0,
        "the proxy sent bytes on a closed connection"
    );
    assert!(
        !sender.is_closed(),
        "the client's own connection was closed"
    );
    running.proxy.shutdown().await;
    serving.abort();
}

/// An upstream that answers the first request of each connection and closes the connection when
/// the second one arrives, unanswered: the race of a keep-alive timeout running out just as the
/// proxy reuses the connection. A bodiless GET is sent again on a new connection and answered;
/// a POST with a body may not be sent twice, so it gets the 502, and the upstream saw it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_upstream_closed_on_arrival_is_resent_only_when_idempotent() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncWriteExt;

    let posts = Arc::new(AtomicUsize::new(0));
    let (upstream, connections, serving) = serve_raw({
        let posts = posts.clone();
        move |mut stream| {
            let posts = posts.clone();
            async move {
                for answered in [true, false] {
                    let Some(head) = read_request(&mut stream).await else {
                        return;
                    };
                    if head.starts_with("post") {
                        posts.fetch_add(1, Ordering::SeqCst);
                    }
                    if answered {
                        let _ = stream.write_all(OK_ANSWER).await;
                    }
                }
                // The second request is read and the connection closed, unanswered.
            }
        }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut sender = h1_client(running.proxy.addr()).await;
    let mut send = async |method: http::Method, body: &'static str| {
        exchange(&mut sender, method, "/", body).await.0
    };
    // The first GET opens the upstream connection; each later one finds it closed on arrival.
    for _ in 0..3 {
        assert_eq!(send(http::Method::GET, "").await, StatusCode::OK);
    }
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    assert_eq!(
        send(http::Method::POST, "charge").await,
        StatusCode::BAD_GATEWAY
    );
    assert_eq!(posts.load(Ordering::SeqCst), 1, "a POST was sent twice");
    running.proxy.shutdown().await;
    serving.abort();
}

/// For the raw upstreams below: reads one request head (and a body of `content-length`), or `None` at the end.
async fn read_request(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut data = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if data.len() >= end + 4 + length {
                return Some(head);
            }
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    }
}

/// An upstream that reads each request whole and then answers it after `delay` (`None`: never),
/// holding the connection open; returns its address.
async fn raw_upstream(delay: Option<Duration>) -> std::net::SocketAddr {
    use tokio::io::AsyncWriteExt;
    let (addr, _, _) = serve_raw(move |mut stream| async move {
        while read_request(&mut stream).await.is_some() {
            let Some(delay) = delay else {
                // Never answered: keep the connection open until the test ends.
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            };
            tokio::time::sleep(delay).await;
            if stream.write_all(OK_ANSWER).await.is_err() {
                return;
            }
        }
    })
    .await;
    addr
}

/// A raw upstream on 127.0.0.1 that runs `serve` on each connection it accepts, each on a task
/// of its own. Returns its address, how many connections it has accepted, and its accept loop,
/// to abort at the end.
async fn serve_raw<F, Fut>(
    serve: F,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
)
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let accepted = connections.clone();
    let serving = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(serve(stream));
        }
    });
    (addr, connections, serving)
}

/// Sends `method path` (host `app`) with `body` over `sender`, and returns the answer's status
/// and whole body.
async fn exchange(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>,
    method: http::Method,
    path: &str,
    body: &'static str,
) -> (StatusCode, bytes::Bytes) {
    sender.ready().await.unwrap();
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "app")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            body.as_bytes(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, body)
}

/// An upstream that keeps a whole request unanswered past the upstream timeout: the client gets
/// a 504 problem document (not a 502, not a hang), and `/metrics` counts an upstream error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_holding_a_whole_request_past_the_timeout_gives_504() {
    let upstream = raw_upstream(None).await;
    let running = proxy_with(
        &config(&[UNHIT]),
        &format!("http://{upstream}"),
        |options| options.upstream_timeout = Some(Duration::from_millis(300)),
    )
    .await;
    let started = std::time::Instant::now();
    let answer = get(running.proxy.addr(), "/", &[]).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(answer.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(body["type"], "urn:spillway:problem:upstream-timeout");
    assert_eq!(body["status"], 504);
    let metrics = admin(&running, "/metrics").await;
    assert!(
        metrics.body.contains("spillway_upstream_errors_total 1"),
        "{}",
        metrics.body
    );
    running.proxy.shutdown().await;
}

/// The upstream timeout runs from the end of the request body: an upload slower than the timeout
/// is answered by the upstream, not cut off with a 504.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_slower_than_the_upstream_timeout_is_not_cut_off() {
    let answer = slow_upload(Duration::ZERO, |options| {
        options.upstream_timeout = Some(Duration::from_millis(300))
    })
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// Sends a 6-byte upload in two halves 700 ms apart through a proxy that `configure` sets up, in
/// front of an upstream that answers `upstream_delay` after it has the whole request; returns
/// what the client reads first.
async fn slow_upload(
    upstream_delay: Duration,
    configure: impl FnOnce(&mut spillway_proxy::ProxyOptions),
) -> String {
    use tokio::io::AsyncWriteExt;
    let upstream = raw_upstream(Some(upstream_delay)).await;
    let running = proxy_with(&config(&[UNHIT]), &format!("http://{upstream}"), configure).await;
    let mut client = raw_request(
        running.proxy.addr(),
        b"POST /upload HTTP/1.1\r\nhost: app\r\ncontent-length: 6\r\n\r\nabc",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    client.write_all(b"def").await.unwrap();
    let answer = next_read(&mut client).await;
    running.proxy.shutdown().await;
    answer
}

/// A client that opens a connection and never finishes its request head is disconnected after
/// the header timeout, so such clients cannot hold connections forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_request_head_is_disconnected() {
    use tokio::io::AsyncReadExt;
    let upstream = Upstream::start().await;
    let running = proxy_with(&config(&[UNHIT]), &upstream.url(), |options| {
        options.header_timeout = Duration::from_millis(300)
    })
    .await;
    // Before connecting: the proxy's clock starts once it serves the connection.
    let started = std::time::Instant::now();
    let mut client = raw_request(running.proxy.addr(), b"GET / HTTP/1.1\r\nhost: app\r\n").await;
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
        .await
        .expect("the connection was still open after 5 s");
    // Closed (end of stream), or reset: either way the connection is gone.
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(upstream.seen(), 0);
    running.proxy.shutdown().await;
}

/// Reads from `client` until the proxy closes the connection (end of stream or reset); fails the
/// test when it is still open after `within`. Returns how long that took.
async fn closed_within(client: &mut tokio::net::TcpStream, within: Duration) -> Duration {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let read = tokio::time::timeout_at((started + within).into(), client.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("the connection was still open after {within:?}"));
        if matches!(read, Ok(0) | Err(_)) {
            return started.elapsed();
        }
    }
}

/// After an answer a kept-alive connection has the idle timeout to begin its next request, not
/// the (shorter) header timeout; once a head has begun, it is due within the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_gets_the_idle_timeout_and_a_begun_head_the_header_timeout() {
    let upstream = Upstream::start().await;
    let running = proxy_with(&config(&[UNHIT]), &upstream.url(), |options| {
        options.header_timeout = Duration::from_millis(400);
        options.idle_timeout = Duration::from_secs(3);
    })
    .await;
    const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: app\r\n\r\n";
    let mut client = raw_request(running.proxy.addr(), GET).await;
    assert!(next_read(&mut client).await.starts_with("HTTP/1.1 200"));
    // Idle for longer than the header timeout: the connection is still there.
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::io::AsyncWriteExt::write_all(&mut client, GET)
        .await
        .unwrap();
    assert!(next_read(&mut client).await.starts_with("HTTP/1.1 200"));
    // Then closed when idle for the idle timeout.
    let idle = closed_within(&mut client, Duration::from_secs(10)).await;
    assert!(
        idle >= Duration::from_millis(2900),
        "closed after {idle:?} idle"
    );

    // A head begun after an answer and never finished: closed after the header timeout, well
    // before the idle timeout.
    let mut client = raw_request(running.proxy.addr(), GET).await;
    assert!(next_read(&mut client).await.starts_with("HTTP/1.1 200"));
    tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\nhost: app\r\n")
        .await
        .unwrap();
    let heading = closed_within(&mut client, Duration::from_secs(10)).await;
    assert!(
        heading >= Duration::from_millis(400) && heading < Duration::from_millis(2500),
        "closed {heading:?} after the head began"
    );
    assert_eq!(upstream.seen(), 3);
    running.proxy.shutdown().await;
}

/// Neither timeout runs while a request is being answered: an upload and an upstream answer,
/// each slower than both, go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_or_answer_is_not_cut_by_the_header_or_idle_timeout() {
    let answer = slow_upload(Duration::from_millis(800), |options| {
        options.header_timeout = Duration::from_millis(200);
        options.idle_timeout = Duration::from_millis(300);
    })
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// An HTTP/2 connection has no header timeout: one opened ahead of its first call (as gRPC
/// channels are) and left idle between calls for longer than the header timeout, but less than
/// the idle timeout, stays open for them (`tests/bounds.rs` shows it closed past the idle one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_idle_past_the_header_timeout_stays_open() {
    let upstream = Upstream::start().await;
    let running = proxy_with(&config(&[UNHIT]), &upstream.url(), |options| {
        options.header_timeout = Duration::from_millis(200);
        options.idle_timeout = Duration::from_secs(3);
    })
    .await;
    let stream = tokio::net::TcpStream::connect(running.proxy.addr())
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(!connection.is_finished(), "the proxy closed the connection");
        let request = http::Request::get(format!("http://{}/", running.proxy.addr()))
            .version(http::Version::HTTP_2)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    running.proxy.shutdown().await;
}

/// A raw client connection to `addr` with `request` written on it: for requests spelled out
/// byte by byte, and sent in parts.
async fn raw_request(addr: std::net::SocketAddr, request: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    client.write_all(request).await.unwrap();
    client
}

/// What the proxy sends next on `client` (one read, at most 64 KiB), as text; fails the test
/// when nothing comes within 5 s.
async fn next_read(client: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
        .await
        .expect("nothing from the proxy within 5 s")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// One HTTP/1.1 client connection to `addr`, its requests sent in turn.
async fn h1_client(
    addr: std::net::SocketAddr,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}

/// Request bodies go upstream framed as they came: one with a `content-length` keeps it, a
/// chunked one goes chunked (its own `transfer-encoding` dropped as hop-by-hop and written anew),
/// and each arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_go_upstream_whole_with_their_framing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let (upstream, _, serving) = serve_raw(move |mut stream| {
        let seen_tx = seen_tx.clone();
        async move {
            // Reads until a request's end: its length, or the last chunk.
            let mut data = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let text = String::from_utf8_lossy(&data).to_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let length: Option<usize> = text[..end]
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap());
                    let whole = match length {
                        Some(length) => data.len() >= end + 4 + length,
                        None => text[end..].ends_with("\r\n0\r\n\r\n"),
                    };
                    if whole {
                        let _ = seen_tx.send(String::from_utf8_lossy(&data).into_owned());
                        data.clear();
                        if stream.write_all(OK_ANSWER).await.is_err() {
                            return;
                        }
                        continue;
                    }
                }
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => data.extend_from_slice(&buf[..n]),
                }
            }
        }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut client = raw_request(
        running.proxy.addr(),
        b"POST /one HTTP/1.1\r\nhost: app\r\ncontent-length: 5\r\n\r\nhello",
    )
    .await;
    let request = seen.recv().await.unwrap();
    assert!(request.starts_with("POST /one HTTP/1.1\r\n"), "{request}");
    assert!(request.contains("content-length: 5\r\n"), "{request}");
    assert!(request.ends_with("\r\n\r\nhello"), "{request}");
    assert!(next_read(&mut client).await.starts_with("HTTP/1.1 200"));
    client
        .write_all(
            b"POST /two HTTP/1.1\r\nhost: app\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
    let request = seen.recv().await.unwrap();
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("POST /two HTTP/1.1\r\n"), "{request}");
    assert!(head.contains("transfer-encoding: chunked"), "{request}");
    assert!(!head.contains("content-length"), "{request}");
    // The chunks may be cut differently; their data is the same.
    let mut data = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        if size == 0 {
            break;
        }
        data.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    assert_eq!(data, "abcdefg");
    assert!(next_read(&mut client).await.starts_with("HTTP/1.1 200"));
    running.proxy.shutdown().await;
    serving.abort();
}

/// An upstream that answers an upload before reading it (a 413 for a body too large) has its
/// answer relayed while the client is still sending (not a 502, not a wait for a body that is
/// not coming), and its connection is closed afterwards, since the rest of the body was never
/// sent on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_comes_before_the_whole_upload_is_relayed_and_its_connection_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let (upstream, _, serving) = serve_raw(move |mut stream| {
        let closed_tx = closed_tx.clone();
        async move {
            // Answers as soon as the head is in, then reads (and drops) whatever else comes
            // until the proxy closes the connection.
            let mut buf = vec![0u8; 64 * 1024];
            let mut head = Vec::new();
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream
                .write_all(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 3\r\n\r\nbig")
                .await;
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    let _ = closed_tx.send(());
                    return;
                }
            }
        }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    // Announces a body and sends only its first half; the rest would come after the answer.
    let mut client = raw_request(
        running.proxy.addr(),
        b"POST /upload HTTP/1.1\r\nhost: app\r\ncontent-length: 20\r\n\r\n0123456789",
    )
    .await;
    let text = next_read(&mut client).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.ends_with("\r\n\r\nbig"), "{text}");
    tokio::time::timeout(Duration::from_secs(5), closed.recv())
        .await
        .expect("the upstream connection was kept after an answer to a half-sent body");
    running.proxy.shutdown().await;
    serving.abort();
}

/// What an upstream may answer besides a plain length: an interim `100 Continue` before the
/// answer (skipped), an HTTP/1.0 body that runs to the close (relayed whole; the next request
/// opens a new connection), and more bytes than it announced (the announced ones relayed, the
/// connection not reused). What it may not: conflicting lengths, a malformed status
/// line, a protocol switch, a head that never ends within the limit: each is a 502 with a
/// problem document, counted as an upstream error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_answers_are_framed_by_the_rfc_and_malformed_ones_give_502() {
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncWriteExt;

    let (upstream, connections, serving) = serve_raw(|mut stream| async move {
        while let Some(head) = read_request(&mut stream).await {
            let answer: Vec<u8> = match head.lines().next().unwrap_or_default() {
                "get /interim http/1.1" => {
                    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                        .to_vec()
                }
                "get /to-close http/1.1" => {
                    let _ = stream
                        .write_all(b"HTTP/1.0 200 OK\r\n\r\nread until the close")
                        .await;
                    return;
                }
                "get /extra http/1.1" => {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokUNASKED".to_vec()
                }
                "get /two-lengths http/1.1" => {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nok".to_vec()
                }
                "get /garbage http/1.1" => b"HTTP/1.1 2OO OK\r\n\r\n".to_vec(),
                "get /switch http/1.1" => {
                    b"HTTP/1.1 101 Switching Protocols\r\nupgrade: other\r\n\r\n".to_vec()
                }
                "get /endless http/1.1" => {
                    let mut answer = b"HTTP/1.1 200 OK\r\nx-long: ".to_vec();
                    answer.resize(200 * 1024, b'a');
                    answer
                }
                _ => OK_ANSWER.to_vec(),
            };
            if stream.write_all(&answer).await.is_err() {
                return;
            }
        }
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut sender = h1_client(running.proxy.addr()).await;
    let (status, body) = exchange(&mut sender, http::Method::GET, "/interim", "").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    let (status, body) = exchange(&mut sender, http::Method::GET, "/to-close", "").await;
    assert_eq!(
        (status, &body[..]),
        (StatusCode::OK, &b"read until the close"[..])
    );
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    let (status, body) = exchange(&mut sender, http::Method::GET, "/", "").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    // Bytes past the announced length: the answer is relayed as announced, and a connection
    // whose upstream sent more than it said is not trusted with the next request.
    let (status, body) = exchange(&mut sender, http::Method::GET, "/extra", "").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    let (status, body) = exchange(&mut sender, http::Method::GET, "/", "").await;
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    for (n, path) in ["/two-lengths", "/garbage", "/switch", "/endless"]
        .into_iter()
        .enumerate()
    {
        let (status, body) = exchange(&mut sender, http::Method::GET, path, "").await;
        assert_eq!(status, StatusCode::BAD_GATEWAY, "{path}");
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["status"], 502, "{path}");
        let metrics = admin(&running, "/metrics").await;
        let counted = format!("spillway_upstream_errors_total {}", n + 1);
        assert!(metrics.body.contains(&counted), "{path}: {}", metrics.body);
    }
    // A connection that carried a malformed answer is not used again: each of the four went
    // over a new one.
    assert_eq!(connections.load(Ordering::SeqCst), 6);
    running.proxy.shutdown().await;
    serving.abort();
}

/// An answer whose body ends before it says it does is not passed off as whole, and does not
/// hang: a chunked answer cut off before its last chunk ends the client's connection without
/// the last chunk, so the client can tell it was cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_answer_is_not_passed_off_as_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (upstream, _, serving) = serve_raw(|mut stream| async move {
        read_request(&mut stream).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            .await;
    })
    .await;
    let running = proxy(&config(&[UNHIT]), &format!("http://{upstream}")).await;
    let mut client =
        raw_request(running.proxy.addr(), b"GET / HTTP/1.1\r\nhost: app\r\n\r\n").await;
    // Reads until the connection ends, or until the last chunk arrives (a connection kept open
    // after a body taken for whole).
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 1024];
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
            if answer.ends_with(b"0\r\n\r\n") {
                return;
            }
        }
    })
    .await;
    // The head and the chunk that came may or may not have gone out before the end was seen;
    // the last chunk, which says the body is whole, never does.
    let text = String::from_utf8_lossy(&answer);
    assert!(
        !text.ends_with("0\r\n\r\n"),
        "a cut-off body was ended as whole: {text:?}"
    );
    read.expect("the client's connection stayed open after the upstream's ended");
    running.proxy.shutdown().await;
    serving.abort();
}
