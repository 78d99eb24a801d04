//! Lookup latency of the compiled matcher, against a linear scan of `MatchSpec::matches` as the
//! baseline, on one bucket and on a 1,000-bucket configuration, for a hit and for a miss.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use spillway_core::decision::BucketId;
use spillway_core::matcher::Matcher;
use spillway_core::pattern::{MatchSpec, RequestAttrs};

mod common;
use common::{one_bucket, one_bucket_hit, thousand_buckets, thousand_buckets_hit};

fn bench_case(c: &mut Criterion, name: &str, specs: &[MatchSpec], request: RequestAttrs<'_>) {
    let matcher = Matcher::compile(specs);
    let mut out = matcher.matches_buffer();
    c.bench_function(&format!("matcher/{name}"), |b| {
        b.iter(|| {
            matcher.find(black_box(&request), &mut out);
            black_box(out.len())
        })
    });
    let mut found: Vec<BucketId> = Vec::with_capacity(specs.len());
    c.bench_function(&format!("linear_scan/{name}"), |b| {
        b.iter(|| {
            found.clear();
            let request = black_box(&request);
            found.extend(
                (0..)
                    .zip(specs)
                    .filter(|(_, s)| s.matches(request))
                    .map(|(i, _)| BucketId(i)),
            );
            black_box(found.len())
        })
    });
    // The two must agree, or the numbers compare different work.
    matcher.find(&request, &mut out);
    let expected: Vec<BucketId> = (0..)
        .zip(specs)
        .filter(|(_, s)| s.matches(&request))
        .map(|(i, _)| BucketId(i))
        .collect();
    assert_eq!(out.as_slice(), expected.as_slice(), "{name}");
}

fn lookups(c: &mut Criterion) {
    let one = one_bucket();
    let hit = one_bucket_hit();
    let miss = RequestAttrs {
        caller: Some("api-gateway"),
        procedure: Some("/payments.v1.Payments/Refund"),
        ..RequestAttrs::default()
    };
    bench_case(c, "1_bucket/hit", &one, hit);
    bench_case(c, "1_bucket/miss", &one, miss);

    let thousand = thousand_buckets();
    let hit = thousand_buckets_hit();
    let miss = RequestAttrs {
        caller: Some("svc-999"),
        procedure: Some("/other.v1.Other/Call"),
        ..RequestAttrs::default()
    };
    bench_case(c, "1000_buckets/hit", &thousand, hit);
    bench_case(c, "1000_buckets/miss", &thousand, miss);
}

criterion_group!(benches, lookups);
criterion_main!(benches);
