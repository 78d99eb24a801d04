//! Exact decisions through Sentinel while the primary is killed under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use spillway_core::algo::Rate;
use spillway_core::config::FailurePolicy;
use spillway_redis::{
    BreakerConfig, CircuitState, ExactAlgo, GuardedLimiter, RedisEndpoint, RedisKey, RedisLimiter,
    StoreOptions,
};
use spillway_testkit::{MASTER_NAME, RedisSentinelSet};

#[derive(Default)]
struct Counts {
    by_redis: AtomicU64,
    by_policy: AtomicU64,
}

#[tokio::test]
async fn decisions_continue_after_the_primary_is_killed() {
    let mut set = RedisSentinelSet::start().expect("private sentinel set");
    let limiter = RedisLimiter::new(
        RedisEndpoint::sentinel(MASTER_NAME, set.sentinel_urls()),
        StoreOptions {
            timeout: Duration::from_millis(300),
        },
    )
    .unwrap();
    let limiter = Arc::new(GuardedLimiter::new(
        limiter,
        BreakerConfig {
            failure_threshold: 3,
            ..BreakerConfig::default()
        },
    ));
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));

    let load = {
        let (limiter, counts, stop) = (limiter.clone(), counts.clone(), stop.clone());
        tokio::spawn(async move {
            let algo = ExactAlgo::token_bucket(Rate::per_second(100_000).unwrap(), 100_000);
            let key = RedisKey::new("user", "alice", "/search");
            while !stop.load(Ordering::Relaxed) {
                let d = limiter.decide(&key, &algo, 1, FailurePolicy::Open).await;
                let counter = match d.fallback {
                    None => &counts.by_redis,
                    Some(_) => &counts.by_policy,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };

    // Waits (at most 30 s) until Redis has decided `n` more requests.
    let redis_decides = |n: u64| {
        let counts = counts.clone();
        async move {
            let target = counts.by_redis.load(Ordering::Relaxed) + n;
            for _ in 0..3_000 {
                if counts.by_redis.load(Ordering::Relaxed) >= target {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        }
    };

    assert!(redis_decides(50).await, "no decisions before the failover");
    let before = limiter.breaker().stats();
    let old = set.kill_primary().expect("kill the primary");
    let new = tokio::task::spawn_blocking(move || {
        let new = set.wait_for_failover(old, Duration::from_secs(30));
        (set, new)
    });
    let (set, new) = new.await.unwrap();
    let new = new.expect("the sentinels fail over");
    assert_ne!(new, old);
    assert!(
        redis_decides(50).await,
        "decisions did not resume after the failover to {new}"
    );
    // Decisions resume in the ramp; the breaker closes about a second after its first
    // successful probe.
    for _ in 0..500 {
        if limiter.breaker().state() == CircuitState::Closed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();

    let after = limiter.breaker().stats();
    println!("before the kill: {before:?}\nafter the failover: {after:?}");
    assert_eq!(before.errors + before.timeouts, 0);
    assert!(
        after.errors + after.timeouts >= 3,
        "the breaker saw the primary go: {after:?}"
    );
    assert!(after.opened >= 1, "{after:?}");
    assert!(after.short_circuited >= 1, "{after:?}");
    assert!(after.recovered >= 1, "{after:?}");
    assert_eq!(after.state, CircuitState::Closed);
    assert!(counts.by_policy.load(Ordering::Relaxed) >= 1);
    drop(set);
}
