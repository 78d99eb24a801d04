//! Decisions of the client against fake time: combining buckets, shadow mode, drop-ratio
//! instructions and their expiry, and reloads that keep unchanged buckets' state.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use spillway_client::{Client, InstructionError, NoHeaders};
use spillway_core::algo::Ratio;
use spillway_core::clock::FakeClock;
use spillway_core::config::load_str;
use spillway_core::decision::Decision;
use spillway_core::pattern::RequestAttrs;

fn client(yaml: &str) -> (Client, Arc<FakeClock>) {
    let clock = Arc::new(FakeClock::new(1));
    let config = load_str(yaml, "test.yaml").unwrap();
    (Client::with_clock(config, clock.clone()).unwrap(), clock)
}

fn search() -> RequestAttrs<'static> {
    RequestAttrs {
        procedure: Some("/search"),
        ..RequestAttrs::default()
    }
}

fn bucket_of(client: &Client, d: Decision) -> String {
    let rules = client.rules();
    rules.bucket(d.bucket().unwrap()).unwrap().name().to_owned()
}

#[test]
fn any_enforcing_drop_drops_and_shadow_drops_forward() {
    let (c, _) = client(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: wide, limit: 3/h, algorithm: token-bucket }\n      - { name: narrow, match: { procedure: /search }, limit: 1/h, algorithm: gcra, mode: shadow }\n",
    );
    let first = c.decide(&search(), &NoHeaders);
    assert_eq!(first, Decision::Allow);
    // The shadow bucket is empty now: forwarded, but named as a virtual drop.
    let second = c.decide(&search(), &NoHeaders);
    assert!(matches!(second, Decision::ShadowDrop { .. }));
    assert_eq!(bucket_of(&c, second), "narrow");
    c.decide(&search(), &NoHeaders);
    // The enforcing bucket is empty: dropped, whatever the shadow bucket says.
    let fourth = c.decide(&search(), &NoHeaders);
    assert!(matches!(fourth, Decision::Drop { .. }));
    assert_eq!(bucket_of(&c, fourth), "wide");

    let stats = c.stats();
    assert_eq!(stats[0].counters.allowed, 3);
    assert_eq!(stats[0].counters.dropped, 1);
    assert_eq!(stats[1].counters.allowed, 1);
    assert_eq!(stats[1].counters.shadow_dropped, 3);
}

#[test]
fn costs_come_from_the_header_or_the_default() {
    let (c, _) = client(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: units, limit: 10/h, algorithm: token-bucket, cost: { header: x-cost, default: 4 } }\n",
    );
    let mut heavy = HeaderMap::new();
    heavy.insert("x-cost", "7".parse().unwrap());
    assert!(c.decide(&search(), &heavy).forwards()); // 3 left
    assert!(!c.decide(&search(), &NoHeaders).forwards()); // default 4 > 3
    heavy.insert("x-cost", "3".parse().unwrap());
    assert!(c.decide(&search(), &heavy).forwards());
}

#[test]
fn drop_ratio_follows_instructions_and_fails_open_when_they_expire() {
    let (c, clock) = client(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: global, limit: 100/s }\n",
    );
    // No instruction yet: everything passes.
    assert!((0..100).all(|_| c.decide(&search(), &NoHeaders).forwards()));
    c.set_drop_ratio("api", "global", Ratio::ONE, Duration::from_secs(5))
        .unwrap();
    assert!((0..100).all(|_| !c.decide(&search(), &NoHeaders).forwards()));
    assert_eq!(c.stats()[0].drop_ratio, Some(1.0));
    clock.advance(Duration::from_secs(5));
    assert!((0..100).all(|_| c.decide(&search(), &NoHeaders).forwards()));
    assert_eq!(c.stats()[0].drop_ratio, Some(0.0));
    assert_eq!(c.instructions_expired(), 0);
    c.tick();
    assert_eq!(c.instructions_expired(), 1);
    c.tick();
    assert_eq!(c.instructions_expired(), 1, "an expiry is counted once");
}

