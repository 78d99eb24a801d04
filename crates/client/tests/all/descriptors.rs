//! Descriptor buckets decided through the client, against fake time: the code and what
//! Envoy is told (`current_limit`, `limit_remaining`, `duration_until_reset`), per-value counts,
//! shadow mode, the `unlimited`, `allow` and `over-limit` answers, `replaces`, and that no HTTP
//! request ever reaches a descriptor bucket.

use std::sync::Arc;
use std::time::Duration;

use spillway_client::{Client, DescriptorStatus, DescriptorStep, NoHeaders, UNLIMITED_REMAINING};
use spillway_core::clock::FakeClock;
use spillway_core::config::load_str;
use spillway_core::decision::Decision;
use spillway_core::descriptor::Answer;
use spillway_core::pattern::RequestAttrs;

const SEC: u64 = 1_000_000_000;

fn client(buckets: &str) -> (Client, Arc<FakeClock>) {
    let clock = Arc::new(FakeClock::new(0));
    let yaml = format!("version: 1\nservices:\n  envoy:\n    buckets:\n{buckets}");
    let config = load_str(&yaml, "test.yaml").unwrap();
    (Client::with_clock(config, clock.clone()).unwrap(), clock)
}

/// One descriptor of domain `d`, decided as `ShouldRateLimit` would.
fn decide(c: &Client, entries: &[(&str, &str)], cost: u64) -> DescriptorStatus {
    let rules = c.rules();
    let Some(id) = rules.descriptor_bucket("d", entries) else {
        return DescriptorStatus::UNMATCHED;
    };
    match rules.decide_descriptor(c.now(), id, entries, cost) {
        DescriptorStep::Done(status) => status,
        DescriptorStep::Redis(_) => panic!("no Redis here"),
    }
}

fn bucket(c: &Client, s: &DescriptorStatus) -> String {
    c.rules()
        .bucket(s.bucket.unwrap())
        .unwrap()
        .name()
        .to_owned()
}

#[test]
fn a_fixed_window_reports_remaining_and_reset_and_counts_hits_addend() {
    let (c, clock) = client(
        "      - { name: foo, limit: 5/min, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: foo, value: x} ] } } }\n",
    );
    clock.set(15 * SEC);
    let first = decide(&c, &[("foo", "x")], 1);
    assert_eq!(first.decision, Decision::Allow);
    assert_eq!((first.remaining, first.reset), (4, Duration::from_secs(45)));
    assert_eq!(first.limit.unwrap().count.get(), 5);
    let bulk = decide(&c, &[("foo", "x")], 3);
    assert_eq!((bulk.is_over_limit(), bulk.remaining), (false, 1));
    let over = decide(&c, &[("foo", "x")], 2);
    assert!(over.is_over_limit());
    assert_eq!((over.remaining, over.reset), (1, Duration::from_secs(45)));
    // A cost that can never fit is over the limit, never a panic.
    assert!(decide(&c, &[("foo", "x")], u64::MAX).is_over_limit());
    clock.set(60 * SEC);
    assert_eq!(decide(&c, &[("foo", "x")], 1).remaining, 4);
    let stats = c.stats();
    assert_eq!(stats[0].counters.allowed, 3);
    assert_eq!(stats[0].counters.dropped, 2);
}

#[test]
fn an_entry_without_a_value_counts_each_value_apart() {
    let (c, _) = client(
        "      - { name: per-user, limit: 1/min, algorithm: token-bucket, match: { descriptor: { domain: d, entries: [ {key: tenant, value: acme}, {key: user} ] } } }\n      - { name: pair, limit: 1/min, algorithm: gcra, match: { descriptor: { domain: d, entries: [ {key: a}, {key: b} ] } } }\n",
    );
    assert!(!decide(&c, &[("tenant", "acme"), ("user", "alice")], 1).is_over_limit());
    assert!(decide(&c, &[("tenant", "acme"), ("user", "alice")], 1).is_over_limit());
    assert!(!decide(&c, &[("tenant", "acme"), ("user", "bob")], 1).is_over_limit());
    // Two counted values are one key, and ("1:2", "3") is not ("1", "2:3").
    assert!(!decide(&c, &[("a", "1:2"), ("b", "3")], 1).is_over_limit());
    assert!(!decide(&c, &[("a", "1"), ("b", "2:3")], 1).is_over_limit());
    assert!(decide(&c, &[("a", "1"), ("b", "2:3")], 1).is_over_limit());
    assert_eq!(c.stats()[0].subjects, Some(2));
}

