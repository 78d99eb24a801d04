//! `ShouldRateLimit` over a real socket, called with Envoy's own generated client (tonic, from
//! the `envoy-types` protos), against `examples/envoy-ratelimit.yaml`: envoyproxy/ratelimit's
//! README examples decided request by request on a fake clock, statuses in request order,
//! unknown domains and unmatched descriptors OK, bad requests INVALID_ARGUMENT, the RateLimit
//! response headers, and the decisions counted in the buckets' metrics.

use std::sync::Arc;
use std::time::Duration;

use spillway_client::Client;
use spillway_core::clock::FakeClock;
use spillway_core::config::load_str;
use spillway_rls::pb::{self, Code, RateLimitServiceClient, Unit, request};
use spillway_rls::{RlsOptions, RlsServer};
use tonic::transport::Channel;

use crate::support::serve_rls;

const SEC: u64 = 1_000_000_000;
const EXAMPLE: &str = include_str!("../../../../examples/envoy-ratelimit.yaml");

struct Server {
    rls: RateLimitServiceClient<Channel>,
    client: Arc<Client>,
    clock: Arc<FakeClock>,
    _server: RlsServer,
}

async fn start(yaml: &str, options: RlsOptions) -> Server {
    let clock = Arc::new(FakeClock::new(0));
    let config = load_str(yaml, "examples/envoy-ratelimit.yaml").unwrap();
    let client = Arc::new(Client::with_clock(config, clock.clone()).unwrap());
    let (server, rls) = serve_rls(client.clone(), options).await;
    Server {
        rls,
        client,
        clock,
        _server: server,
    }
}

async fn call(s: &mut Server, request: pb::RateLimitRequest) -> pb::RateLimitResponse {
    s.rls.should_rate_limit(request).await.unwrap().into_inner()
}

fn code(c: i32) -> Code {
    Code::try_from(c).unwrap()
}

/// (code, limit name, requests per unit, unit, remaining) of one status.
fn summary(s: &pb::DescriptorStatus) -> (Code, Option<(String, u32, Unit)>, u32) {
    let limit = s.current_limit.as_ref().map(|l| {
        (
            l.name.clone(),
            l.requests_per_unit,
            Unit::try_from(l.unit).unwrap(),
        )
    });
    (code(s.code), limit, s.limit_remaining)
}

fn reset(s: &pb::DescriptorStatus) -> Option<Duration> {
    s.duration_until_reset
        .as_ref()
        .map(|d| Duration::new(d.seconds as u64, d.nanos as u32))
}

fn limit(name: &str, n: u32, unit: Unit) -> Option<(String, u32, Unit)> {
    Some((name.to_owned(), n, unit))
}

