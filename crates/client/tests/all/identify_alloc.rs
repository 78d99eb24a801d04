//! Proves that reading a request's identity allocates nothing (DESIGN.md: identify, match and
//! decide allocate nothing), whatever the path and headers: the default identity, `x-forwarded-for`
//! counted past trusted hops, a path normalised into the stack buffer. Only a path longer than the
//! stack buffer that needs normalising, and a refused identity (whose 400 allocates anyway), may
//! allocate. A global allocator counts the allocations of one thread.

use spillway_testkit::alloc::allocations_in;

use http::HeaderMap;
use spillway_client::{IdentityExtractor, PathBuffer};
use spillway_core::config;

fn extractor(identity: &str) -> IdentityExtractor {
    let text = format!("version: 1\nidentity: {identity}\n");
    IdentityExtractor::new(&config::load_str(&text, "t.yaml").unwrap().identity)
}

#[test]
fn identifying_a_request_allocates_nothing() {
    let default = extractor("{}");
    let xff = extractor(
        "{ ip: header:x-forwarded-for, xff_trusted_hops: 2, caller: \"header:rpc-caller,header:x-caller\" }",
    );
    let mut headers = HeaderMap::new();
    headers.insert("rpc-caller", "api-gateway".parse().unwrap());
    headers.insert("x-user-id", "alice".parse().unwrap());
    headers.append(
        "x-forwarded-for",
        "198.51.100.1, 203.0.113.7".parse().unwrap(),
    );
    headers.append("x-forwarded-for", "10.0.0.5".parse().unwrap());
    let long = format!("/{}", "a".repeat(4000));
    for path in [
        "/payments.v1.Payments/Charge",
        "/%69p//search",
        "/./x/../ip/%2fsearch/",
        long.as_str(),
    ] {
        for identity in [&default, &xff] {
            let n = allocations_in(|| {
                let mut buffer = PathBuffer::new();
                let attrs = identity
                    .attrs(path, &headers, Some("10.0.0.9"), &mut buffer)
                    .unwrap();
                attrs.procedure.map(str::len).unwrap_or(0) + attrs.subjects[3].map_or(0, str::len)
            });
            assert_eq!(n, 0, "{path}");
        }
    }
    let mut buffer = PathBuffer::new();
    let attrs = xff
        .attrs("/", &headers, Some("10.0.0.9"), &mut buffer)
        .unwrap();
    assert_eq!(attrs.subjects[3], Some("203.0.113.7"));
}

#[test]
fn only_a_long_path_that_needs_normalising_allocates() {
    let identity = extractor("{}");
    let long = format!("/%69p/{}", "a".repeat(4000));
    let headers = HeaderMap::new();
    let n = allocations_in(|| {
        let mut buffer = PathBuffer::new();
        let attrs = identity.attrs(&long, &headers, None, &mut buffer).unwrap();
        attrs.procedure.map(str::len)
    });
    assert_eq!(n, 1, "one heap buffer");
}

#[test]
fn a_list_header_and_the_criticality_rewrite_allocate_nothing() {
    let lists = extractor("{ org: header:x-groups, list_headers: [x-groups] }");
    let mut headers = HeaderMap::new();
    headers.append("x-groups", " , acme".parse().unwrap());
    headers.append("x-groups", "acme-eu, acme-us".parse().unwrap());
    headers.insert("rpc-criticality", "critical_plus".parse().unwrap());
    let n = allocations_in(|| {
        let mut buffer = PathBuffer::new();
        let attrs = lists
            .attrs("/", &headers, Some("10.0.0.9"), &mut buffer)
            .unwrap();
        attrs.subjects[1].map_or(0, str::len)
    });
    assert_eq!(n, 0);
    let mut buffer = PathBuffer::new();
    let tier = {
        let attrs = lists.attrs("/", &headers, None, &mut buffer).unwrap();
        assert_eq!(attrs.subjects[1], Some("acme"));
        attrs.criticality
    };
    let n = allocations_in(|| lists.rewrite_criticality(&mut headers, tier));
    assert_eq!(n, 0);
    assert_eq!(headers["rpc-criticality"], "critical");
}