#[test]
fn shadow_buckets_answer_ok_and_count_a_virtual_drop() {
    let (c, _) = client(
        "      - { name: shady, limit: 1/min, algorithm: sliding-window-log, mode: shadow, match: { descriptor: { domain: d, entries: [ {key: baz, value: shady} ] } } }\n",
    );
    assert!(!decide(&c, &[("baz", "shady")], 1).is_over_limit());
    let second = decide(&c, &[("baz", "shady")], 1);
    assert!(matches!(second.decision, Decision::ShadowDrop { .. }));
    assert!(!second.is_over_limit());
    assert_eq!(second.remaining, 0);
    assert_eq!(c.stats()[0].counters.shadow_dropped, 1);
}

#[test]
fn unlimited_allow_and_over_limit_answers() {
    let (c, _) = client(
        "      - { name: ldap, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, answer: unlimited, entries: [ {key: ldap} ] } } }\n      - { name: known, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, answer: allow, entries: [ {key: ip, value: 10.0.0.1} ] } } }\n      - { name: per-ip, limit: 1/min, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: ip} ] } } }\n      - { name: banned, limit: 1/min, algorithm: fixed-window, match: { descriptor: { domain: d, answer: over-limit, entries: [ {key: ip, value: 50.0.0.5} ] } } }\n",
    );
    for _ in 0..3 {
        let ldap = decide(&c, &[("ldap", "x")], 1);
        assert_eq!(
            (ldap.is_over_limit(), ldap.limit, ldap.remaining),
            (false, None, UNLIMITED_REMAINING)
        );
        let known = decide(&c, &[("ip", "10.0.0.1")], 1);
        assert_eq!((known.is_over_limit(), known.limit), (false, None));
        assert_eq!(bucket(&c, &known), "known");
        let banned = decide(&c, &[("ip", "50.0.0.5")], 1);
        assert!(banned.is_over_limit());
        assert_eq!((banned.answer, banned.remaining), (Answer::OverLimit, 0));
        assert_eq!(banned.reset, Duration::from_secs(60));
    }
    assert!(!decide(&c, &[("ip", "10.0.0.2")], 1).is_over_limit());
    assert!(decide(&c, &[("ip", "10.0.0.2")], 1).is_over_limit());
    assert_eq!(decide(&c, &[("nope", "x")], 1), DescriptorStatus::UNMATCHED);
    // `unlimited` and `allow` are never counted, as envoyproxy/ratelimit never passes them to its
    // cache: their traffic is no offered load for the control plane and no bucket metric.
    // `over-limit` counts its drops.
    let stats = c.stats();
    let counted = |name: &str| {
        let s = stats.iter().find(|s| s.bucket == name).unwrap();
        (s.counters.allowed, s.counters.dropped)
    };
    assert_eq!(counted("ldap"), (0, 0));
    assert_eq!(counted("known"), (0, 0));
    assert_eq!(counted("banned"), (0, 3));
    assert_eq!(counted("per-ip"), (1, 1));
}

#[test]
fn a_descriptor_that_is_not_the_buckets_shape_is_unmatched_never_a_panic() {
    // `decide_descriptor` is handed a bucket id and a descriptor by its caller; one with fewer
    // entries than the bucket has no value to count for the missing ones.
    let (c, _) = client(
        "      - { name: pair, limit: 1/min, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: a}, {key: b} ] } } }\n",
    );
    let rules = c.rules();
    let id = rules
        .descriptor_bucket("d", &[("a", "1"), ("b", "2")][..])
        .unwrap();
    for entries in [
        &[("a", "1")][..],
        &[][..],
        &[("a", "1"), ("b", "2"), ("c", "3")][..],
    ] {
        match rules.decide_descriptor(c.now(), id, entries, 1) {
            DescriptorStep::Done(status) => assert_eq!(status, DescriptorStatus::UNMATCHED),
            DescriptorStep::Redis(_) => panic!("no Redis here"),
        }
    }
    assert_eq!(c.stats()[0].counters.allowed, 0);
}

