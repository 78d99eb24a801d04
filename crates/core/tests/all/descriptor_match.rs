//! The descriptor matcher against envoyproxy/ratelimit's documented matching (its README's
//! examples 3, 4 and 9 and `examples/ratelimit/config/example.yaml`): one most specific bucket per
//! request descriptor, exact key and value before a wildcard before a bare key, entry by entry,
//! at the request's depth, never backtracking.

use spillway_core::config;
use spillway_core::decision::BucketId;
use spillway_core::descriptor::DescriptorMatcher;

/// The matcher of a configuration's descriptor buckets, and their names by id.
fn compile(yaml: &str) -> (DescriptorMatcher, Vec<String>) {
    let config = config::load_str(yaml, "test.yaml").unwrap();
    let names: Vec<String> = config.buckets().map(|(_, b)| b.name.clone()).collect();
    let matcher = DescriptorMatcher::compile(
        config
            .buckets()
            .enumerate()
            .filter_map(|(i, (_, b))| b.descriptor.as_ref().map(|d| (BucketId(i as u32), d))),
    );
    (matcher, names)
}

fn find(
    m: &(DescriptorMatcher, Vec<String>),
    domain: &str,
    entries: &[(&str, &str)],
) -> Option<String> {
    m.0.find(domain, entries).map(|id| m.1[id.index()].clone())
}

/// envoyproxy/ratelimit's published example (`examples/ratelimit/config/example.yaml`), written
/// as Spillway buckets.
const RL: &str = r#"
version: 1
services:
  rl:
    buckets:
      - { name: proxy-mock, limit: 1/min, algorithm: fixed-window, match: { descriptor: { domain: rl, entries: [ {key: source_cluster, value: proxy}, {key: destination_cluster, value: mock} ] } } }
      - { name: foo, limit: 2/min, algorithm: fixed-window, match: { descriptor: { domain: rl, entries: [ {key: foo} ] } } }
      - { name: foo-bar, limit: 3/min, algorithm: fixed-window, match: { descriptor: { domain: rl, entries: [ {key: foo}, {key: bar} ] } } }
      - { name: foo-bar-banned, limit: 1/min, algorithm: fixed-window, match: { descriptor: { domain: rl, answer: over-limit, entries: [ {key: foo}, {key: bar, value: banned} ] } } }
      - { name: foo-baz, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: rl, entries: [ {key: foo}, {key: baz} ] } } }
      - { name: foo-bay, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: rl, answer: unlimited, entries: [ {key: foo}, {key: bay} ] } } }
      - { name: foo-baz-shady, limit: 1/min, algorithm: fixed-window, mode: shadow, match: { descriptor: { domain: rl, entries: [ {key: foo}, {key: baz, value: shady} ] } } }
      - { name: qux, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: rl, answer: unlimited, entries: [ {key: qux} ] } } }
"#;

#[test]
fn the_published_example_matches_as_documented() {
    let m = compile(RL);
    let rl = |entries: &[(&str, &str)]| find(&m, "rl", entries);
    assert_eq!(rl(&[("foo", "foo")]).as_deref(), Some("foo"));
    assert_eq!(
        rl(&[("foo", "foo"), ("bar", "bar")]).as_deref(),
        Some("foo-bar")
    );
    assert_eq!(
        rl(&[("foo", "foo"), ("bar", "banned")]).as_deref(),
        Some("foo-bar-banned")
    );
    assert_eq!(
        rl(&[("foo", "foo"), ("baz", "baz")]).as_deref(),
        Some("foo-baz")
    );
    assert_eq!(
        rl(&[("foo", "foo"), ("baz", "shady")]).as_deref(),
        Some("foo-baz-shady")
    );
    assert_eq!(
        rl(&[("foo", "foo"), ("baz", "not-so-shady")]).as_deref(),
        Some("foo-baz")
    );
    assert_eq!(
        rl(&[("foo", "x"), ("bay", "y")]).as_deref(),
        Some("foo-bay")
    );
    assert_eq!(rl(&[("qux", "q")]).as_deref(), Some("qux"));
    assert_eq!(
        rl(&[("source_cluster", "proxy"), ("destination_cluster", "mock")]).as_deref(),
        Some("proxy-mock")
    );
    // Only the full path has a limit: the placeholder level alone has none (README, Example 2).
    assert_eq!(rl(&[("source_cluster", "proxy")]), None);
    assert_eq!(
        rl(&[("source_cluster", "other"), ("destination_cluster", "mock")]),
        None
    );
    // Deeper than the configuration (README, Example 4), unknown keys, another domain.
    assert_eq!(rl(&[("qux", "q"), ("more", "x")]), None);
    assert_eq!(rl(&[("foo", "f"), ("bar", "b"), ("baz", "z")]), None);
    assert_eq!(rl(&[("nope", "x")]), None);
    assert_eq!(rl(&[("bar", "b")]), None);
    // `foo` has no branch `qux`, and the walk does not fall back to `foo`'s one-entry bucket.
    assert_eq!(rl(&[("foo", "a"), ("qux", "b")]), None);
    assert_eq!(find(&m, "other", &[("foo", "foo")]), None);
    assert_eq!(rl(&[]), None);
}

