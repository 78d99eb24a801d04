//! Token budgets charged at the response over RLS, as Envoy AI Gateway charges them: the route's
//! request-time rate limit sends the descriptor without `hits_addend` (admitted while the budget
//! is not in debt, taking nothing), and its `apply_on_stream_done` twin sends the same
//! descriptor with `hits_addend` = the tokens the response used, which charges the budget without
//! ever being refused. Real sockets, Envoy's generated tonic client; a private `redis-server` for
//! the shared budget.

use std::sync::Arc;
use std::time::Duration;

use spillway_client::Client;
use spillway_core::clock::FakeClock;
use spillway_core::config::load_str;
use spillway_rls::RlsOptions;
use spillway_rls::pb::{self, Code, RateLimitServiceClient};
use tonic::transport::Channel;

use crate::support::serve_rls;

const SEC: u64 = 1_000_000_000;

/// 1,000 tokens an hour per API key, charged by Envoy when the response ends.
const LOCAL: &str = "version: 1
services:
  llm:
    buckets:
      - name: tokens-per-key
        match: { descriptor: { domain: ai, entries: [ {key: api_key} ] } }
        limit: 1000/h
        algorithm: token-bucket
        cost: { response: hits_addend }
      - name: calls
        match: { descriptor: { domain: ai, entries: [ {key: route} ] } }
        limit: 1000/h
        algorithm: token-bucket
";

/// The descriptor `(key, value)`, with `hits_addend` when Envoy sets one.
fn call(key: &str, value: &str, hits_addend: Option<u64>) -> pb::RateLimitRequest {
    let mut request = pb::request("ai", &[&[(key, value)]]);
    request.descriptors[0].hits_addend = hits_addend.map(|value| pb::UInt64Value { value });
    request
}

/// (overall code, the descriptor's limit_remaining, its duration_until_reset).
async fn ask(
    rls: &mut RateLimitServiceClient<Channel>,
    request: pb::RateLimitRequest,
) -> (Code, u32, Duration) {
    let answer = rls.should_rate_limit(request).await.unwrap().into_inner();
    let status = &answer.statuses[0];
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(Duration::ZERO, |d| {
            Duration::new(d.seconds as u64, d.nanos as u32)
        });
    (
        Code::try_from(answer.overall_code).unwrap(),
        status.limit_remaining,
        reset,
    )
}

fn debited(client: &Client, key: &str, value: &str) -> u64 {
    let rules = client.rules();
    let id = rules
        .descriptor_bucket("ai", &[(key, value)][..])
        .expect("a bucket");
    rules.bucket(id).unwrap().budget().debited()
}

#[tokio::test]
async fn a_settlement_charges_past_the_limit_and_answers_ok_then_admissions_wait_out_the_debt() {
    let clock = Arc::new(FakeClock::new(SEC));
    let config = load_str(LOCAL, "test.yaml").unwrap();
    let client = Arc::new(Client::with_clock(config, clock.clone()).unwrap());
    let (_server, mut rls) = serve_rls(client.clone(), RlsOptions::default()).await;

    // The request-time call takes nothing: the budget is whole after it.
    assert_eq!(
        ask(&mut rls, call("api_key", "k1", None)).await,
        (Code::Ok, 1000, Duration::ZERO)
    );
    // Envoy Gateway's `request: { from: Number, number: 0 }` sends 0: an admission too.
    assert_eq!(
        ask(&mut rls, call("api_key", "k1", Some(0))).await.0,
        Code::Ok
    );
    // The response used 1,500 tokens: charged in full, past the limit, and OK.
    let (code, remaining, reset) = ask(&mut rls, call("api_key", "k1", Some(1_500))).await;
    assert_eq!((code, remaining), (Code::Ok, 0));
    assert!(reset > Duration::from_secs(3_600), "{reset:?}");
    assert_eq!(debited(&client, "api_key", "k1"), 1_500);
    // A second settlement while in debt is charged and answered OK as well.
    assert_eq!(
        ask(&mut rls, call("api_key", "k1", Some(100))).await.0,
        Code::Ok
    );
    assert_eq!(debited(&client, "api_key", "k1"), 1_600);

    // In debt by 600 tokens at 1,000 an hour: the next request of k1 is refused until 601
    // tokens have come back (2,163.6 s), and another key is not touched.
    let (code, remaining, reset) = ask(&mut rls, call("api_key", "k1", None)).await;
    assert_eq!((code, remaining), (Code::OverLimit, 0));
    assert!(reset >= Duration::from_millis(2_163_600), "{reset:?}");
    assert_eq!(ask(&mut rls, call("api_key", "k2", None)).await.0, Code::Ok);
    clock.advance_nanos(2_163 * SEC);
    assert_eq!(
        ask(&mut rls, call("api_key", "k1", None)).await.0,
        Code::OverLimit
    );
    clock.advance_nanos(SEC);
    assert_eq!(ask(&mut rls, call("api_key", "k1", None)).await.0, Code::Ok);

    // A bucket without `cost: { response: hits_addend }` reads hits_addend as the request's cost,
    // as before: 1,500 is over its limit of 1,000 and refused, and nothing is taken.
    assert_eq!(
        ask(&mut rls, call("route", "chat", Some(1_500))).await,
        (Code::OverLimit, 1000, Duration::ZERO)
    );
}

#[tokio::test]
async fn a_settlement_on_one_server_puts_the_shared_redis_budget_in_debt_for_both() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let yaml = format!(
        "version: 1
redis: {{ url: \"{}\", timeout: 1s }}
services:
  llm:
    buckets:
      - name: tokens
        match: {{ descriptor: {{ domain: ai, entries: [ {{key: model, value: gpt}} ] }} }}
        limit: 1000/h
        algorithm: gcra
        store: redis
        cost: {{ response: hits_addend }}
",
        redis.url()
    );
    let client = |yaml: &str| Arc::new(Client::new(load_str(yaml, "test.yaml").unwrap()).unwrap());
    let (a_client, b_client) = (client(&yaml), client(&yaml));
    let (_a, mut a) = serve_rls(a_client.clone(), RlsOptions::default()).await;
    let (_b, mut b) = serve_rls(b_client, RlsOptions::default()).await;

    assert_eq!(ask(&mut a, call("model", "gpt", None)).await.0, Code::Ok);
    assert_eq!(ask(&mut b, call("model", "gpt", None)).await.0, Code::Ok);
    // A's response used 1,200 tokens: one Redis debit, answered OK though it is past the limit.
    let (code, remaining, _) = ask(&mut a, call("model", "gpt", Some(1_200))).await;
    assert_eq!((code, remaining), (Code::Ok, 0));
    assert_eq!(debited(&a_client, "model", "gpt"), 1_200);
    // A refuses at once, without asking Redis; B learns of the debt with its own next debit.
    let (code, _, reset) = ask(&mut a, call("model", "gpt", None)).await;
    assert_eq!(code, Code::OverLimit);
    assert!(reset > Duration::from_secs(600), "{reset:?}");
    assert_eq!(
        ask(&mut b, call("model", "gpt", Some(10))).await.0,
        Code::Ok
    );
    assert_eq!(
        ask(&mut b, call("model", "gpt", None)).await.0,
        Code::OverLimit
    );
}
