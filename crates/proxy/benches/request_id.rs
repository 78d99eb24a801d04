//! What a request id costs a forwarded request: keeping the client's, and making a new one
//! (formatting 32 hex digits and copying them into a header value). The forwarding around it
//! costs tens of microseconds (docs/benchmarks.md).
//!
//! `cargo bench -p spillway-proxy --bench request_id`

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue};
use spillway_proxy::request_id::{REQUEST_ID, RequestIds};

fn request_ids(c: &mut Criterion) {
    let ids = RequestIds::default();
    let mut given = HeaderMap::new();
    given.insert(REQUEST_ID, HeaderValue::from_static("checkout-7f3a91"));
    given.insert("host", HeaderValue::from_static("app"));
    c.bench_function("request id: the client's kept", |b| {
        b.iter(|| ids.of(std::hint::black_box(&mut given)))
    });
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("app"));
    c.bench_function("request id: a new one inserted", |b| {
        b.iter(|| {
            let id = ids.of(std::hint::black_box(&mut headers));
            headers.remove(REQUEST_ID);
            id
        })
    });
}

criterion_group!(benches, request_ids);
criterion_main!(benches);
