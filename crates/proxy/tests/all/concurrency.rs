//! The concurrency limit in front of the upstream, black-box over real sockets: past
//! the limit a request is answered `503` (gRPC `RESOURCE_EXHAUSTED`) without reaching the
//! upstream, the metrics show the limit, the requests in flight and the refusals by tier, a
//! reload turns the limit on, and the gradient algorithm brings the limit down to what a slow
//! upstream of a few workers serves.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Upstream, admin, get, grpc_call, proxy};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use spillway_core::concurrency::Gradient;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The value of the series `series` (name and labels, as printed) in `/metrics`.
async fn metric(running: &crate::support::Running, series: &str) -> f64 {
    value(&admin(running, "/metrics").await.body, series)
}

/// The value of the series `series` in the text of one scrape, `metrics`.
fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn the_requests_tier_decides_who_is_refused_first_and_a_client_cannot_raise_its_own() {
    let mut upstream = Upstream::start().await;
    let running = proxy(
        "version: 1\nconcurrency: { algorithm: fixed, limit: 4 }\n",
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    let mut held: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { get(addr, "/slow", &[]).await }))
        .collect();
    for _ in 0..3 {
        upstream.arrived.recv().await.unwrap();
    }
    // 3 of 4 in flight: sheddable traffic is admitted only below 75% of the limit.
    let shed = get(addr, "/prefetch", &[("rpc-criticality", "sheddable")]).await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = serde_json::from_str(&shed.body).unwrap();
    assert_eq!(body["criticality"], "sheddable");
    // The last place goes to a critical request.
    held.push(tokio::spawn(async move { get(addr, "/slow", &[]).await }));
    upstream.arrived.recv().await.unwrap();
    // A client that names itself critical_plus is counted as critical: it may lower its tier,
    // never raise it (identity.criticality_trusted is false).
    let raised = get(addr, "/checkout", &[("rpc-criticality", "CRITICAL_PLUS")]).await;
    assert_eq!(raised.status, StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = serde_json::from_str(&raised.body).unwrap();
    assert_eq!(body["criticality"], "critical");
    for (tier, n) in [
        ("sheddable", 1.0),
        ("critical", 1.0),
        ("critical_plus", 0.0),
    ] {
        assert_eq!(
            metric(
                &running,
                &format!("spillway_concurrency_rejected_total{{criticality=\"{tier}\"}}")
            )
            .await,
            n,
            "{tier}"
        );
    }
    for _ in 0..4 {
        upstream.release.notify_one();
    }
    for request in held {
        assert_eq!(request.await.unwrap().status, StatusCode::OK);
    }
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn concurrency_past_a_fixed_limit_is_503_and_never_reaches_the_upstream() {
    let mut upstream = Upstream::start().await;
    let running = proxy(
        "version: 1\nconcurrency: { algorithm: fixed, limit: 2 }\n",
        &upstream.url(),
    )
    .await;
    let addr = running.proxy.addr();
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "/slow", &[]).await }))
        .collect();
    for _ in 0..2 {
        upstream.arrived.recv().await.unwrap();
    }
    assert_eq!(metric(&running, "spillway_concurrency_inflight").await, 2.0);

    let refused = get(addr, "/other", &[]).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["type"], "urn:spillway:problem:overloaded");
    assert_eq!(body["status"], 503);
    assert_eq!(body["limit"], 2);
    assert_eq!(body["criticality"], "critical");

    let grpc = grpc_call(addr, "/echo.v1.Echo/Say", b"hi").await;
    assert_eq!(grpc.status, StatusCode::OK);
    assert_eq!(grpc.header("grpc-status"), Some("8"));
    assert_eq!(grpc.header("retry-after"), Some("1"));
    // Only the two held requests reached the upstream.
    assert_eq!(upstream.seen(), 2);
    assert_eq!(metric(&running, "spillway_concurrency_limit").await, 2.0);
    assert_eq!(
        metric(
            &running,
            "spillway_concurrency_rejected_total{criticality=\"critical\"}"
        )
        .await,
        2.0
    );
    assert_eq!(
        metric(
            &running,
            "spillway_concurrency_rejected_total{criticality=\"sheddable\"}"
        )
        .await,
        0.0
    );

    // The places come back when the upstream answers.
    upstream.release.notify_one();
    upstream.release.notify_one();
    for request in held {
        assert_eq!(request.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(metric(&running, "spillway_concurrency_inflight").await, 0.0);
    assert_eq!(get(addr, "/after", &[]).await.status, StatusCode::OK);
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn concurrency_without_a_section_limits_nothing_until_a_reload_adds_one() {
    let mut upstream = Upstream::start().await;
    let running = proxy("version: 1\n", &upstream.url()).await;
    let addr = running.proxy.addr();
    let held: Vec<_> = (0..5)
        .map(|_| tokio::spawn(async move { get(addr, "/slow", &[]).await }))
        .collect();
    for _ in 0..5 {
        upstream.arrived.recv().await.unwrap();
    }
    assert_eq!(metric(&running, "spillway_concurrency_limit").await, 0.0);
    assert_eq!(get(addr, "/other", &[]).await.status, StatusCode::OK);

    // A limit of 1, added by a reload, holds once the requests in flight before it are done.
    for _ in 0..5 {
        upstream.release.notify_one();
    }
    for request in held {
        assert_eq!(request.await.unwrap().status, StatusCode::OK);
    }
    std::fs::write(
        &running.config,
        "version: 1\nconcurrency: { algorithm: fixed, limit: 1 }\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&running, "spillway_concurrency_limit").await != 1.0 {
        assert!(Instant::now() < deadline, "the reload never set the limit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let one = tokio::spawn(async move { get(addr, "/slow", &[]).await });
    upstream.arrived.recv().await.unwrap();
    assert_eq!(
        get(addr, "/other", &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    upstream.release.notify_one();
    assert_eq!(one.await.unwrap().status, StatusCode::OK);
    running.proxy.shutdown().await;
}

/// The header in which [`slow_upstream`] says how long it held a request, waiting for a worker
/// and served, in microseconds.
const UPSTREAM_US: &str = "x-upstream-us";

/// An upstream of `workers` workers that each take `service` per request: past them, requests
/// wait for a worker, so latency grows with the requests in flight. Each answer says how long
/// the request was held ([`UPSTREAM_US`]).
async fn slow_upstream(workers: usize, service: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pool = Arc::new(Semaphore::new(workers));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let pool = pool.clone();
            let service = service_fn(move |_: Request<Incoming>| {
                let pool = pool.clone();
                async move {
                    let arrived = Instant::now();
                    let _worker = pool.acquire().await.unwrap();
                    tokio::time::sleep(service).await;
                    let mut response = Response::new(Full::new(Bytes::from_static(b"done")));
                    let took = arrived.elapsed().as_micros().to_string();
                    response
                        .headers_mut()
                        .insert(UPSTREAM_US, took.parse().unwrap());
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_gradient_brings_the_limit_down_to_a_slow_upstreams_workers() {
    // 4 workers of 20 ms serve 200 requests a second; 48 clients in a closed loop keep 48 in
    // flight without a limit, each waiting 240 ms. The gradient limit starts at 40.
    const WORKERS: f64 = 4.0;
    const SERVICE: Duration = Duration::from_millis(20);
    let upstream = slow_upstream(WORKERS as usize, SERVICE).await;
    let running = proxy(
        "version: 1\nconcurrency: { algorithm: gradient, initial_limit: 40 }\n",
        &format!("http://{upstream}"),
    )
    .await;
    let addr = running.proxy.addr();
    let stop = Instant::now() + Duration::from_secs(6);
    let clients: Vec<_> = (0..48)
        .map(|_| {
            tokio::spawn(async move {
                let (mut ok, mut refused, mut overhead) = (0u32, 0u32, Duration::ZERO);
                while Instant::now() < stop {
                    let sent = Instant::now();
                    let answer = get(addr, "/work", &[]).await;
                    match answer.status {
                        StatusCode::OK => {
                            ok += 1;
                            // The round trip beyond what the upstream held the request.
                            let held = answer.header(UPSTREAM_US).unwrap().parse().unwrap();
                            overhead += sent.elapsed().saturating_sub(Duration::from_micros(held));
                        }
                        StatusCode::SERVICE_UNAVAILABLE => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        other => panic!("unexpected {other}"),
                    }
                }
                (ok, refused, overhead)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Both from one scrape: read apart, the limit may move between them.
    let metrics = admin(&running, "/metrics").await.body;
    let limit = value(&metrics, "spillway_concurrency_limit");
    let inflight = value(&metrics, "spillway_concurrency_inflight");
    let (mut ok, mut refused, mut overhead) = (0, 0, Duration::ZERO);
    for client in clients {
        let (o, r, d) = client.await.unwrap();
        ok += o;
        refused += r;
        overhead += d;
    }
    // Gradient's fixed point against `W` busy workers of service time `S` is `TOLERANCE x W x
    // long / S + QUEUE` (1.5 and 4), where `long` is the round trip the proxy measures
    // unqueued: `S` plus what the path adds, here a connection per request through a debug
    // build. That addition is at most
    // what the clients measured beyond the upstream's own time (their path holds the proxy's),
    // so the limit must settle at or under the fixed point for it: 10 with nothing added, more
    // on a machine slow enough to add a share of the 20 ms, never less strict than 16.
    let added = overhead.as_secs_f64() / f64::from(ok.max(1));
    let fixed_point = Gradient::TOLERANCE * WORKERS * (SERVICE.as_secs_f64() + added)
        / SERVICE.as_secs_f64()
        + Gradient::QUEUE;
    let most = (fixed_point + 2.0).max(16.0);
    assert!(
        (4.0..=most).contains(&limit),
        "limit {limit} after 5 s (in flight {inflight}), over {most:.1}: the fixed point is \
         {fixed_point:.1} with {:.1} ms added to the upstream's 20",
        added * 1e3
    );
    assert!(
        most < 40.0,
        "{:.1} ms added to every round trip: too slow a machine to tell the limit came down",
        added * 1e3
    );
    // A lower limit refuses new requests and lets those admitted before finish. Within the
    // round trip of a request admitted at the limit, a probe may halve the limit (its next
    // halving waits about four round trips) and a window or two take off at most a tenth each:
    // in flight may be above the limit of the moment, not above 2.5 times it.
    assert!(
        inflight <= 2.5 * limit,
        "in flight {inflight} over 2.5 times the limit {limit}"
    );
    assert!(refused > 0, "no request was refused");
    // The upstream was kept busy: at least half its 200 a second over the 6 s (on a loaded
    // machine, with a connection per request through a debug build; the benchmark measures
    // goodput properly).
    assert!(ok >= 600, "{ok} answered in 6 s");
    running.proxy.shutdown().await;
}
