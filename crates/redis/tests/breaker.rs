//! The circuit breaker against a real redis-server that dies and comes back (S8).

mod common;

use std::time::Duration;

use spillway_core::algo::Rate;
use spillway_core::config::FailurePolicy;
use spillway_core::decision::Verdict;
use spillway_redis::{
    BreakerConfig, CircuitState, ExactAlgo, Fallback, GuardedLimiter, RedisKey, RedisLimiter,
    StoreOptions, Target,
};
use spillway_testkit::RedisServer;

fn guarded(url: &str) -> GuardedLimiter {
    let limiter = RedisLimiter::new(
        Target::single(url),
        StoreOptions {
            timeout: Duration::from_millis(500),
        },
    )
    .unwrap();
    GuardedLimiter::new(
        limiter,
        BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_millis(300),
            ramp: vec![4, 2],
            probes_per_stage: 5,
            success_percent: 80,
        },
    )
}

#[tokio::test]
async fn breaker_opens_when_redis_dies_applies_each_policy_and_ramps_back() {
    let mut server = RedisServer::start().expect("private redis-server");
    let limiter = guarded(&server.url());
    let algo = ExactAlgo::token_bucket(Rate::per_second(100_000).unwrap(), 100_000);
    let (strict, lenient) = (RedisKey::named("strict"), RedisKey::named("lenient"));
    let closed = FailurePolicy::Closed;

    let first = limiter.decide(&strict, &algo, 1, closed).await;
    assert_eq!((first.verdict, first.fallback), (Verdict::Allow, None));

    server.kill();
    // Three consecutive failures open the circuit; each of them was decided by the policy.
    for _ in 0..3 {
        let d = limiter.decide(&strict, &algo, 1, closed).await;
        assert_eq!(d.fallback, Some(Fallback::StoreFailed));
        assert!(!d.verdict.is_allow());
    }
    assert_eq!(limiter.breaker().state(), CircuitState::Open);
    let failed = limiter.breaker().stats();
    assert_eq!(failed.errors + failed.timeouts, 3);
    assert_eq!(failed.opened, 1);

    // Open: Redis is not asked at all. `closed` buckets drop with a retry-after until the
    // probes start; `open` buckets allow.
    for _ in 0..10 {
        let strict = limiter.decide(&strict, &algo, 1, closed).await;
        assert_eq!(strict.fallback, Some(Fallback::CircuitOpen));
        let Verdict::Deny { retry_after } = strict.verdict else {
            panic!("a closed bucket allowed while the circuit was open");
        };
        assert!(retry_after <= Duration::from_millis(300));
        let lenient = limiter
            .decide(&lenient, &algo, 1, FailurePolicy::Open)
            .await;
        assert_eq!(lenient.fallback, Some(Fallback::CircuitOpen));
        assert_eq!(lenient.verdict, Verdict::Allow);
    }
    let open = limiter.breaker().stats();
    assert_eq!(open.errors + open.timeouts, 3, "no call reached for Redis");
    assert_eq!(open.short_circuited, 20);

    server.restart().expect("restart redis-server");
    // Steady traffic until the ramp completes; note each state and how many requests in it
    // Redis decided.
    let mut seen: Vec<(CircuitState, u32, u32)> = Vec::new();
    for _ in 0..2_000 {
        let state = limiter.breaker().state();
        if state == CircuitState::Closed && !seen.is_empty() {
            break;
        }
        let d = limiter.decide(&strict, &algo, 1, closed).await;
        match seen.last_mut() {
            Some((s, total, redis)) if *s == state => {
                *total += 1;
                *redis += u32::from(d.fallback.is_none());
            }
            _ => seen.push((state, 1, u32::from(d.fallback.is_none()))),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        limiter.breaker().state(),
        CircuitState::Closed,
        "the ramp never completed: {seen:?}"
    );
    let states: Vec<CircuitState> = seen.iter().map(|s| s.0).collect();
    let n = states.len();
    assert!(n >= 2, "{seen:?}");
    assert_eq!(
        states[n - 2..],
        [
            CircuitState::HalfOpen {
                stage: 0,
                one_in: 4
            },
            CircuitState::HalfOpen {
                stage: 1,
                one_in: 2
            }
        ],
        "the last steps before closing are the ramp's stages: {seen:?}"
    );
    // Five probes a stage: the first one arrives while the state still reads open (the
    // request itself moves the breaker to half-open), then one in 4, then one in 2.
    let by_redis: u32 = seen.iter().map(|s| s.2).sum();
    assert_eq!(by_redis, 10, "{seen:?}");
    assert_eq!(seen[n - 1].2, 5, "{seen:?}");
    assert!(seen[n - 2].1 > seen[n - 1].1, "{seen:?}");
    assert_eq!(limiter.breaker().stats().recovered, 1);

    let back = limiter.decide(&strict, &algo, 1, closed).await;
    assert_eq!((back.verdict, back.fallback), (Verdict::Allow, None));
}
