//! The rules the link carries are bounded as a file is: a message of more buckets than a
//! configuration holds is refused when the host loads it, naming the limit, and the host keeps
//! its rules.

use spillway_core::config::{self, MAX_BUCKETS};
use spillway_loop::{DecodeRules, LinkRules, RulesSnapshot};
use spillway_proto::v1;

fn buckets(count: usize) -> String {
    let mut text = String::from("version: 1\nservices:\n  api:\n    buckets:\n");
    for n in 0..count {
        text.push_str(&format!(
            "      - {{ name: b{n}, limit: 10/s, match: {{ caller: c{n} }} }}\n"
        ));
    }
    text
}

#[test]
fn a_rules_message_over_the_bucket_limit_is_refused_by_the_host() {
    let own = config::load_str("version: 1\nservices: {}\n", "own.yaml").unwrap();
    // As many as the limit go down and load, though rendered with every default they are
    // longer than the file they came from.
    let snapshot = RulesSnapshot::parse(1, &buckets(MAX_BUCKETS), "rules.yaml").unwrap();
    let message = v1::Rules {
        version: 1,
        json: snapshot.json.to_string(),
        ..Default::default()
    };
    let loaded = LinkRules::decode(&message)
        .unwrap()
        .with_own(&own, "control-plane rules")
        .unwrap();
    assert_eq!(loaded.services[0].buckets.len(), MAX_BUCKETS);

    // One more, as a controller that does not check would send it.
    let mut rules = LinkRules::decode(&message).unwrap();
    let mut extra = rules.services.0[0].1.buckets[0].clone();
    extra.name = "one-more".to_owned();
    extra.match_.caller = Some("one-more".to_owned());
    rules.services.0[0].1.buckets.push(extra);
    let message = v1::Rules {
        version: 2,
        json: rules.to_json().unwrap(),
        ..Default::default()
    };
    let err = LinkRules::decode(&message)
        .unwrap()
        .with_own(&own, "control-plane rules")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bucket 20001 of the configuration is over the limit of 20000 buckets"),
        "{err}"
    );
}
