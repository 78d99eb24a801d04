//! `acquire` waits for capacity by the retry-after instead of failing, within a deadline.

use std::time::Duration;

use spillway_client::{AcquireError, Client, NoHeaders};
use spillway_core::config::load_str;
use spillway_core::decision::Decision;
use spillway_core::pattern::RequestAttrs;
use tokio::time::Instant;

fn client(limit: &str) -> Client {
    let config = load_str(
        &format!("version: 1\nservices:\n  api:\n    buckets:\n      - {{ name: slow, limit: {limit}, algorithm: gcra, burst: 1 }}\n"),
        "test.yaml",
    )
    .unwrap();
    Client::new(config).unwrap()
}

#[tokio::test]
async fn acquire_waits_until_admitted() {
    // One request per 100 ms, no burst beyond one.
    let c = client("1 per 100ms");
    let attrs = RequestAttrs::default();
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..4 {
        assert_eq!(
            c.acquire(&attrs, &NoHeaders, deadline).await,
            Ok(Decision::Allow)
        );
    }
    assert_eq!(c.stats()[0].counters.allowed, 4);
}

#[tokio::test]
async fn acquire_gives_up_at_once_when_the_wait_would_pass_the_deadline() {
    let c = client("1/h");
    let attrs = RequestAttrs::default();
    let far = Instant::now() + Duration::from_secs(10);
    c.acquire(&attrs, &NoHeaders, far).await.unwrap();
    // The next slot is an hour away, past a deadline 10 s from now.
    let err = c.acquire(&attrs, &NoHeaders, far).await.unwrap_err();
    let AcquireError::Deadline {
        service,
        bucket,
        retry_after,
    } = err;
    assert_eq!((service.as_str(), bucket.as_str()), ("api", "slow"));
    assert!(retry_after > Duration::from_secs(3000) && retry_after <= Duration::from_secs(3600));
}