#[test]
fn replaces_names_the_buckets_a_request_drops() {
    let (c, _) = client(
        "      - { name: specific, limit: 5/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: k1, value: v1}, {key: user, value: bk} ] } } }\n      - { name: wider, limit: 10/s, algorithm: fixed-window, match: { descriptor: { domain: d, replaces: [specific], entries: [ {key: k2, value: v2}, {key: user, value: bk} ] } } }\n",
    );
    let rules = c.rules();
    let specific = rules
        .descriptor_bucket("d", &[("k1", "v1"), ("user", "bk")][..])
        .unwrap();
    let wider = rules
        .descriptor_bucket("d", &[("k2", "v2"), ("user", "bk")][..])
        .unwrap();
    assert_eq!(rules.replaces(wider), [specific]);
    assert!(rules.replaces(specific).is_empty());
}

#[test]
fn http_requests_never_reach_a_descriptor_bucket() {
    let (c, _) = client(
        "      - { name: foo, limit: 1/h, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: foo} ] } } }\n",
    );
    let request = RequestAttrs {
        procedure: Some("/search"),
        ..RequestAttrs::default()
    };
    for _ in 0..3 {
        assert_eq!(c.decide(&request, &NoHeaders), Decision::Allow);
    }
    assert_eq!(c.stats()[0].counters.allowed, 0);
}

/// A `store: redis` descriptor, decided as `ShouldRateLimit` would: through Redis.
#[cfg(feature = "redis")]
async fn decide_in_redis(c: &Client, entries: &[(&str, &str)], cost: u64) -> DescriptorStatus {
    let rules = c.rules();
    let id = rules.descriptor_bucket("d", entries).unwrap();
    match rules.decide_descriptor(c.now(), id, entries, cost) {
        DescriptorStep::Redis(check) => rules.finish_descriptor(check).await,
        DescriptorStep::Done(status) => panic!("decided without Redis: {status:?}"),
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_buckets_count_each_value_across_clients_and_report_what_is_left() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let yaml = format!(
        "version: 1\nredis: {{ url: \"{}\", timeout: 1s }}\nservices:\n  envoy:\n    buckets:\n      - {{ name: per-user, limit: 2/h, algorithm: fixed-window, store: redis, match: {{ descriptor: {{ domain: d, entries: [ {{key: user}} ] }} }} }}\n      - {{ name: api, limit: 10/s, burst: 40, algorithm: token-bucket, store: redis, match: {{ descriptor: {{ domain: d, entries: [ {{key: api, value: x}} ] }} }} }}\n",
        redis.url()
    );
    let a = Client::new(load_str(&yaml, "test.yaml").unwrap()).unwrap();
    let b = Client::new(load_str(&yaml, "test.yaml").unwrap()).unwrap();
    let first = decide_in_redis(&a, &[("user", "alice")], 1).await;
    assert_eq!((first.is_over_limit(), first.remaining), (false, 1));
    assert_eq!(first.limit.unwrap().count.get(), 2);
    // The window ends on the hour, counted from the Unix epoch.
    assert!(first.reset > Duration::ZERO && first.reset <= Duration::from_secs(3600));
    // The other client shares alice's count, not bob's.
    let second = decide_in_redis(&b, &[("user", "alice")], 1).await;
    assert_eq!((second.is_over_limit(), second.remaining), (false, 0));
    let third = decide_in_redis(&a, &[("user", "alice")], 1).await;
    assert_eq!((third.is_over_limit(), third.remaining), (true, 0));
    let bob = decide_in_redis(&b, &[("user", "bob")], 1).await;
    assert_eq!((bob.is_over_limit(), bob.remaining), (false, 1));
    // A token bucket of 40 tokens at 10/s that gave 10 has 30 left and is full again in 1 s.
    let api = decide_in_redis(&a, &[("api", "x")], 10).await;
    assert_eq!((api.is_over_limit(), api.remaining), (false, 30));
    assert_eq!(api.reset, Duration::from_secs(1));
    let stats = a.stats();
    assert_eq!(
        (stats[0].counters.allowed, stats[0].counters.dropped),
        (1, 1)
    );
}
