//! The circuit breaker against a real redis-server that dies and comes back under load:
//! recovery is bounded in time whatever the rate. The idle case is `breaker_idle.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use spillway_core::config::FailurePolicy;
use spillway_core::decision::Verdict;
use spillway_redis::{CircuitState, GuardedLimiter, RedisKey};
use spillway_testkit::RedisServer;

use crate::common::outage::{
    BOUND, algo, guarded, ramped_in_order, restart, until_closed, wait_for,
};

#[derive(Default)]
struct Counts {
    by_redis: AtomicU64,
    by_policy: AtomicU64,
}

/// Requests at `per_sec` a second, each on its own task (so a slow failure does not slow the
/// rate), for at most a minute or until `stop`.
fn load(
    limiter: Arc<GuardedLimiter>,
    per_sec: u32,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1) / per_sec);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let key = RedisKey::named("load");
        for _ in 0..per_sec * 60 {
            tick.tick().await;
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let (limiter, counts, key) = (limiter.clone(), counts.clone(), key.clone());
            tokio::spawn(async move {
                let d = limiter
                    .decide(&key, &algo(), 1, FailurePolicy::Closed)
                    .await;
                let counter = match d.fallback {
                    None => &counts.by_redis,
                    Some(_) => &counts.by_policy,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            });
        }
    })
}

/// Redis killed under `per_sec` requests a second, down for a second, restarted: the breaker
/// must close within [`BOUND`] of Redis answering.
async fn recovers_within_the_bound_at(per_sec: u32) {
    let server = RedisServer::start().expect("private redis-server");
    let mut server = server;
    let limiter = guarded(&server.url());
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let load = load(limiter.clone(), per_sec, counts.clone(), stop.clone());
    assert!(
        wait_for(Duration::from_secs(10), || counts
            .by_redis
            .load(Ordering::Relaxed)
            >= 2)
        .await,
        "Redis decided nothing before the kill"
    );

    server.kill();
    assert!(
        wait_for(Duration::from_secs(10), || limiter.breaker().state()
            == CircuitState::Open)
        .await,
        "the breaker did not open: {:?}",
        limiter.breaker().stats()
    );
    // Down for a second: the prober's pings fail and the circuit stays open.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let down = limiter.breaker().stats();
    assert_eq!(down.state, CircuitState::Open, "{down:?}");
    assert!(down.probe_failures >= 2, "{down:?}");

    let (server, back) = restart(server).await;
    let (closed_after, seen) = until_closed(&limiter, back).await;
    let policy_before = counts.by_policy.load(Ordering::Relaxed);
    // Trusted again: the requests that follow are all decided by Redis.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let stats = limiter.breaker().stats();
    println!(
        "{per_sec}/s: closed {closed_after:?} after Redis answered, through {seen:?}; {stats:?}"
    );
    assert!(
        closed_after <= BOUND,
        "closed {closed_after:?} after Redis answered at {per_sec}/s: {seen:?}"
    );
    assert!(ramped_in_order(&seen), "{seen:?}");
    for _ in 0..5 {
        let d = limiter
            .decide(&RedisKey::named("after"), &algo(), 1, FailurePolicy::Closed)
            .await;
        assert_eq!((d.verdict, d.fallback), (Verdict::Allow, None));
    }
    // Requests of the 300 ms after closing may still be in flight from before; generously,
    // at most one of them was decided by policy.
    assert!(counts.by_policy.load(Ordering::Relaxed) <= policy_before + 1);
    assert_eq!((stats.opened, stats.recovered), (1, 1), "{stats:?}");
    assert!(stats.short_circuited >= 1, "{stats:?}");
    drop(server);
}

#[tokio::test]
async fn at_5_requests_a_second_the_breaker_closes_within_2_s_of_redis_answering() {
    recovers_within_the_bound_at(5).await;
}

#[tokio::test]
async fn at_100_requests_a_second_the_breaker_closes_within_2_s_of_redis_answering() {
    recovers_within_the_bound_at(100).await;
}
