//! `redis.password_file`: kept as a path (each process reads it), refused when empty or beside a
//! password written in the URL, and never printed with a URL's password.

use std::path::Path;

use spillway_core::config;

const BUCKET: &str = "services:\n  api:\n    buckets:\n      - { name: q, limit: 5/s, algorithm: token-bucket, store: redis }\n";

fn load(redis: &str) -> Result<config::Config, String> {
    config::load_str(&format!("version: 1\nredis: {redis}\n{BUCKET}"), "r.yaml")
        .map_err(|e| e.to_string())
}

#[test]
fn a_password_file_is_kept_as_its_path() {
    let config =
        load("{ url: redis://cache:6379, password_file: /run/secrets/redis-password }").unwrap();
    let redis = config.redis.unwrap();
    assert_eq!(
        redis.password_file.as_deref(),
        Some(Path::new("/run/secrets/redis-password"))
    );
    // Written back as a file would say it, the section keeps the path and nothing else.
    let file = config::RedisFile::from(&redis);
    assert_eq!(
        file.password_file.as_deref(),
        Some(Path::new("/run/secrets/redis-password"))
    );
}

#[test]
fn an_empty_password_file_names_where() {
    let err = load("{ url: redis://cache:6379, password_file: \"\" }").unwrap_err();
    assert!(err.starts_with("r.yaml:2:"), "{err}");
    assert!(err.contains("password_file is empty"), "{err}");
}

#[test]
fn a_password_in_the_url_and_a_password_file_is_refused_without_showing_the_password() {
    let err = load("{ url: \"redis://:hunter2@cache:6379\", password_file: /run/pw }").unwrap_err();
    assert!(err.contains("keep the password in the file only"), "{err}");
    assert!(err.contains("redis://:***@cache:6379"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn a_bad_address_is_reported_without_its_password() {
    let err = load("{ url: \"http://:hunter2@cache:6379\" }").unwrap_err();
    assert!(err.contains("must start with redis://"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn a_configuration_debug_print_shows_no_password() {
    let config = load("{ url: \"redis://app:hunter2@cache:6379\" }").unwrap();
    let printed = format!("{config:?}");
    assert!(printed.contains("redis://app:***@cache:6379"), "{printed}");
    assert!(!printed.contains("hunter2"), "{printed}");
    let file: config::ConfigFile = yaml_serde::from_str(
        "version: 1\nredis: { sentinel: { master: m, nodes: [\"redis://:hunter2@s1:26379\"] } }\n",
    )
    .unwrap();
    let printed = format!("{file:?}");
    assert!(!printed.contains("hunter2"), "{printed}");
}
