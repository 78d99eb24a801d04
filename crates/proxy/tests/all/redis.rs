//! `store: redis` buckets through the proxy, against a real redis-server: one exact count shared
//! by every proxy, and the circuit breaker's failure policies when Redis dies and comes back.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{Upstream, admin, get, proxy, statuses};
use http::StatusCode;
use spillway_testkit::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
            "spillway_requests_total{service=\"api\",bucket=\"shared\",decision=\"dropped\",criticality=\"critical\"} 7"
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
    let metrics = admin(&running, "/metrics").await.body;
    for line in [
        "spillway_circuit_opened_total 1",
        "spillway_circuit_recovered_total 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    let probes = |result: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!(
                    "spillway_store_probes_total{{result=\"{result}\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(probes("ok") >= 1, "the prober's pings: {metrics}");
    running.proxy.shutdown().await;
}

/// Script calls the Redis at `addr` has served: `EVALSHA` and `EVAL` in `INFO commandstats`.
async fn script_calls(addr: SocketAddr) -> u64 {
    let mut con = TcpStream::connect(addr).await.unwrap();
    con.write_all(b"*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n")
        .await
        .unwrap();
    // One bulk string: `$LEN\r\n`, LEN bytes, `\r\n`.
    let mut reply = Vec::new();
    let text = loop {
        let mut chunk = [0; 4096];
        let n = con.read(&mut chunk).await.unwrap();
        assert!(n > 0, "redis closed the connection");
        reply.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&reply).into_owned();
        if let Some((head, body)) = text.split_once("\r\n") {
            let len: usize = head.trim_start_matches('$').parse().unwrap();
            if body.len() >= len {
                break body[..len].to_owned();
            }
        }
    };
    ["evalsha", "eval"]
        .iter()
        .map(|name| {
            let prefix = format!("cmdstat_{name}:calls=");
            text.lines()
                .find_map(|line| line.strip_prefix(&prefix))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse::<u64>().unwrap())
        })
        .sum()
}

const BATCH: u64 = 10;
const PROXIES: u64 = 2;
const LIMIT: u64 = 500;
const STREAMS: u64 = 8;
const EACH: u64 = 75;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batch_ten_cuts_redis_calls_by_ninety_percent_across_two_proxies_within_the_bound() {
    let redis = RedisServer::start().expect("private redis-server");
    let upstream = Upstream::start().await;
    // A per-user token bucket of 500 tokens refilled over a day: the test sees 500, and one
    // hot user spends them through two proxies, eight concurrent streams each.
    let yaml = redis_config(
        &redis.url(),
        &[
            "{ name: hot, match: { procedure: /hot, user: \"*\" }, limit: 500/d, algorithm: token-bucket, store: redis, batch: 10 }",
        ],
    );
    let proxies = [
        proxy(&yaml, &upstream.url()).await,
        proxy(&yaml, &upstream.url()).await,
    ];
    let mut tasks = Vec::new();
    for running in &proxies {
        for _ in 0..STREAMS {
            let addr = running.proxy.addr();
            tasks.push(tokio::spawn(async move {
                let alice = [("x-user-id", "alice")];
                let mut admitted = 0;
                for _ in 0..EACH {
                    match get(addr, "/hot", &alice).await.status {
                        StatusCode::OK => admitted += 1,
                        StatusCode::TOO_MANY_REQUESTS => {}
                        other => panic!("unexpected status {other}"),
                    }
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let requests = PROXIES * STREAMS * EACH;
    let calls = script_calls(redis.addr()).await;
    println!("{requests} requests, {calls} script calls, {admitted} admitted of {LIMIT}");
    assert!(
        calls * 10 <= requests,
        "{calls} Redis calls for {requests} requests is less than a 90% cut"
    );
    assert!(
        admitted <= LIMIT + BATCH * PROXIES,
        "admitted {admitted} > {LIMIT} + {BATCH} x {PROXIES}"
    );
    // Every admitted request spent a token Redis handed out; only what the proxies still hold
    // (fewer than a batch each) is left unspent.
    assert!(
        admitted <= LIMIT,
        "admitted {admitted} > the {LIMIT} tokens"
    );
    assert!(
        admitted >= LIMIT - (BATCH - 1) * PROXIES,
        "admitted {admitted}: more than a batch per proxy left unspent"
    );
    assert_eq!(upstream.seen() as u64, admitted);
    // Per-subject keys: bob has tokens of his own.
    let bob = [("x-user-id", "bob")];
    for running in &proxies {
        let answer = get(running.proxy.addr(), "/hot", &bob).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    for running in proxies {
        running.proxy.shutdown().await;
    }
}

/// A subject value longer than 256 bytes keys its Redis bucket by its SHA-256 on every proxy:
/// two proxies count one 1,000-byte user id together, under
/// `rl:{api:user:<sha256 hex>:*}:token-bucket`, and Redis never holds the value itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_subject_value_keys_redis_by_its_sha256_on_every_proxy() {
    let redis = RedisServer::start().expect("private redis-server");
    let upstream = Upstream::start().await;
    let yaml = redis_config(
        &redis.url(),
        &[
            "{ name: per-user, match: { user: \"*\" }, limit: 2/h, algorithm: token-bucket, store: redis }",
        ],
    );
    let (a, b) = (
        proxy(&yaml, &upstream.url()).await,
        proxy(&yaml, &upstream.url()).await,
    );
    let long = "u".repeat(1000);
    let user = [("x-user-id", long.as_str())];
    let mut seen = Vec::new();
    for addr in [a.proxy.addr(), b.proxy.addr(), a.proxy.addr()] {
        seen.push(get(addr, "/", &user).await.status);
    }
    assert_eq!(
        seen,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let mut hex = [0; 64];
    let key = format!(
        "rl:{{api:user:{}:*}}:token-bucket",
        spillway_client::subject_key(&long, &mut hex)
    );
    assert_eq!(key.len(), "rl:{api:user::*}:token-bucket".len() + 64);
    let mut con = TcpStream::connect(redis.addr()).await.unwrap();
    con.write_all(format!("*2\r\n$6\r\nEXISTS\r\n${}\r\n{key}\r\n", key.len()).as_bytes())
        .await
        .unwrap();
    let mut reply = [0; 16];
    let n = con.read(&mut reply).await.unwrap();
    assert_eq!(&reply[..n], b":1\r\n", "{key} in Redis");
    a.proxy.shutdown().await;
    b.proxy.shutdown().await;
}
