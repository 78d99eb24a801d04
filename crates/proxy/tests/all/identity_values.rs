//! What the proxy does with identity values a client chose: a comma-joined value is the same
//! field sent twice (RFC 9110 §5.3) and is refused like one, rather than keying a new subject
//! with every list; an untrusted criticality the proxy lowered reaches the upstream as the tier
//! applied, so a hop behind it does not act on the claim.

use crate::recording::{Mode, Recording};
use crate::support::{get, proxy};

const PER_USER: &str = "version: 1\nservices:\n  app:\n    buckets:\n      - name: per-user\n        match: { user: \"*\" }\n        limit: 1/h\n        algorithm: token-bucket\n";

#[tokio::test]
async fn a_comma_in_an_identity_value_is_refused_like_a_repeated_header() {
    let upstream = Recording::start(Mode::Plain).await;
    let running = proxy(PER_USER, &upstream.url()).await;
    let addr = running.proxy.addr();
    assert_eq!(get(addr, "/", &[("x-user-id", "alice")]).await.status, 200);
    // Each new list would have been a new subject with a fresh limit.
    for n in 0..5 {
        let value = format!("alice, {n}");
        let answer = get(addr, "/", &[("x-user-id", &value)]).await;
        assert_eq!(answer.status, 400, "{value:?}: {answer:?}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json")
        );
        assert!(
            answer.body.contains("x-user-id") && answer.body.contains("comma"),
            "the answer names the header and the fault: {}",
            answer.body
        );
        assert!(!answer.body.contains("alice"), "never its value");
    }
    assert_eq!(
        upstream.seen().len(),
        1,
        "only the first request reached the upstream"
    );
    running.proxy.shutdown().await;
}

/// The `rpc-criticality` line of the one request the upstream saw.
fn criticality_seen(upstream: &Recording) -> Option<String> {
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    seen[0]
        .lines()
        .find_map(|line| line.strip_prefix("rpc-criticality:"))
        .map(|value| value.trim().to_owned())
}

#[tokio::test]
async fn an_untrusted_criticality_is_forwarded_as_the_tier_applied() {
    const OPEN: &str =
        "version: 1\nservices:\n  app:\n    buckets:\n      - { name: all, limit: 1000/s }\n";
    for (sent, forwarded) in [
        // Raised above the default: held to it, and said so.
        (Some("critical_plus"), Some("critical")),
        // Lowered: a client may, and the hop behind sees it too.
        (Some("Sheddable"), Some("sheddable")),
        // Not a tier: the default applied.
        (Some("urgent"), Some("critical")),
        // None sent: none invented.
        (None, None),
    ] {
        let upstream = Recording::start(Mode::Plain).await;
        let running = proxy(OPEN, &upstream.url()).await;
        let headers: Vec<(&str, &str)> = sent.map(|v| ("rpc-criticality", v)).into_iter().collect();
        let answer = get(running.proxy.addr(), "/", &headers).await;
        assert_eq!(answer.status, 200);
        assert_eq!(
            criticality_seen(&upstream).as_deref(),
            forwarded,
            "sent {sent:?}"
        );
        running.proxy.shutdown().await;
    }
}

#[tokio::test]
async fn a_trusted_criticality_is_forwarded_as_sent() {
    let yaml = "version: 1\nidentity:\n  criticality_trusted: true\nservices:\n  app:\n    buckets:\n      - { name: all, limit: 1000/s }\n";
    let upstream = Recording::start(Mode::Plain).await;
    let running = proxy(yaml, &upstream.url()).await;
    let answer = get(
        running.proxy.addr(),
        "/",
        &[("rpc-criticality", "critical_plus")],
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        criticality_seen(&upstream).as_deref(),
        Some("critical_plus")
    );
    running.proxy.shutdown().await;
}

#[tokio::test]
async fn a_list_header_by_design_is_read_by_its_first_element() {
    let yaml = PER_USER.replace(
        "version: 1\n",
        "version: 1\nidentity:\n  list_headers: [x-user-id]\n",
    );
    let upstream = Recording::start(Mode::Plain).await;
    let running = proxy(&yaml, &upstream.url()).await;
    let addr = running.proxy.addr();
    assert_eq!(
        get(addr, "/", &[("x-user-id", "alice, 0")]).await.status,
        200
    );
    // Every list that starts with alice is alice, whose one request an hour is spent.
    for n in 1..5 {
        let value = format!("alice, {n}");
        let answer = get(addr, "/", &[("x-user-id", &value)]).await;
        assert_eq!(answer.status, 429, "{value:?}: {answer:?}");
    }
    assert_eq!(
        get(addr, "/", &[("x-user-id", "bob, alice")]).await.status,
        200
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(
        seen[1].contains("x-user-id: bob, alice"),
        "the upstream gets the list as sent: {seen:?}"
    );
    running.proxy.shutdown().await;
}
