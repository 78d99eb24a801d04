//! What a bucket's `candidate` costs a decision: one request decided against one
//! bucket, without a candidate and with one (the twin tried in shadow beside it), for a local
//! token bucket and for a drop-ratio bucket, in one run so the price reads as a ratio; and the
//! same request against rules where another bucket has the candidate, which must cost nothing.
//! Run: `cargo bench -p spillway-client --bench candidate -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use spillway_client::Client;
use spillway_core::config;
use spillway_core::pattern::RequestAttrs;

const CANDIDATE: &str = "candidate: { limit: 900000/s, since: 2026-12-03T07:00:00Z }";

fn client(algorithm: &str, candidate: bool, elsewhere: bool) -> Client {
    let own = if candidate {
        format!(", {CANDIDATE}")
    } else {
        String::new()
    };
    let other = if elsewhere {
        format!(", {CANDIDATE}")
    } else {
        String::new()
    };
    let rules = format!(
        "version: 1
services:
  api:
    buckets:
      - {{ name: search, match: {{ procedure: /search }}, limit: 1000000/s, algorithm: {algorithm}{own} }}
      - {{ name: other, match: {{ procedure: /other }}, limit: 1000000/s, algorithm: {algorithm}{other} }}
"
    );
    Client::new(config::load_str(&rules, "bench.yaml").unwrap()).unwrap()
}

fn bench(c: &mut Criterion) {
    let headers = HeaderMap::new();
    let attrs = RequestAttrs {
        procedure: Some("/search"),
        ..RequestAttrs::default()
    };
    let mut group = c.benchmark_group("decide");
    for algorithm in ["token-bucket", "drop-ratio"] {
        for (name, candidate, elsewhere) in [
            ("no candidate", false, false),
            ("a candidate on the bucket", true, false),
            ("a candidate on another bucket", false, true),
        ] {
            let client = client(algorithm, candidate, elsewhere);
            group.bench_function(format!("{algorithm}: {name}"), |b| {
                b.iter(|| black_box(client.decide(black_box(&attrs), &headers)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
