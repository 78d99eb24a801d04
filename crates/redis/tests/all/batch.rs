//! Hot-key batching against a real redis-server: fewer calls, bounded admission.

use std::sync::Arc;
use std::time::Duration;

use spillway_core::algo::Rate;
use spillway_core::config::FailurePolicy;
use spillway_redis::{
    BatchConfig, BatchingLimiter, BreakerConfig, ExactAlgo, GuardedLimiter, RedisKey,
};
use spillway_testkit::RedisServer;

use crate::common::{command_calls, limiter, raw};

const PROXIES: u64 = 4;
const REQUESTS_PER_PROXY: u64 = 250;
const LIMIT: u64 = 600;
const N: u64 = 10;

#[tokio::test]
async fn batches_of_ten_cut_redis_calls_by_ninety_percent_within_the_bound() {
    let server = RedisServer::start().expect("private redis-server");
    // 600 tokens and a refill of one an hour: the test sees 600 tokens, no more.
    let algo = ExactAlgo::token_bucket(Rate::new(1, Duration::from_secs(3600)).unwrap(), LIMIT);
    let key = RedisKey::new("user", "hot", "/search");

    let mut tasks = Vec::new();
    for _ in 0..PROXIES {
        let proxy = Arc::new(BatchingLimiter::new(
            GuardedLimiter::new(limiter(&server.url()), BreakerConfig::default()),
            BatchConfig::fixed(N),
        ));
        // Two concurrent request streams per proxy, sharing its leases.
        for _ in 0..2 {
            let (proxy, key) = (Arc::clone(&proxy), key.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..REQUESTS_PER_PROXY / 2 {
                    let d = proxy.decide(&key, &algo, 1, FailurePolicy::Closed).await;
                    assert_eq!(d.fallback, None, "Redis decided or the lease did");
                    admitted += u64::from(d.verdict.is_allow());
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }

    let mut con = raw(&server.url()).await;
    let calls = command_calls(&mut con, "evalsha").await;
    let requests = PROXIES * REQUESTS_PER_PROXY;
    println!("{requests} requests, {calls} script calls, {admitted} admitted of {LIMIT}");
    assert!(
        calls * 10 <= requests,
        "{calls} Redis calls for {requests} requests is less than a 90% cut"
    );
    assert!(admitted <= LIMIT + N * PROXIES, "admitted {admitted}");
    // Tokens are conserved: only what proxies still hold unspent is missing.
    assert!(
        admitted <= LIMIT,
        "admitted {admitted} > the {LIMIT} tokens Redis had"
    );
    assert!(
        admitted >= LIMIT - (N - 1) * PROXIES,
        "admitted {admitted}: more than N - 1 per proxy left unspent"
    );
}

#[tokio::test]
async fn a_cold_key_is_decided_exactly_one_call_per_request() {
    let server = RedisServer::start().expect("private redis-server");
    let algo = ExactAlgo::token_bucket(Rate::new(1, Duration::from_secs(3600)).unwrap(), 5);
    let key = RedisKey::named("cold");
    let proxy = BatchingLimiter::new(
        GuardedLimiter::new(limiter(&server.url()), BreakerConfig::default()),
        BatchConfig::default(),
    );
    let mut admitted = 0;
    for _ in 0..5 {
        let d = proxy.decide(&key, &algo, 1, FailurePolicy::Closed).await;
        admitted += u64::from(d.verdict.is_allow());
        // A key seen a few times a second asks for one token at a time.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut con = raw(&server.url()).await;
    assert_eq!(admitted, 5);
    assert_eq!(command_calls(&mut con, "evalsha").await, 5);
}

#[tokio::test]
async fn concurrent_requests_on_one_proxy_share_one_call_per_batch() {
    let server = RedisServer::start().expect("private redis-server");
    let algo = ExactAlgo::token_bucket(Rate::new(1, Duration::from_secs(3600)).unwrap(), 10_000);
    let key = RedisKey::named("hot");
    let proxy = Arc::new(BatchingLimiter::new(
        GuardedLimiter::new(limiter(&server.url()), BreakerConfig::default()),
        BatchConfig::fixed(N),
    ));
    const STREAMS: u64 = 32;
    const EACH: u64 = 20;
    let mut tasks = Vec::new();
    for _ in 0..STREAMS {
        let (proxy, key) = (Arc::clone(&proxy), key.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..EACH {
                let d = proxy.decide(&key, &algo, 1, FailurePolicy::Closed).await;
                assert!(d.verdict.is_allow(), "{d:?}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut con = raw(&server.url()).await;
    let calls = command_calls(&mut con, "evalsha").await;
    // Every call brings N tokens and all but the last call's are spent: 32 streams that all
    // missed at once would have made 32 calls for their first requests alone.
    assert_eq!(calls, (STREAMS * EACH).div_ceil(N), "{calls} calls");
}

#[tokio::test]
async fn a_request_dropped_mid_call_does_not_hold_up_the_next() {
    let server = RedisServer::start().expect("private redis-server");
    let algo = ExactAlgo::token_bucket(Rate::new(1, Duration::from_secs(3600)).unwrap(), 100);
    let key = RedisKey::named("dropped");
    let proxy = BatchingLimiter::new(
        GuardedLimiter::new(limiter(&server.url()), BreakerConfig::default()),
        BatchConfig::fixed(N),
    );
    // Polled once (the call goes out), then dropped: a client that went away.
    let dropped = tokio::time::timeout(
        Duration::ZERO,
        proxy.decide(&key, &algo, 1, FailurePolicy::Closed),
    )
    .await;
    assert!(dropped.is_err(), "cancelled before Redis answered");
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        proxy.decide(&key, &algo, 1, FailurePolicy::Closed),
    )
    .await
    .expect("the next request does not wait on the dropped one's call");
    assert!(next.verdict.is_allow());
    assert_eq!(next.fallback, None);
}

#[tokio::test]
async fn a_dead_redis_leaves_batched_keys_to_the_failure_policy() {
    let mut server = RedisServer::start().expect("private redis-server");
    let url = server.url();
    server.kill();
    let algo = ExactAlgo::token_bucket(Rate::per_second(1_000).unwrap(), 1_000);
    let key = RedisKey::named("down");
    let proxy = Arc::new(BatchingLimiter::new(
        GuardedLimiter::new(limiter(&url), BreakerConfig::default()),
        BatchConfig::fixed(N),
    ));
    for (policy, allowed) in [(FailurePolicy::Closed, false), (FailurePolicy::Open, true)] {
        // Concurrent requests that wait on one failed call share its fallback.
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (proxy, key) = (Arc::clone(&proxy), key.clone());
            tasks.push(tokio::spawn(async move {
                proxy.decide(&key, &algo, 1, policy).await
            }));
        }
        for task in tasks {
            let d = task.await.unwrap();
            assert!(d.fallback.is_some(), "{d:?}");
            assert_eq!(d.verdict.is_allow(), allowed, "{policy:?}: {d:?}");
        }
    }
}
