//! A token budget of the control plane: the bucket counts tokens, what the client admits at
//! the cost its response settles with and what it drops at the mean cost, and the host's core
//! reports those counts as the interval's offered and admitted load.

use std::time::Duration;

use spillway_client::budget::BudgetCharges;
use spillway_client::{Client, NoHeaders};
use spillway_core::algo::Ratio;
use spillway_core::config::load_str;
use spillway_core::counters::Snapshot;
use spillway_core::decision::Decision;
use spillway_core::pattern::RequestAttrs;
use spillway_loop::{HostCore, HostId, HostTime};

const RULES: &str = "version: 1\nservices:\n  llm:\n    buckets:\n      - name: tokens\n        limit: 10000/s\n        algorithm: drop-ratio\n        store: control-plane\n        cost: { response: \"json:usage.total_tokens\", default: 700 }\n";

fn request() -> RequestAttrs<'static> {
    RequestAttrs {
        procedure: Some("/v1/chat/completions"),
        ..RequestAttrs::default()
    }
}

/// One request: admitted and settled at `cost`, or dropped (`false`).
fn one(client: &Client, cost: Option<u64>) -> bool {
    let rules = client.rules();
    let mut charges = BudgetCharges::new();
    let step = rules.begin_charged(client.now(), &request(), &NoHeaders, &mut charges);
    let spillway_client::Step::Done(decision) = step else {
        panic!("no Redis bucket here");
    };
    if decision != Decision::Allow {
        assert!(
            charges.is_empty(),
            "a dropped request leaves nothing to settle"
        );
        return false;
    }
    let charge = charges.iter().next().expect("a charge to settle");
    assert!(charge.cost().counts_tokens());
    charge.settle(client.now(), cost);
    true
}

fn counters(client: &Client) -> Snapshot {
    client.stats()[0].counters
}

fn at(ms: u64) -> HostTime {
    HostTime {
        clock: ms * 1_000_000,
        unix_ns: ms * 1_000_000,
    }
}

#[test]
fn a_control_plane_budget_counts_tokens_admitted_at_settlement_and_dropped_at_the_mean() {
    let client = Client::new(load_str(RULES, "test rules").unwrap()).unwrap();
    // Before any response settled, a drop counts the default.
    client
        .set_drop_ratio("llm", "tokens", Ratio::ONE, Duration::from_secs(60))
        .unwrap();
    assert!(!one(&client, None));
    assert_eq!(counters(&client).dropped, 700);
    client
        .set_drop_ratio("llm", "tokens", Ratio::ZERO, Duration::from_secs(60))
        .unwrap();
    // Ten admitted, 100 to 1,000 tokens: 5,500 in all, a mean of 550; one unreported, charged
    // the default.
    for cost in (1..=10).map(|i| i * 100) {
        assert!(one(&client, Some(cost)));
    }
    assert!(one(&client, None));
    let after = counters(&client);
    assert_eq!(after.allowed, 5_500 + 700);
    assert_eq!(client.rules().buckets()[0].budget().unreported(), 1);
    // Everything dropped now: each counted at the mean of the eleven, 6,200 / 11 = 564.
    client
        .set_drop_ratio("llm", "tokens", Ratio::ONE, Duration::from_secs(60))
        .unwrap();
    for _ in 0..4 {
        assert!(!one(&client, Some(1)));
    }
    let after = counters(&client);
    assert_eq!(after.dropped, 700 + 4 * 564);
    assert_eq!(after.offered(), 6_200 + 700 + 4 * 564);
    // The surge guard's unit: E[cost^2] / E[cost] of what settled.
    let squares: u64 = (1..=10).map(|i| (i * 100u64).pow(2)).sum::<u64>() + 700 * 700;
    let unit = client.rules().buckets()[0].budget().count_unit();
    assert!((unit - squares as f64 / 6_200.0).abs() < 1e-6, "{unit}");
    // The counters' sum of squares: every count of tokens with its square, the drops' too
    // (the first at the default, four at the mean), for the reports' noise.
    assert_eq!(after.squares, 700 * 700 + squares + 4 * 564 * 564);
}

#[test]
fn the_host_reports_a_budgets_tokens_offered_and_admitted() {
    let config = load_str(RULES, "test rules").unwrap();
    let client = Client::new(config.clone()).unwrap();
    let id = HostId {
        host_id: "h1".into(),
        region: "r1".into(),
        zone: "z1".into(),
    };
    let mut core = HostCore::new(id, &config, 0);
    core.start(at(7_000), &[counters(&client)]);
    // 3 requests admitted, 500, 1,000 and 1,500 tokens; 2 dropped at the mean, 1,000 each.
    for cost in [500, 1_000, 1_500] {
        assert!(one(&client, Some(cost)));
    }
    assert_eq!(core.on_deadline(at(7_750), &[counters(&client)]), None);
    client
        .set_drop_ratio("llm", "tokens", Ratio::ONE, Duration::from_secs(60))
        .unwrap();
    for _ in 0..2 {
        assert!(!one(&client, Some(1_000)));
    }
    let report = core
        .on_deadline(at(8_000), &[counters(&client)])
        .expect("the report of interval 7");
    let bucket = &report.buckets[0];
    assert_eq!(
        (bucket.service.as_str(), bucket.bucket.as_str()),
        ("llm", "tokens")
    );
    assert_eq!(bucket.offered, 5_000, "tokens offered");
    assert_eq!(bucket.allowed, 3_000, "tokens admitted");
    assert_eq!(bucket.offered_tail, Some(2_000), "the tail's tokens");
    // The spread of those tokens: 3.5M for the answers, 1M for each drop.
    assert_eq!(
        bucket.offered_squares,
        Some(5_500_000),
        "the squares of the costs"
    );
}

#[test]
fn a_control_plane_budgets_decision_and_settlement_allocate_nothing() {
    let client = Client::new(load_str(RULES, "test rules").unwrap()).unwrap();
    // Warm up: the thread's match buffer, and one settled response for the mean.
    assert!(one(&client, Some(500)));
    let admitted = spillway_testkit::alloc::allocations_in(|| {
        (0..100)
            .map(|i| usize::from(one(&client, Some(100 + i))))
            .sum::<usize>()
    });
    assert_eq!(admitted, 0, "admitted and settled");
    client
        .set_drop_ratio("llm", "tokens", Ratio::ONE, Duration::from_secs(60))
        .unwrap();
    let dropped = spillway_testkit::alloc::allocations_in(|| {
        (0..100)
            .map(|_| usize::from(one(&client, None)))
            .sum::<usize>()
    });
    assert_eq!(dropped, 0, "dropped at the mean");
}