#[test]
fn a_third_of_requests_drop_at_ratio_one_third() {
    let (c, _) = client(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: global, limit: 100/s }\n",
    );
    c.set_drop_ratio(
        "api",
        "global",
        Ratio::from_fraction(1, 3),
        Duration::from_secs(60),
    )
    .unwrap();
    let dropped = (0..30_000)
        .filter(|_| !c.decide(&search(), &NoHeaders).forwards())
        .count();
    // Binomial(30000, 1/3): the standard deviation is 82, so 9,500..10,500 is over 6 of them.
    assert!((9_500..10_500).contains(&dropped), "{dropped} dropped");
}

#[test]
fn instructions_name_real_drop_ratio_buckets() {
    let (c, _) = client(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: tb, limit: 1/s, algorithm: token-bucket }\n",
    );
    assert!(matches!(
        c.set_drop_ratio("api", "nope", Ratio::ONE, Duration::from_secs(1)),
        Err(InstructionError::UnknownBucket { .. })
    ));
    assert!(matches!(
        c.set_drop_ratio("api", "tb", Ratio::ONE, Duration::from_secs(1)),
        Err(InstructionError::NotDropRatio { .. })
    ));
}

#[test]
fn a_reload_keeps_unchanged_buckets_and_resets_changed_ones() {
    let yaml = |limit: &str| {
        format!(
            "version: 1\nservices:\n  api:\n    buckets:\n      - {{ name: same, limit: 2/h, algorithm: token-bucket }}\n      - {{ name: changed, limit: {limit}, algorithm: fixed-window, match: {{ caller: gw }} }}\n"
        )
    };
    let (c, _) = client(&yaml("1/h"));
    let gw = RequestAttrs {
        caller: Some("gw"),
        ..search()
    };
    assert_eq!(c.decide(&gw, &NoHeaders), Decision::Allow);
    let second = c.decide(&gw, &NoHeaders);
    assert_eq!(bucket_of(&c, second), "changed");
    let version = c
        .reload(load_str(&yaml("5/h"), "test.yaml").unwrap())
        .unwrap();
    assert_eq!(version, 2);
    assert_eq!(c.rules().version(), 2);
    // `same` kept its state: both its tokens were spent before the reload.
    assert!(!c.decide(&search(), &NoHeaders).forwards());
    // `changed` got a fresh window of 5, so it admits again; both keep counting from before.
    c.decide(&gw, &NoHeaders);
    let stats = c.stats();
    assert_eq!(stats[0].counters.offered(), 4);
    assert_eq!(
        (stats[1].counters.allowed, stats[1].counters.dropped),
        (2, 1)
    );
}

#[test]
fn a_broken_reload_keeps_the_rules_in_force() {
    let (c, _) = client(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: one, limit: 1/h, algorithm: token-bucket }\n",
    );
    let broken = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: one, limt: 5/h }\n";
    let err = spillway_core::config::load_str(broken, "test.yaml").unwrap_err();
    assert!(err.to_string().starts_with("test.yaml:5:"), "{err}");
    assert!(c.decide(&search(), &NoHeaders).forwards());
    assert!(!c.decide(&search(), &NoHeaders).forwards());
    assert_eq!(c.rules().version(), 1);
}

// Without the `redis` feature the bucket is refused for that first (`tests/without_redis.rs`).
#[cfg(feature = "redis")]
#[test]
fn a_redis_bucket_without_a_redis_section_is_refused_and_the_rules_in_force_stay() {
    // What a proxy following a rules store can be handed: the store's `store: redis` rule merged
    // into a file that names no Redis. Compiled anyway, the bucket would admit everything.
    let (c, _) = client(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: local, limit: 1/h, algorithm: token-bucket }\n",
    );
    let mut merged = load_str(
        "version: 1\nredis: { url: redis://127.0.0.1:1 }\nservices:\n  api:\n    buckets:\n      - { name: exact, limit: 1/h, algorithm: token-bucket, store: redis }\n",
        "store.yaml",
    )
    .unwrap();
    merged.redis = None;
    let err = c.reload(merged).unwrap_err();
    assert!(
        err.to_string()
            .contains("service api, bucket exact: store: redis needs a top-level `redis` section"),
        "{err}"
    );
    assert_eq!(c.rules().buckets()[0].name(), "local", "the old rules stay");
    assert!(c.decide(&search(), &NoHeaders).forwards());
    assert!(!c.decide(&search(), &NoHeaders).forwards());
}
