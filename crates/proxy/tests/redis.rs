//! `store: redis` buckets through the proxy, against a real redis-server: one exact count shared
//! by every proxy, and the circuit breaker's failure policies when Redis dies and comes back.

mod support;

use std::time::Duration;

use http::StatusCode;
use spillway_testkit::RedisServer;
use support::{Upstream, admin, get, proxy, statuses};

/// A configuration whose buckets count in the Redis at `url`.
fn redis_config(url: &str, buckets: &[&str]) -> String {
    let mut yaml = format!(
        "version: 1\nredis: {{ url: \"{url}\", timeout: 2s }}\nservices:\n  api:\n    buckets:\n"
    );
    for b in buckets {
        yaml.push_str("      - ");
        yaml.push_str(b);
        yaml.push('\n');
    }
    yaml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_limit_holds_across_two_proxies_sharing_one_redis() {
    let redis = RedisServer::start().expect("private redis-server");
    let upstream = Upstream::start().await;
    let yaml = redis_config(
        &redis.url(),
        &[
            "{ name: shared, match: { procedure: /exact }, limit: 10/h, algorithm: token-bucket, store: redis }",
            "{ name: per-user, match: { procedure: /mine, user: \"*\" }, limit: 3/h, algorithm: sliding-window-log, store: redis }",
        ],
    );
    let (a, b) = (
        proxy(&yaml, &upstream.url()).await,
        proxy(&yaml, &upstream.url()).await,
    );
    let (a_addr, b_addr) = (a.proxy.addr(), b.proxy.addr());
    // 10 an hour in all: alternating between the proxies, each alone would admit 10 of its 12,
    // together they admit 10 of 24.
    let mut ok = 0;
    for i in 0..24 {
        let addr = if i % 2 == 0 { a_addr } else { b_addr };
        match get(addr, "/exact", &[]).await.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok, 10);
    // Per-subject: alice's 3 are spent across both proxies; bob has his own key.
    let alice = [("x-user-id", "alice")];
    for addr in [a_addr, b_addr, a_addr] {
        assert_eq!(get(addr, "/mine", &alice).await.status, StatusCode::OK);
    }
    let refused = get(b_addr, "/mine", &alice).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("x-spillway-bucket"), Some("per-user"));
    assert_eq!(
        get(a_addr, "/mine", &[("x-user-id", "bob")]).await.status,
        StatusCode::OK
    );
    assert_eq!(upstream.seen(), 10 + 3 + 1);
    let metrics = admin(&b, "/metrics").await.body;
    assert!(metrics.contains("spillway_circuit_state 0"), "{metrics}");
    assert!(
        metrics.contains(
            "spillway_requests_total{service=\"api\",bucket=\"shared\",decision=\"dropped\"} 7"
        ),
        "proxy b dropped 7 of its 12: {metrics}"
    );
    assert!(!metrics.contains("alice"), "subjects never become labels");
    a.proxy.shutdown().await;
    b.proxy.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_opens_the_breaker_and_each_bucket_applies_its_failure_policy() {
    let mut redis = RedisServer::start().expect("private redis-server");
    let upstream = Upstream::start().await;
    let yaml = redis_config(
        &redis.url(),
        &[
            "{ name: strict, match: { procedure: /strict }, limit: 100000/s, algorithm: token-bucket, store: redis, on_store_failure: closed }",
            "{ name: lenient, match: { procedure: /lenient }, limit: 100000/s, algorithm: fixed-window, store: redis, on_store_failure: open }",
        ],
    );
    let running = proxy(&yaml, &upstream.url()).await;
    let addr = running.proxy.addr();
    assert_eq!(statuses(addr, "/strict", 3).await, (3, 0));
    assert_eq!(statuses(addr, "/lenient", 3).await, (3, 0));

    redis.kill();
    // Five failed calls open the breaker (its default threshold); each was decided by policy.
    for _ in 0..5 {
        let answer = get(addr, "/strict", &[]).await;
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.header("x-spillway-bucket"), Some("strict"));
        assert_eq!(answer.header("retry-after"), Some("1"));
    }
    let metrics = admin(&running, "/metrics").await.body;
    assert!(metrics.contains("spillway_circuit_state 2"), "{metrics}");
    assert!(
        metrics.contains("spillway_store_errors_total{kind=\"error\"} 5"),
        "{metrics}"
    );
    // Open: `closed` refuses without asking Redis, `open` lets traffic through.
    assert_eq!(statuses(addr, "/strict", 5).await, (0, 5));
    let seen = upstream.seen();
    assert_eq!(statuses(addr, "/lenient", 5).await, (5, 0));
    assert_eq!(upstream.seen(), seen + 5);

    // Redis back: the breaker probes, ramps up and closes; the strict bucket admits again.
    redis.restart().expect("redis-server restarts on its port");
    let mut admitted = 0;
    let mut closed = false;
    for i in 0..4_000 {
        match get(addr, "/strict", &[]).await.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => tokio::time::sleep(Duration::from_millis(2)).await,
            other => panic!("unexpected status {other}"),
        }
        if i % 50 == 49
            && admin(&running, "/metrics")
                .await
                .body
                .contains("spillway_circuit_state 0")
        {
            closed = true;
            break;
        }
    }
    assert!(closed, "the breaker closed again within 4,000 requests");
    assert!(admitted > 0);
    assert_eq!(statuses(addr, "/strict", 20).await, (20, 0));
    running.proxy.shutdown().await;
}
