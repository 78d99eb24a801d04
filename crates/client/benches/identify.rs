//! The first step of the hot path: reading a request's attributes from its path, headers and
//! peer (`IdentityExtractor::attrs`), alone and followed by the whole decision, for the default
//! identity, an `x-forwarded-for` identity and a path that needs normalising; beside it, in the
//! same run, the baseline of what landed before issue 18 (the first value of each header, the
//! path as sent, no checks), so the price of the checks reads as a ratio. Run:
//! `cargo bench -p spillway-client --bench identify -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderName};
use spillway_client::{Client, IdentityExtractor, PathBuffer};
use spillway_core::config;
use spillway_core::pattern::RequestAttrs;

const RULES: &str = "version: 1
identity: { ip: header:x-forwarded-for }
services:
  api:
    buckets:
      - { name: charge, match: { caller: api-gateway, procedure: /payments.v1.Payments/Charge }, limit: 1000000/s }
      - { name: search, match: { procedure: /ip* }, limit: 1000000/s }
";

const GRPC_PATH: &str = "/payments.v1.Payments/Charge";

fn headers(extra: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("host", "payments:8080".parse().unwrap());
    headers.insert("content-type", "application/grpc".parse().unwrap());
    headers.insert("te", "trailers".parse().unwrap());
    headers.insert("rpc-caller", "api-gateway".parse().unwrap());
    headers.insert("x-user-id", "alice".parse().unwrap());
    for (name, value) in extra {
        headers.append(*name, value.parse().unwrap());
    }
    headers
}

/// The extractor as it was before issue 18, for the default identity: `header:rpc-procedure,path`
/// and every header by its first value, `to_str` or absent.
struct Before {
    caller: HeaderName,
    procedure: HeaderName,
    subjects: [HeaderName; 3],
}

impl Before {
    fn new() -> Self {
        let name = |n: &str| n.parse::<HeaderName>().unwrap();
        Self {
            caller: name("rpc-caller"),
            procedure: name("rpc-procedure"),
            subjects: [name("x-user-id"), name("x-org-id"), name("x-api-key")],
        }
    }

    fn attrs<'a>(
        &self,
        path: &'a str,
        headers: &'a HeaderMap,
        peer: Option<&'a str>,
    ) -> RequestAttrs<'a> {
        let header = |name: &HeaderName| headers.get(name)?.to_str().ok();
        let [user, org, api_key] = &self.subjects;
        RequestAttrs {
            caller: header(&self.caller),
            procedure: header(&self.procedure).or(Some(path)),
            subjects: [header(user), header(org), header(api_key), peer],
            criticality: Default::default(),
        }
    }
}

fn bench(c: &mut Criterion) {
    let default = IdentityExtractor::new(&config::IdentitySources::default());
    let before = Before::new();
    let config = config::load_str(RULES, "bench.yaml").unwrap();
    let xff = IdentityExtractor::new(&config.identity);
    let client = Client::new(config).unwrap();
    let plain = headers(&[]);
    let forwarded = headers(&[("x-forwarded-for", "203.0.113.7, 10.0.0.5")]);
    let peer = Some("10.0.0.9");

    let mut group = c.benchmark_group("identify");
    group.bench_function("baseline: before issue 18, default identity", |b| {
        b.iter(|| {
            let attrs = before.attrs(black_box(GRPC_PATH), black_box(&plain), peer);
            black_box(attrs.procedure.map(str::len))
        })
    });
    group.bench_function("default identity, gRPC path", |b| {
        b.iter(|| {
            let mut buffer = PathBuffer::new();
            let attrs = default
                .attrs(black_box(GRPC_PATH), black_box(&plain), peer, &mut buffer)
                .unwrap();
            black_box(attrs.procedure.map(str::len))
        })
    });
    group.bench_function("x-forwarded-for, two hops", |b| {
        b.iter(|| {
            let mut buffer = PathBuffer::new();
            let attrs = xff
                .attrs(
                    black_box(GRPC_PATH),
                    black_box(&forwarded),
                    peer,
                    &mut buffer,
                )
                .unwrap();
            black_box(attrs.subjects[3].map(str::len))
        })
    });
    group.bench_function("path to normalise (/./%69p//search)", |b| {
        b.iter(|| {
            let mut buffer = PathBuffer::new();
            let attrs = default
                .attrs(
                    black_box("/./%69p//search"),
                    black_box(&plain),
                    peer,
                    &mut buffer,
                )
                .unwrap();
            black_box(attrs.procedure.map(str::len))
        })
    });
    group.bench_function("baseline: before issue 18, identify and decide", |b| {
        b.iter(|| {
            let attrs = before.attrs(black_box(GRPC_PATH), black_box(&forwarded), peer);
            black_box(client.decide(&attrs, &forwarded))
        })
    });
    group.bench_function("identify and decide", |b| {
        b.iter(|| {
            let mut buffer = PathBuffer::new();
            let attrs = default
                .attrs(
                    black_box(GRPC_PATH),
                    black_box(&forwarded),
                    peer,
                    &mut buffer,
                )
                .unwrap();
            black_box(client.decide(&attrs, &forwarded))
        })
    });
    group.bench_function("identify (x-forwarded-for) and decide", |b| {
        b.iter(|| {
            let mut buffer = PathBuffer::new();
            let attrs = xff
                .attrs(
                    black_box(GRPC_PATH),
                    black_box(&forwarded),
                    peer,
                    &mut buffer,
                )
                .unwrap();
            black_box(client.decide(&attrs, &forwarded))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