#[tokio::test]
async fn a_fixed_window_per_address_is_over_its_limit_after_n_requests_until_it_resets() {
    let mut s = start(EXAMPLE, RlsOptions::default()).await;
    s.clock.set(250_000_000);
    let ip = [("remote_address", "10.0.0.1")];
    for left in (0..10).rev() {
        let r = call(&mut s, request("edge_proxy_per_ip", &[&ip])).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(r.statuses.len(), 1);
        assert_eq!(
            summary(&r.statuses[0]),
            (Code::Ok, limit("per-ip", 10, Unit::Second), left)
        );
        assert_eq!(reset(&r.statuses[0]), Some(Duration::from_millis(750)));
    }
    let over = call(&mut s, request("edge_proxy_per_ip", &[&ip])).await;
    assert_eq!(code(over.overall_code), Code::OverLimit);
    assert_eq!(
        summary(&over.statuses[0]),
        (Code::OverLimit, limit("per-ip", 10, Unit::Second), 0)
    );
    // Another address has a count of its own.
    let other = call(
        &mut s,
        request("edge_proxy_per_ip", &[&[("remote_address", "10.0.0.2")]]),
    )
    .await;
    assert_eq!(
        (code(other.overall_code), other.statuses[0].limit_remaining),
        (Code::Ok, 9)
    );
    // The next second is a new window.
    s.clock.set(SEC);
    let next = call(&mut s, request("edge_proxy_per_ip", &[&ip])).await;
    assert_eq!(
        (code(next.overall_code), next.statuses[0].limit_remaining),
        (Code::Ok, 9)
    );
    // The blocked address is over its limit from the first request, told 0 per second.
    let blocked = call(
        &mut s,
        request("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]]),
    )
    .await;
    assert_eq!(code(blocked.overall_code), Code::OverLimit);
    assert_eq!(
        summary(&blocked.statuses[0]),
        (Code::OverLimit, limit("blocked-ip", 0, Unit::Second), 0)
    );
    // Every decision is counted in the bucket's metrics (spillway_requests_total).
    let stats = s.client.stats();
    let per_ip = stats.iter().find(|b| b.bucket == "per-ip").unwrap();
    assert_eq!((per_ip.counters.allowed, per_ip.counters.dropped), (12, 1));
}

#[tokio::test]
async fn statuses_follow_request_order_and_any_over_limit_descriptor_is_the_answer() {
    let mut s = start(EXAMPLE, RlsOptions::default()).await;
    // README example 2: each marketing message to a number is two descriptors, the marketing
    // one and the number's own; the sixth marketing message of the day is over the limit, and
    // the number's own count goes on.
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061234567")];
    let number: &[(&str, &str)] = &[("to_number", "2061234567")];
    for left in (0..5).rev() {
        let r = call(&mut s, request("messaging", &[marketing, number])).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(
            r.statuses.iter().map(summary).collect::<Vec<_>>(),
            [
                (Code::Ok, limit("marketing-per-number", 5, Unit::Day), left),
                (
                    Code::Ok,
                    limit("messages-per-number", 100, Unit::Day),
                    95 + left
                ),
            ]
        );
    }
    // The same two descriptors the other way round: the statuses follow.
    let sixth = call(&mut s, request("messaging", &[number, marketing])).await;
    assert_eq!(code(sixth.overall_code), Code::OverLimit);
    assert_eq!(
        sixth.statuses.iter().map(summary).collect::<Vec<_>>(),
        [
            (Code::Ok, limit("messages-per-number", 100, Unit::Day), 94),
            (
                Code::OverLimit,
                limit("marketing-per-number", 5, Unit::Day),
                0
            ),
        ]
    );
    // A full day's window from time 0.
    assert_eq!(reset(&sixth.statuses[0]), Some(Duration::from_secs(86_400)));
    // Example 1: by value; a database no bucket names matches nothing and is OK.
    let mongo = call(
        &mut s,
        request(
            "mongo_cps",
            &[
                &[("database", "users")],
                &[("database", "other")],
                &[("database", "default")],
            ],
        ),
    )
    .await;
    assert_eq!(code(mongo.overall_code), Code::Ok);
    assert_eq!(
        mongo.statuses.iter().map(summary).collect::<Vec<_>>(),
        [
            (Code::Ok, limit("mongo-users", 500, Unit::Second), 499),
            (Code::Ok, None, 0),
            (Code::Ok, limit("mongo-default", 500, Unit::Second), 499),
        ]
    );
    assert_eq!(reset(&mongo.statuses[1]), None);
}

#[tokio::test]
async fn unknown_domains_and_unmatched_descriptors_are_ok_one_status_each() {
    let mut s = start(EXAMPLE, RlsOptions::default()).await;
    let unknown = call(
        &mut s,
        request(
            "no-such-domain",
            &[&[("a", "1")], &[("b", "2"), ("c", "3")]],
        ),
    )
    .await;
    assert_eq!(code(unknown.overall_code), Code::Ok);
    assert_eq!(
        unknown.statuses.iter().map(summary).collect::<Vec<_>>(),
        [(Code::Ok, None, 0), (Code::Ok, None, 0)]
    );
    // A known domain: a key no bucket has, and a descriptor deeper than every bucket.
    let unmatched = call(
        &mut s,
        request(
            "edge_proxy_per_ip",
            &[
                &[("path", "/")],
                &[("remote_address", "10.0.0.1"), ("path", "/")],
            ],
        ),
    )
    .await;
    assert_eq!(
        unmatched.statuses.iter().map(summary).collect::<Vec<_>>(),
        [(Code::Ok, None, 0), (Code::Ok, None, 0)]
    );
    // LDAP is unlimited: OK, no limit, the largest 32-bit remaining, never counted.
    for _ in 0..3 {
        let ldap = call(&mut s, request("internal", &[&[("ldap", "x")]])).await;
        assert_eq!(summary(&ldap.statuses[0]), (Code::Ok, None, u32::MAX));
    }
    let stats = s.client.stats();
    let ldap = stats.iter().find(|b| b.bucket == "ldap").unwrap();
    assert_eq!(ldap.counters.allowed, 0);
}

#[tokio::test]
async fn a_shadow_bucket_over_its_limit_answers_ok_and_counts_a_shadow_drop() {
    let mut s = start(EXAMPLE, RlsOptions::default()).await;
    let azure: &[(&str, &str)] = &[("azure", "tenant-1")];
    for left in [1, 0] {
        let r = call(&mut s, request("internal", &[azure])).await;
        assert_eq!(
            summary(&r.statuses[0]),
            (Code::Ok, limit("azure-watch", 2, Unit::Minute), left)
        );
    }
    let third = call(&mut s, request("internal", &[azure])).await;
    assert_eq!(code(third.overall_code), Code::Ok);
    assert_eq!(
        summary(&third.statuses[0]),
        (Code::Ok, limit("azure-watch", 2, Unit::Minute), 0)
    );
    let stats = s.client.stats();
    let watch = stats.iter().find(|b| b.bucket == "azure-watch").unwrap();
    assert_eq!(
        (watch.counters.allowed, watch.counters.shadow_dropped),
        (2, 1)
    );
}

#[tokio::test]
async fn hits_addend_is_the_cost_and_a_huge_one_is_over_the_limit() {
    let mut s = start(EXAMPLE, RlsOptions::default()).await;
    let ip: &[(&str, &str)] = &[("remote_address", "10.9.9.9")];
    let mut bulk = request("edge_proxy_per_ip", &[ip]);
    bulk.hits_addend = 4;
    let r = call(&mut s, bulk.clone()).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    // A descriptor's own hits_addend wins over the request's.
    bulk.descriptors[0].hits_addend = Some(pb::UInt64Value { value: 5 });
    let r = call(&mut s, bulk.clone()).await;
    assert_eq!(
        (code(r.overall_code), r.statuses[0].limit_remaining),
        (Code::Ok, 1)
    );
    // Larger than any limit: over it, and the server goes on answering.
    for huge in [u64::from(u32::MAX), u64::MAX] {
        let mut r = request("edge_proxy_per_ip", &[ip]);
        r.descriptors[0].hits_addend = Some(pb::UInt64Value { value: huge });
        let answer = call(&mut s, r).await;
        assert_eq!(code(answer.overall_code), Code::OverLimit);
    }
    let mut max = request("edge_proxy_per_ip", &[&[("remote_address", "10.8.8.8")]]);
    max.hits_addend = u32::MAX;
    assert_eq!(code(call(&mut s, max).await.overall_code), Code::OverLimit);
    let last = call(&mut s, request("edge_proxy_per_ip", &[ip])).await;
    assert_eq!(
        (code(last.overall_code), last.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_with_a_message() {
    let mut s = start(EXAMPLE, RlsOptions::default()).await;
    let mut refund = request("internal", &[&[("azure", "x")]]);
    refund.descriptors[0].is_negative_hits = true;
    let cases = [
        (request("", &[&[("k", "v")]]), "the domain is empty"),
        (request("internal", &[]), "no descriptors"),
        (
            request("internal", &[&[("k", "v")], &[]]),
            "descriptors[1] has no entries",
        ),
        (
            request("internal", &[&[("k", "v"), ("", "v")]]),
            "descriptors[0].entries[1] has an empty key",
        ),
        (refund, "is_negative_hits"),
    ];
    for (request, message) in cases {
        let err = s.rls.should_rate_limit(request).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(message), "{}", err.message());
    }
    // Nothing was counted, and the server still answers.
    assert!(s.client.stats().iter().all(|b| b.counters.allowed == 0));
    let ok = call(&mut s, request("internal", &[&[("azure", "x")]])).await;
    assert_eq!(code(ok.overall_code), Code::Ok);
}

#[tokio::test]
async fn response_headers_tell_the_descriptor_with_the_least_remaining() {
    let mut s = start(
        EXAMPLE,
        RlsOptions {
            response_headers: true,
            ..RlsOptions::default()
        },
    )
    .await;
    s.clock.set(15 * SEC + 500_000_000);
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "1")];
    let number: &[(&str, &str)] = &[("to_number", "1")];
    let r = call(
        &mut s,
        request("messaging", &[number, marketing, &[("nothing", "x")]]),
    )
    .await;
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    // The marketing limit has 4 left of 5 a day; its window ends 86384.5 s from now, told in
    // whole seconds.
    assert_eq!(
        headers,
        [
            ("RateLimit-Limit", "5"),
            ("RateLimit-Remaining", "4"),
            ("RateLimit-Reset", "86384"),
        ]
    );
    // No limited descriptor, no headers.
    let none = call(&mut s, request("nowhere", &[&[("a", "b")]])).await;
    assert!(none.response_headers_to_add.is_empty());
    // Off by default.
    let mut plain = start(EXAMPLE, RlsOptions::default()).await;
    let r = call(&mut plain, request("messaging", &[number])).await;
    assert!(r.response_headers_to_add.is_empty());
}

#[tokio::test]
async fn a_bucket_that_another_replaces_is_not_decided() {
    let yaml = "version: 1\nservices:\n  envoy:\n    buckets:\n      - { name: specific, limit: 1/min, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: k1, value: v1}, {key: user, value: bk} ] } } }\n      - { name: wider, limit: 10/min, algorithm: fixed-window, match: { descriptor: { domain: d, replaces: [specific], entries: [ {key: k2, value: v2}, {key: user, value: bk} ] } } }\n";
    let mut s = start(yaml, RlsOptions::default()).await;
    let specific: &[(&str, &str)] = &[("k1", "v1"), ("user", "bk")];
    let wider: &[(&str, &str)] = &[("k2", "v2"), ("user", "bk")];
    for left in [9, 8] {
        let r = call(&mut s, request("d", &[specific, wider])).await;
        assert_eq!(code(r.overall_code), Code::Ok);
        assert_eq!(
            r.statuses.iter().map(summary).collect::<Vec<_>>(),
            [
                (Code::Ok, None, 0),
                (Code::Ok, limit("wider", 10, Unit::Minute), left)
            ]
        );
    }
    // Alone, the specific bucket decides.
    assert_eq!(
        code(call(&mut s, request("d", &[specific])).await.overall_code),
        Code::Ok
    );
    assert_eq!(
        code(call(&mut s, request("d", &[specific])).await.overall_code),
        Code::OverLimit
    );
}

#[tokio::test]
async fn a_descriptors_criticality_entry_is_its_tier_and_is_never_matched() {
    // Criticality over RLS: Envoy's `request_headers` action with `descriptor_key: criticality`
    // names each descriptor's tier. The bucket is matched without that entry, and a drop-ratio
    // bucket drops by it.
    let yaml = "version: 1\nservices:\n  edge:\n    buckets:\n      - name: search\n        match: { descriptor: { domain: edge, entries: [ {key: route, value: search} ] } }\n        limit: 100/s\n";
    let mut s = start(yaml, RlsOptions::default()).await;
    // As the control plane would split 1/3 at 40% sheddable: 5/6 of sheddable, no critical.
    // Here all of sheddable, so each answer is certain.
    let tiers = [0.0, 0.0, 0.0, 1.0].map(spillway_core::algo::Ratio::from_f64);
    s.client
        .set_drop_ratio_tiers(
            "edge",
            "search",
            spillway_core::algo::Ratio::from_f64(1.0 / 3.0),
            &tiers,
            Duration::from_secs(60),
        )
        .unwrap();
    let ask = |tier: Option<&'static str>| {
        let mut entries = vec![("route", "search")];
        entries.extend(tier.map(|t| ("criticality", t)));
        entries
    };
    for _ in 0..20 {
        let shed = call(&mut s, request("edge", &[&ask(Some("sheddable"))])).await;
        assert_eq!(code(shed.overall_code), Code::OverLimit);
        for tier in [
            None,
            Some("critical"),
            Some("sheddable_plus"),
            Some("CRITICAL_PLUS"),
        ] {
            let r = call(&mut s, request("edge", &[&ask(tier)])).await;
            assert_eq!(code(r.overall_code), Code::Ok, "{tier:?}");
            // Matched without the tier entry: the bucket's limit is in the answer.
            assert_eq!(
                summary(&r.statuses[0]).1,
                limit("search", 100, Unit::Second),
                "{tier:?}"
            );
        }
    }
    let stats = s.client.stats();
    let counters = stats
        .iter()
        .find(|b| b.bucket == "search")
        .unwrap()
        .counters;
    use spillway_core::criticality::Criticality;
    assert_eq!(counters.tier(Criticality::Sheddable).dropped, 20);
    assert_eq!(counters.tier(Criticality::SheddablePlus).allowed, 20);
    // A client's own critical_plus counts as critical (identity.criticality_trusted is false).
    assert_eq!(counters.tier(Criticality::CriticalPlus).allowed, 0);
    assert_eq!(counters.tier(Criticality::Critical).allowed, 60);
}
