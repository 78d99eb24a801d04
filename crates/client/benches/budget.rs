//! What a token budget costs a decision: a request decided against a bucket whose cost the
//! response reports (admitted while not in debt, leaving a charge to settle), and the settlement
//! at the response's end, beside the same request against a plain token bucket in the same run,
//! so the price reads as a ratio. A local budget, and one of the control plane (a drop-ratio
//! bucket counting tokens).
//! Run: `cargo bench -p spillway-client --bench budget -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use spillway_client::{BudgetCharges, Client, NoHeaders, Step};
use spillway_core::config;
use spillway_core::pattern::RequestAttrs;

fn client(bucket: &str) -> Client {
    let rules = format!(
        "version: 1\nservices:\n  llm:\n    buckets:\n      - {{ name: tokens, match: {{ procedure: /v1/chat/completions }}, {bucket} }}\n"
    );
    Client::new(config::load_str(&rules, "bench.yaml").unwrap()).unwrap()
}

fn bench(c: &mut Criterion) {
    let attrs = RequestAttrs {
        procedure: Some("/v1/chat/completions"),
        ..RequestAttrs::default()
    };
    // Limits no run can reach: every request is admitted.
    let plain = client("limit: 1000000000/s, algorithm: token-bucket");
    let local = client(
        "limit: 1000000000/s, algorithm: token-bucket, cost: { response: \"json:usage.total_tokens\" }",
    );
    let control = client(
        "limit: 1000000000/s, algorithm: drop-ratio, store: control-plane, cost: { response: \"json:usage.total_tokens\" }",
    );
    let mut group = c.benchmark_group("budget");
    group.bench_function("a plain token bucket: decide", |b| {
        b.iter(|| black_box(plain.decide(black_box(&attrs), &NoHeaders)))
    });
    for (name, client) in [("local", &local), ("control-plane", &control)] {
        let rules = client.rules();
        group.bench_function(format!("a {name} budget: admit"), |b| {
            b.iter(|| {
                let mut charges = BudgetCharges::new();
                let step =
                    rules.begin_charged(client.now(), black_box(&attrs), &NoHeaders, &mut charges);
                // Read in place, as the proxy reads them for its headers; dropped here.
                black_box((matches!(step, Step::Done(_)), &charges));
            })
        });
        group.bench_function(format!("a {name} budget: admit and settle"), |b| {
            b.iter(|| {
                let mut charges = BudgetCharges::new();
                let _ =
                    rules.begin_charged(client.now(), black_box(&attrs), &NoHeaders, &mut charges);
                for charge in charges.iter() {
                    black_box(charge.settle(client.now(), Some(black_box(100))));
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
