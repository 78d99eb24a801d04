//! The stated limits of a configuration: at most `MAX_CONFIG_BYTES` bytes (8 MiB) and
//! `MAX_BUCKETS` buckets (20,000), each refused with an error that names it.

use spillway_core::config::{self, MAX_BUCKETS, MAX_CONFIG_BYTES};

/// A configuration of `count` buckets spread over two services.
fn buckets(count: usize) -> String {
    let mut text = String::from("version: 1\nservices:\n");
    for (service, range) in [("api", 0..count / 2), ("web", count / 2..count)] {
        text.push_str(&format!("  {service}:\n    buckets:\n"));
        for n in range {
            text.push_str(&format!(
                "      - {{ name: b{n}, limit: 10/s, match: {{ caller: c{n} }} }}\n"
            ));
        }
    }
    text
}

#[test]
fn as_many_buckets_as_the_limit_load() {
    let config = config::load_str(&buckets(MAX_BUCKETS), "big.yaml").unwrap();
    let loaded: usize = config.services.iter().map(|s| s.buckets.len()).sum();
    assert_eq!(loaded, MAX_BUCKETS);
}

#[test]
fn one_bucket_more_is_refused_at_that_bucket() {
    let err = config::load_str(&buckets(MAX_BUCKETS + 1), "big.yaml").unwrap_err();
    // The second service's buckets start at line 10,007; its 10,001st is bucket 20,001.
    assert_eq!(
        err.to_string(),
        "big.yaml:20007:9: bucket 20001 of the configuration is over the limit of 20000 \
         buckets; one bucket with a subject of \"*\" (`user: \"*\"`) gives every distinct value \
         a quota of its own"
    );
}

#[test]
fn a_text_over_the_byte_limit_is_refused_unread() {
    let mut text = String::from("version: 1\nservices: {}\n# ");
    text.push_str(&"x".repeat(MAX_CONFIG_BYTES));
    let expected = format!(
        "big.yaml:1:1: the configuration is {} bytes, over the limit of 8388608 bytes (8 MiB); \
         a configuration holds at most 20000 buckets, which fit well within it",
        text.len()
    );
    assert_eq!(
        config::load_str(&text, "big.yaml").unwrap_err().to_string(),
        expected
    );
    assert_eq!(
        config::load_bytes(text.as_bytes(), "big.yaml")
            .unwrap_err()
            .to_string(),
        expected
    );
    // A file is not read past the limit, and its error names its path.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    std::fs::write(&path, &text).unwrap();
    let err = config::load_file(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        expected.replacen("big.yaml", &path.display().to_string(), 1)
    );
    let err = config::check_file(&path).unwrap_err().to_string();
    assert!(err.contains("over the limit of 8388608 bytes"), "{err}");
}
