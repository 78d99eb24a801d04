//! Helpers of the breaker's tests: a guarded limiter as a proxy builds it, a restart timed
//! by the test's own `PING`, and a watch on the breaker until it closes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_core::algo::Rate;
use spillway_redis::{
    BreakerConfig, CircuitState, ExactAlgo, GuardedLimiter, RedisEndpoint, RedisLimiter,
    StoreOptions,
};
use spillway_testkit::RedisServer;

/// The bound of issue 19: a healthy Redis is trusted again at most this long after it answers.
pub const BOUND: Duration = Duration::from_secs(2);

/// A limiter with the default breaker, as a proxy builds it, and a timeout that a debug build
/// on a busy machine meets.
pub fn guarded(url: &str) -> Arc<GuardedLimiter> {
    let limiter = RedisLimiter::new(
        RedisEndpoint::single(url),
        StoreOptions {
            timeout: Duration::from_millis(250),
        },
    )
    .unwrap();
    Arc::new(GuardedLimiter::new(limiter, BreakerConfig::default()))
}

pub fn algo() -> ExactAlgo {
    ExactAlgo::token_bucket(Rate::per_second(100_000).unwrap(), 100_000)
}

/// Polls `check` every 10 ms for at most `limit`.
pub async fn wait_for(limit: Duration, check: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    check()
}

/// Restarts `server` off the runtime (it blocks until the server answers), then pings it from
/// the test itself: the instant of the first `PONG` is when Redis answers again.
pub async fn restart(mut server: RedisServer) -> (RedisServer, Instant) {
    let server = tokio::task::spawn_blocking(move || {
        server.restart().expect("redis-server restarts on its port");
        server
    })
    .await
    .unwrap();
    let client = redis::Client::open(server.url()).unwrap();
    for _ in 0..100 {
        if let Ok(mut con) = client.get_multiplexed_async_connection().await
            && redis::cmd("PING")
                .query_async::<String>(&mut con)
                .await
                .is_ok()
        {
            return (server, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the restarted redis-server does not answer PING");
}

/// Watches the breaker every 5 ms until it closes (at most 10 s): how long after `back` it
/// closed, and the states it went through.
pub async fn until_closed(
    limiter: &GuardedLimiter,
    back: Instant,
) -> (Duration, Vec<CircuitState>) {
    let mut seen = vec![limiter.breaker().state()];
    while back.elapsed() < Duration::from_secs(10) {
        let state = limiter.breaker().state();
        if seen.last() != Some(&state) {
            seen.push(state);
        }
        if state == CircuitState::Closed {
            return (back.elapsed(), seen);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the breaker did not close within 10 s of Redis answering: {seen:?}");
}

/// The states from open to closed went through the ramp's stages in order.
pub fn ramped_in_order(seen: &[CircuitState]) -> bool {
    let stages: Vec<usize> = seen
        .iter()
        .filter_map(|s| match s {
            CircuitState::HalfOpen { stage, .. } => Some(*stage),
            _ => None,
        })
        .collect();
    !stages.is_empty()
        && stages.windows(2).all(|w| w[0] < w[1])
        && seen.first() != Some(&CircuitState::Closed)
        && seen.last() == Some(&CircuitState::Closed)
}