#[test]
fn key_value_before_wildcard_before_bare_key() {
    // README, Example 3 (a generic per-IP limit and a blocked address) and Example 9 (wildcards).
    let m = compile(
        r#"
version: 1
services:
  edge:
    buckets:
      - { name: per-ip, limit: 10/s, algorithm: fixed-window, match: { descriptor: { domain: edge, entries: [ {key: remote_address} ] } } }
      - { name: blocked, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: edge, answer: over-limit, entries: [ {key: remote_address, value: 50.0.0.5} ] } } }
      - { name: net-50, limit: 5/s, algorithm: fixed-window, match: { descriptor: { domain: edge, entries: [ {key: remote_address, value: "50.0.*"} ] } } }
      - { name: net-5, limit: 5/s, algorithm: fixed-window, match: { descriptor: { domain: edge, entries: [ {key: remote_address, value: "50.*"} ] } } }
"#,
    );
    let ip = |v: &str| find(&m, "edge", &[("remote_address", v)]);
    assert_eq!(ip("50.0.0.5").as_deref(), Some("blocked"));
    // Two wildcards match: the first in the file wins, as in envoyproxy/ratelimit.
    assert_eq!(ip("50.0.0.1").as_deref(), Some("net-50"));
    assert_eq!(ip("50.1.0.1").as_deref(), Some("net-5"));
    assert_eq!(ip("10.0.0.1").as_deref(), Some("per-ip"));
    assert_eq!(ip("").as_deref(), Some("per-ip"));
}

#[test]
fn the_walk_never_backtracks_to_a_less_specific_entry() {
    // (k=a) takes the exact branch; its children know no `n`, so the request gets no limit even
    // though the bare `k` branch has one for `n`: envoyproxy/ratelimit's GetLimit does the same.
    let m = compile(
        r#"
version: 1
services:
  s:
    buckets:
      - { name: exact-m, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: k, value: a}, {key: m} ] } } }
      - { name: bare-n, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: k}, {key: n} ] } } }
"#,
    );
    assert_eq!(
        find(&m, "d", &[("k", "a"), ("m", "1")]).as_deref(),
        Some("exact-m")
    );
    assert_eq!(
        find(&m, "d", &[("k", "b"), ("n", "1")]).as_deref(),
        Some("bare-n")
    );
    assert_eq!(find(&m, "d", &[("k", "a"), ("n", "1")]), None);
}

#[test]
fn domains_span_services_and_keys_compare_apart_from_values() {
    let m = compile(
        r#"
version: 1
services:
  one:
    buckets:
      - { name: ab-c, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: a_b, value: c} ] } } }
  two:
    buckets:
      - { name: a-bc, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: a, value: b_c} ] } } }
"#,
    );
    assert_eq!(find(&m, "d", &[("a_b", "c")]).as_deref(), Some("ab-c"));
    assert_eq!(find(&m, "d", &[("a", "b_c")]).as_deref(), Some("a-bc"));
}

#[test]
fn descriptors_that_differ_only_in_punctuation_are_told_apart() {
    // A key may hold `=`, `,` or `: ` (Envoy's `generic_key` takes any text): `a=b` with any
    // value is not `a` with the value `b`, nor is the domain `x: y` the domain `x` with a key `y`.
    // Each is a bucket of its own, and its text (the Redis key's, `spillway check`'s) differs.
    let yaml = r#"
version: 1
services:
  s:
    buckets:
      - { name: key-with-equals, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: "a=b"} ] } } }
      - { name: key-and-value, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: a, value: b} ] } } }
      - { name: two-keys, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: a}, {key: b} ] } } }
      - { name: key-with-comma, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: d, entries: [ {key: "a, b"} ] } } }
      - { name: spaced-domain, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: "x: y", entries: [ {key: z} ] } } }
      - { name: plain-domain, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: x, entries: [ {key: "y: z"} ] } } }
