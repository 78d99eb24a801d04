//! Finding and deciding an Envoy descriptor allocates nothing once its counted values have
//! limiters (DESIGN.md: no allocation per decision): the bucket lookup, a per-value key built of
//! several entries (hashed on the stack when it is long) and every algorithm's quota but the
//! sliding-window log's, which is a list by nature and grows with the traffic in its window.

use spillway_client::{Client, DescriptorStep};
use spillway_core::config::load_str;
use spillway_testkit::alloc::allocations_in;

#[test]
fn descriptor_decisions_allocate_nothing_after_warm_up() {
    let mut yaml = String::from("version: 1\nservices:\n  envoy:\n    buckets:\n");
    for (i, algorithm) in [
        "fixed-window",
        "token-bucket",
        "gcra",
        "leaky-bucket",
        "sliding-window-counter",
        "drop-ratio",
    ]
    .iter()
    .enumerate()
    {
        yaml.push_str(&format!(
            "      - {{ name: shared-{i}, limit: 1000/s, algorithm: {algorithm}, match: {{ descriptor: {{ domain: d, entries: [ {{key: k{i}, value: v}} ] }} }} }}\n"
        ));
        // The control plane holds one limit per bucket: no per-value bucket on drop-ratio.
        if *algorithm != "drop-ratio" {
            yaml.push_str(&format!(
                "      - {{ name: each-{i}, limit: 1000/s, algorithm: {algorithm}, match: {{ descriptor: {{ domain: d, entries: [ {{key: k{i}}}, {{key: user}}, {{key: path, value: \"/api*\"}} ] }} }} }}\n"
            ));
        }
    }
    let client = Client::new(load_str(&yaml, "test.yaml").unwrap()).unwrap();
    let long = "u".repeat(400);
    let owned: Vec<Vec<(String, String)>> = (0..6)
        .flat_map(|i| {
            let long = long.clone();
            [
                vec![(format!("k{i}"), "v".to_owned())],
                vec![
                    (format!("k{i}"), "x".to_owned()),
                    ("user".to_owned(), "alice".to_owned()),
                    ("path".to_owned(), "/api/v1".to_owned()),
                ],
                vec![
                    (format!("k{i}"), "y".to_owned()),
                    ("user".to_owned(), long),
                    ("path".to_owned(), "/api".to_owned()),
                ],
                vec![("nope".to_owned(), "z".to_owned())],
            ]
        })
        .collect();
    let rules = client.rules();
    let run = || {
        let mut over = 0;
        for entries in &owned {
            let Some(id) = rules.descriptor_bucket("d", entries.as_slice()) else {
                continue;
            };
            match rules.decide_descriptor(client.now(), id, entries.as_slice(), 1) {
                DescriptorStep::Done(status) => over += usize::from(status.is_over_limit()),
                DescriptorStep::Redis(_) => unreachable!("no Redis bucket"),
            }
        }
        over
    };
    assert_eq!(run(), 0);
    assert_eq!(allocations_in(|| (0..20).map(|_| run()).sum::<usize>()), 0);
}
