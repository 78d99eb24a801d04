//! A build without the `redis` feature refuses every configuration that asks for Redis, when it
//! loads and on a reload, naming the service and bucket that ask and the feature to build with;
//! the rules in force stay.
#![cfg(not(feature = "redis"))]

use spillway_client::{Client, ClientError, NoHeaders};
use spillway_core::config::load_str;
use spillway_core::pattern::RequestAttrs;

/// A file the sidecar accepts: `orders` counts in memory, `search` has one exact bucket.
const WITH_REDIS: &str = "version: 1\nredis: { url: redis://127.0.0.1:1 }\nservices:\n  orders:\n    buckets:\n      - { name: local, limit: 1/h, algorithm: token-bucket }\n  search:\n    buckets:\n      - { name: wide, limit: 100/s, algorithm: gcra }\n      - { name: exact, match: { user: \"*\" }, limit: 5/s, algorithm: token-bucket, store: redis }\n";

const NOT_BUILT: &str = "this build of spillway-client has no Redis support; build it with the `redis` feature (the `spillway` binary's default features have it)";

#[test]
fn a_store_redis_bucket_is_refused_naming_its_service_and_bucket() {
    let err = Client::new(load_str(WITH_REDIS, "test.yaml").unwrap()).unwrap_err();
    assert!(
        matches!(&err, ClientError::RedisNotBuilt { service, bucket } if service == "search" && bucket == "exact"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("service search, bucket exact: store: redis, but {NOT_BUILT}")
    );
}

#[test]
fn a_redis_section_that_no_bucket_uses_is_refused_too() {
    let config = load_str(
        "version: 1\nredis: { url: redis://127.0.0.1:1 }\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1/h, algorithm: token-bucket }\n",
        "test.yaml",
    )
    .unwrap();
    let err = Client::new(config).unwrap_err();
    assert!(matches!(err, ClientError::RedisSectionNotBuilt), "{err:?}");
    assert!(err.to_string().starts_with("redis: "), "{err}");
    assert!(err.to_string().contains(NOT_BUILT), "{err}");
}

#[test]
fn a_reload_that_asks_for_redis_is_refused_and_the_rules_in_force_stay() {
    let client = Client::new(
        load_str(
            "version: 1\nservices:\n  orders:\n    buckets:\n      - { name: local, limit: 1/h, algorithm: token-bucket }\n",
            "test.yaml",
        )
        .unwrap(),
    )
    .unwrap();
    let err = client
        .reload(load_str(WITH_REDIS, "test.yaml").unwrap())
        .unwrap_err();
    assert!(matches!(err, ClientError::RedisNotBuilt { .. }), "{err:?}");
    // Merged from a rules store into a file without a `redis` section, the bucket is still the
    // one to name: even with the section, this build could not count it.
    let mut merged = load_str(WITH_REDIS, "store.yaml").unwrap();
    merged.redis = None;
    let err = client.reload(merged).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("service search, bucket exact: store: redis, but this build"),
        "{err}"
    );
    assert_eq!(client.rules().version(), 1, "the old rules stay");
    let orders = RequestAttrs {
        procedure: Some("/orders"),
        ..RequestAttrs::default()
    };
    assert!(client.decide(&orders, &NoHeaders).forwards());
    assert!(!client.decide(&orders, &NoHeaders).forwards());
}
