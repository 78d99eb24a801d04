//! The circuit breaker of an idle proxy: with no requests at all, its probes close it
//! once Redis is back, before the next request arrives.
//!
//! A test binary of its own: it reads the log lines of the prober's task through a
//! thread-local subscriber, and `tracing` decides whether a log line is wanted by the first
//! thread that reaches it when only one subscriber is registered; another test running beside
//! it in the same process, with none, would turn the prober's lines off.

use crate::common;

use std::time::Duration;

use spillway_core::config::FailurePolicy;
use spillway_core::decision::Verdict;
use spillway_redis::{CircuitState, Fallback, RedisKey};
use spillway_testkit::RedisServer;

use crate::common::outage::{BOUND, algo, guarded, ramped_in_order, restart, until_closed};

/// An idle half minute: after the circuit opens, no request for 30 s, Redis down for the first 28
/// and back for the last 2. The prober alone closes the circuit, before the next request; one log
/// line per transition and a summary of the failed probes every 10 s, however many failed.
#[tokio::test]
async fn an_idle_proxy_is_closed_by_its_probes_before_its_next_request() {
    let logs = common::Logs::default();
    let _logging = logs.install();
    let mut server = RedisServer::start().expect("private redis-server");
    let limiter = guarded(&server.url());
    let (strict, lenient) = (RedisKey::named("strict"), RedisKey::named("lenient"));
    let first = limiter
        .decide(&strict, &algo(), 1, FailurePolicy::Closed)
        .await;
    assert_eq!((first.verdict, first.fallback), (Verdict::Allow, None));

    server.kill();
    // Five failed calls open the circuit (the default threshold); each was decided by policy.
    for _ in 0..5 {
        let d = limiter
            .decide(&strict, &algo(), 1, FailurePolicy::Closed)
            .await;
        assert_eq!(d.fallback, Some(Fallback::StoreFailed));
        assert!(!d.verdict.is_allow());
    }
    assert_eq!(limiter.breaker().state(), CircuitState::Open);
    // Open: Redis is not asked. `closed` denies until the next probe, `open` allows.
    let d = limiter
        .decide(&strict, &algo(), 1, FailurePolicy::Closed)
        .await;
    assert_eq!(d.fallback, Some(Fallback::CircuitOpen));
    let Verdict::Deny { retry_after } = d.verdict else {
        panic!("a closed bucket allowed while the circuit was open");
    };
    assert!(retry_after <= Duration::from_millis(250), "{retry_after:?}");
    let d = limiter
        .decide(&lenient, &algo(), 1, FailurePolicy::Open)
        .await;
    assert_eq!(
        (d.verdict, d.fallback),
        (Verdict::Allow, Some(Fallback::CircuitOpen))
    );

    // Idle, Redis down: the circuit stays open and the prober pings every 250 ms.
    tokio::time::sleep(Duration::from_secs(28)).await;
    let down = limiter.breaker().stats();
    assert_eq!(down.state, CircuitState::Open);
    assert!(down.probe_failures >= 56, "about 112 expected: {down:?}");
    assert_eq!((down.errors + down.timeouts, down.short_circuited), (5, 2));

    // Idle, Redis back: closed within the bound, and still before the next request at 2 s.
    let (server, back) = restart(server).await;
    let (closed_after, seen) = until_closed(&limiter, back).await;
    println!("idle: closed {closed_after:?} after Redis answered, through {seen:?}");
    assert!(closed_after <= BOUND, "{closed_after:?}: {seen:?}");
    assert!(ramped_in_order(&seen), "{seen:?}");
    tokio::time::sleep_until((back + BOUND).into()).await;
    let before_next = limiter.breaker().stats();
    assert_eq!(before_next.state, CircuitState::Closed);
    assert_eq!(
        before_next.short_circuited, 2,
        "no request was needed to close it"
    );
    assert_eq!((before_next.opened, before_next.recovered), (1, 1));
    let next = limiter
        .decide(&strict, &algo(), 1, FailurePolicy::Closed)
        .await;
    assert_eq!((next.verdict, next.fallback), (Verdict::Allow, None));

    let lines = logs.lines();
    let count = |text: &str| lines.iter().filter(|l| l.contains(text)).count();
    assert_eq!(count("Redis call failed: "), 1, "{lines:#?}");
    assert_eq!(
        count("Redis circuit opened: 5 consecutive calls failed"),
        1,
        "{lines:#?}"
    );
    assert_eq!(count("Redis circuit half-open after "), 1, "{lines:#?}");
    assert_eq!(
        count("Redis circuit closed: Redis trusted again after "),
        1,
        "{lines:#?}"
    );
    assert_eq!(count("reopened"), 0, "{lines:#?}");
    // Five failed requests and some 110 failed probes: four lines and one summary every 10 s
    // while the failures went on (two or three in 28 s).
    let summaries = count("Redis calls failed in the last");
    assert!((2..=3).contains(&summaries), "{lines:#?}");
    let breaker_lines = lines
        .iter()
        .filter(|l| l.contains("spillway_redis"))
        .count();
    assert_eq!(breaker_lines, 4 + summaries, "{lines:#?}");
    assert!(
        lines.iter().all(
            |l| !l.contains("spillway_redis") || l.contains(&format!("redis={}", server.url()))
        ),
        "{lines:#?}"
    );
}
