//! `store: redis` descriptor buckets over RLS: two servers (two sidecars) with their own engines
//! share one exact count in a private `redis-server`, as envoyproxy/ratelimit's replicas share
//! theirs, and each answer says what is left of it.

use std::sync::Arc;

use spillway_client::Client;
use spillway_core::config::load_str;
use spillway_rls::pb::{self, Code, RateLimitServiceClient};
use spillway_rls::{RlsOptions, RlsServer};
use tonic::transport::Channel;

use crate::support::serve_rls;

async fn start(yaml: &str) -> (RlsServer, RateLimitServiceClient<Channel>) {
    let client = Arc::new(Client::new(load_str(yaml, "test.yaml").unwrap()).unwrap());
    serve_rls(client, RlsOptions::default()).await
}

fn request(user: &str) -> pb::RateLimitRequest {
    pb::request("api", &[&[("user", user)]])
}

#[tokio::test]
async fn two_servers_share_one_exact_count_per_value_in_redis() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let yaml = format!(
        "version: 1\nredis: {{ url: \"{}\", timeout: 1s }}\nservices:\n  envoy:\n    buckets:\n      - {{ name: per-user, limit: 3/h, algorithm: fixed-window, store: redis, match: {{ descriptor: {{ domain: api, entries: [ {{key: user}} ] }} }} }}\n",
        redis.url()
    );
    let (_a, mut a) = start(&yaml).await;
    let (_b, mut b) = start(&yaml).await;
    let mut answers = Vec::new();
    for first in [true, false, true, false] {
        let rls = if first { &mut a } else { &mut b };
        let answer = rls.should_rate_limit(request("alice")).await.unwrap();
        let answer = answer.into_inner();
        answers.push((
            Code::try_from(answer.overall_code).unwrap(),
            answer.statuses[0].limit_remaining,
        ));
    }
    assert_eq!(
        answers,
        [
            (Code::Ok, 2),
            (Code::Ok, 1),
            (Code::Ok, 0),
            (Code::OverLimit, 0)
        ]
    );
    // Bob has a count of his own; the window ends on the hour (Unix time), within an hour.
    let bob = b
        .should_rate_limit(request("bob"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(bob.statuses[0].limit_remaining, 2);
    let reset = bob.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!(reset.seconds > 0 || reset.nanos > 0, "{reset:?}");
    assert!(reset.seconds <= 3600, "{reset:?}");
}