"#;
    let config = config::load_str(yaml, "test.yaml").unwrap_or_else(|e| panic!("{e}"));
    let texts: Vec<String> = config
        .buckets()
        .map(|(_, b)| b.descriptor.as_ref().unwrap().to_string())
        .collect();
    for (i, text) in texts.iter().enumerate() {
        assert!(!texts[..i].contains(text), "{text} twice in {texts:?}");
    }
    assert_eq!(texts[1], "d: a=b");
    assert_eq!(texts[0], r#"d: "a=b""#);
    let m = compile(yaml);
    assert_eq!(
        find(&m, "d", &[("a=b", "b")]).as_deref(),
        Some("key-with-equals")
    );
    assert_eq!(
        find(&m, "d", &[("a", "b")]).as_deref(),
        Some("key-and-value")
    );
    assert_eq!(
        find(&m, "d", &[("a", "x"), ("b", "y")]).as_deref(),
        Some("two-keys")
    );
    assert_eq!(
        find(&m, "d", &[("a, b", "c")]).as_deref(),
        Some("key-with-comma")
    );
    assert_eq!(
        find(&m, "x: y", &[("z", "1")]).as_deref(),
        Some("spaced-domain")
    );
    assert_eq!(
        find(&m, "x", &[("y: z", "1")]).as_deref(),
        Some("plain-domain")
    );
}

#[test]
fn check_lists_a_descriptor_buckets_answer_replaces_and_cost() {
    let yaml = r#"
version: 1
services:
  edge:
    buckets:
      - { name: per-ip, limit: 10/s, algorithm: fixed-window, match: { descriptor: { domain: edge, entries: [ {key: remote_address} ] } } }
      - { name: blocked, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: edge, answer: over-limit, entries: [ {key: remote_address, value: 50.0.0.5} ] } } }
      - { name: office, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: edge, answer: allow, replaces: [per-ip], entries: [ {key: remote_address, value: "10.1.*"} ] } } }
      - { name: ldap, limit: 1/s, algorithm: fixed-window, match: { descriptor: { domain: edge, answer: unlimited, entries: [ {key: ldap} ] } } }
"#;
    let table = config::render_table(&config::load_str(yaml, "test.yaml").unwrap());
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} in\n{table}"))
            .to_owned()
    };
    let per_ip = row("per-ip");
    assert!(
        per_ip.contains("descriptor edge: remote_address "),
        "{per_ip}"
    );
    assert!(per_ip.contains(" 10/s "), "{per_ip}");
    // The cost is Envoy's hits_addend, never a configured one.
    assert!(per_ip.contains(" hits_addend "), "{per_ip}");
    let blocked = row("blocked");
    assert!(
        blocked.contains("remote_address=50.0.0.5 answer=over-limit "),
        "{blocked}"
    );
    let office = row("office");
    assert!(
        office.contains("remote_address=10.1.* answer=allow replaces=per-ip "),
        "{office}"
    );
    assert!(row("ldap").contains("ldap answer=unlimited "), "{table}");
}

#[test]
fn the_schema_describes_descriptor_buckets() {
    let schema = config::json_schema();
    let defs = &schema["$defs"];
    let descriptor = &defs["MatchFile"]["properties"]["descriptor"];
    assert!(
        descriptor.to_string().contains("#/$defs/DescriptorFile"),
        "{descriptor}"
    );
    let file = &defs["DescriptorFile"];
    assert_eq!(file["additionalProperties"], false);
    assert_eq!(file["required"], serde_json::json!(["domain", "entries"]));
    assert_eq!(
        file["properties"]["answer"]["$ref"],
        "#/$defs/DescriptorAnswer"
    );
    let answers: Vec<&str> = defs["DescriptorAnswer"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["const"].as_str().unwrap())
        .collect();
    assert_eq!(answers, ["limit", "unlimited", "allow", "over-limit"]);
    let entry = &defs["DescriptorEntryFile"];
    assert_eq!(entry["additionalProperties"], false);
    assert_eq!(entry["required"], serde_json::json!(["key"]));
}
