//! The loaded model: a file gives the values and the documented defaults.

use std::path::Path;
use std::time::Duration;

use spillway_core::config::{
    self, Algorithm, Cost, FailurePolicy, Mode, RedisTarget, Scope, Source, StateStore,
};
use spillway_core::pattern::{Pattern, SubjectKind, SubjectValue};

fn example(name: &str) -> config::Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name);
    config::load_file(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_spec_file_loads_with_the_values_it_states() {
    let config = example("spec.yaml");
    assert_eq!(config.version, 1);
    assert_eq!(config.identity.procedure.0, vec![Source::Path]);
    assert_eq!(config.identity.ip.0, vec![Source::Peer]);
    assert_eq!(config.control.report_interval, Duration::from_secs(1));
    assert_eq!(config.control.instruction_ttl, Duration::from_secs(5));

    let payments = config.service("payments").expect("payments");
    let [charge, search] = &payments.buckets[..] else {
        panic!("two buckets expected");
    };
    assert_eq!(charge.name, "gateway-charge");
    assert_eq!(charge.match_spec.caller, Some(Pattern::new("api-gateway")));
    assert_eq!(charge.limit.per_second(), 5000.0);
    assert_eq!((charge.scope, charge.mode), (Scope::Global, Mode::Enforce));
    assert_eq!(charge.algorithm, Algorithm::DropRatio);
    assert_eq!(charge.store, StateStore::ControlPlane);
    assert_eq!(charge.on_store_failure, FailurePolicy::Open);
    assert_eq!(charge.burst, None);

    let subject = search.match_spec.subject.as_ref().expect("a subject");
    assert_eq!(
        (subject.kind, &subject.value),
        (SubjectKind::User, &SubjectValue::Each)
    );
    assert_eq!(search.limit.period, Duration::from_secs(60));
    assert_eq!(search.store, StateStore::Redis);
    assert_eq!(search.on_store_failure, FailurePolicy::Closed);
    let Cost::Header(cost) = &search.cost else {
        panic!("a header cost expected");
    };
    assert_eq!((cost.header.as_str(), cost.default.get()), ("x-cost", 1));
    assert_eq!(
        config.redis.expect("redis").target,
        RedisTarget::Single {
            url: "redis://127.0.0.1:6379".into()
        }
    );
}

#[test]
fn defaults_follow_the_algorithm() {
    let config = config::load_str(
        "version: 1
services:
  api:
    buckets:
      - { name: a, limit: 10/s }
      - { name: b, limit: 10/s, algorithm: token-bucket, match: { caller: b } }
      - { name: c, limit: 10/s, algorithm: adaptive-token-bucket, match: { caller: c } }
      - { name: d, limit: 10/s, algorithm: gcra, burst: 3, store: redis, match: { caller: d } }
redis: { url: redis://localhost }
",
        "defaults.yaml",
    )
    .unwrap();
    let buckets = &config.services[0].buckets;
    let stores: Vec<StateStore> = buckets.iter().map(|b| b.store).collect();
    assert_eq!(
        stores,
        [
            StateStore::ControlPlane,
            StateStore::Local,
            StateStore::ControlPlane,
            StateStore::Redis
        ]
    );
    let bursts: Vec<Option<u64>> = buckets.iter().map(|b| b.burst.map(|n| n.get())).collect();
    assert_eq!(bursts, [None, Some(10), None, Some(3)]);
    assert_eq!(buckets[2].burst_window, Some(Duration::from_secs(10)));
    assert_eq!(buckets[3].on_store_failure, FailurePolicy::Closed);
    assert_eq!(buckets[1].on_store_failure, FailurePolicy::Open);
    assert_eq!(config.redis.unwrap().timeout, Duration::from_millis(50));
}

#[test]
fn services_keep_file_order() {
    let config = config::load_str(
        "version: 1\nservices:\n  zeta: { buckets: [] }\n  alpha: { buckets: [] }\n  mid: { buckets: [] }\n",
        "order.yaml",
    )
    .unwrap();
    let names: Vec<&str> = config.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["zeta", "alpha", "mid"]);
}

/// The rules service accepts whole configurations in JSON; JSON is YAML, so the same
/// loader reads it, errors included.
#[test]
fn json_configurations_load_too() {
    let json = r#"{"version": 1, "services": {"api": {"buckets": [
        {"name": "gw-a", "match": {"caller": "gw", "procedure": "/a"}, "limit": "100/s", "algorithm": "token-bucket"}
    ]}}}"#;
    let config = config::load_str(json, "rules.json").unwrap();
    assert_eq!(
        config.services[0].buckets[0].algorithm,
        Algorithm::TokenBucket
    );
    let err = config::load_str(&json.replace("100/s", "0/s"), "rules.json").unwrap_err();
    assert_eq!(
        err.to_string(),
        "rules.json:2:81: limit \"0/s\": the count must be at least 1"
    );
}

#[test]
fn the_table_lists_every_bucket_under_its_header() {
    let table = config::render_table(&example("spec.yaml"));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("SERVICE"));
    assert!(lines[0].ends_with("ON FAILURE"));
    assert!(lines[1].starts_with("payments  gateway-charge"));
    assert!(lines[1].contains("caller=api-gateway procedure=/payments.v1.Payments/Charge"));
    assert!(lines[2].contains("procedure=/search user=*"));
    assert!(lines[2].contains("sliding-window-log"));
    assert_eq!(lines[3], "2 buckets in 1 service");
}

#[test]
fn batch_is_off_by_default_and_kept_when_written() {
    let config = config::load_str(
        "version: 1\nredis: { url: redis://127.0.0.1:6379 }\nservices:\n  search:\n    buckets:\n      - { name: hot, match: { procedure: /search }, limit: 5000/s, algorithm: token-bucket, store: redis, batch: 10 }\n      - { name: exact, match: { procedure: /pay }, limit: 50/s, algorithm: token-bucket, store: redis }\n",
        "batch.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let buckets = &config.services[0].buckets;
    assert_eq!(buckets[0].batch, Some(10));
    assert_eq!(buckets[1].batch, None, "exact unless asked");
    // At the largest batch and at a batch equal to the bucket's burst.
    for (limit, batch) in [("5000/s", 1_000), ("10/s", 10)] {
        let text = format!(
            "version: 1\nredis: {{ url: redis://127.0.0.1:6379 }}\nservices:\n  s:\n    buckets:\n      - {{ name: b, limit: {limit}, algorithm: token-bucket, store: redis, batch: {batch} }}\n"
        );
        let loaded = config::load_str(&text, "batch.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded.services[0].buckets[0].batch, Some(batch));
    }
}

#[test]
fn the_schema_describes_batch_with_its_range() {
    let schema = config::json_schema();
    let batch = &schema["$defs"]["BucketFile"]["properties"]["batch"];
    assert_eq!(batch["minimum"], 2, "{batch}");
    assert_eq!(batch["maximum"], 1000, "{batch}");
    assert!(
        batch["description"]
            .as_str()
            .is_some_and(|d| d.contains("store: redis")),
        "{batch}"
    );
}

#[test]
fn a_concurrency_section_loads_with_its_defaults_and_is_off_when_absent() {
    use spillway_core::concurrency::{AlgorithmName, ConcurrencySettings};
    let load = |text: &str| config::load_str(text, "c.yaml").unwrap().concurrency;
    assert_eq!(load("version: 1\n"), None);
    assert_eq!(
        load("version: 1\nconcurrency: {}\n"),
        Some(ConcurrencySettings::adaptive(AlgorithmName::Gradient))
    );
    assert_eq!(
        load("version: 1\nconcurrency: { algorithm: fixed, limit: 64 }\n"),
        Some(ConcurrencySettings::fixed(64))
    );
    assert_eq!(
        load("version: 1\nconcurrency: { algorithm: vegas, min_limit: 2, max_limit: 8 }\n"),
        Some(ConcurrencySettings {
            algorithm: AlgorithmName::Vegas,
            min_limit: 2,
            max_limit: 8,
            initial_limit: 8,
        })
    );
    let schema = config::json_schema();
    let section = &schema["$defs"]["ConcurrencyFile"]["properties"];
    for key in [
        "algorithm",
        "limit",
        "min_limit",
        "max_limit",
        "initial_limit",
    ] {
        assert!(section.get(key).is_some(), "{key} missing from {section}");
    }
    assert!(schema["properties"].get("concurrency").is_some());
}

#[test]
fn a_candidate_is_a_shadow_twin_right_after_its_bucket_and_the_file_order_stays() {
    let text = "version: 1
services:
  api:
    buckets:
      - { name: all, limit: 1000/s, burst: 50, algorithm: token-bucket, candidate: { limit: 800/s, since: 2026-12-03T07:00:00.250Z } }
      - { name: plain, match: { procedure: /x }, limit: 10/s, algorithm: gcra }
";
    let config = config::load_bytes(text.as_bytes(), "c.yaml").unwrap_or_else(|e| panic!("{e}"));
    let api = config.service("api").unwrap();
    let names: Vec<&str> = api.buckets.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["all", "all~candidate", "plain"]);
    let (all, twin, plain) = (&api.buckets[0], &api.buckets[1], &api.buckets[2]);
    let candidate = all
        .candidate
        .as_ref()
        .expect("the bucket keeps its candidate");
    assert_eq!(candidate.limit.per_second(), 800.0);
    assert_eq!(candidate.since_ms, 1_796_281_200_250);
    assert_eq!((all.mode, all.limit.per_second()), (Mode::Enforce, 1000.0));
    assert!(!all.is_candidate() && twin.is_candidate() && !plain.is_candidate());
    assert_eq!(config::candidate_of(&twin.name), Some("all"));
    assert_eq!((twin.mode, twin.limit.per_second()), (Mode::Shadow, 800.0));
    assert_eq!(
        twin.burst.map(|b| b.get()),
        Some(50),
        "a written burst is kept"
    );
    assert_eq!(twin.match_spec, all.match_spec);
    assert_eq!(twin.candidate, None);
    assert_eq!(plain.burst.map(|b| b.get()), Some(10));
    // `spillway check`'s table names the twin by its bucket and counts buckets of the file.
    let table = config::render_table(&config);
    assert!(table.contains("all (candidate)"), "{table}");
    assert!(
        table.ends_with("2 buckets in 1 service, one with a candidate limit on trial\n"),
        "{table}"
    );
}

#[test]
fn a_region_limit_is_the_buckets_limit_in_that_region_and_its_candidate_carries_its_own() {
    let text = "version: 1
services:
  api:
    buckets:
      - name: regional
        limit: 100/s
        scope: region
        region_limits: { eu-west: 40/s, us-east: 2400/min }
        candidate: { limit: 100/s, since: 2026-12-03T07:00:00Z, region_limits: { eu-west: 30/s } }
";
    let config = config::load_bytes(text.as_bytes(), "c.yaml").unwrap_or_else(|e| panic!("{e}"));
    let api = config.service("api").unwrap();
    let (bucket, twin) = (&api.buckets[0], &api.buckets[1]);
    assert_eq!(bucket.limit_in("eu-west").per_second(), 40.0);
    assert_eq!(bucket.limit_in("us-east").per_second(), 40.0);
    assert_eq!(bucket.limit_in("ap-south").per_second(), 100.0);
    assert_eq!(twin.limit_in("eu-west").per_second(), 30.0);
    assert_eq!(
        twin.limit_in("us-east").per_second(),
        100.0,
        "the candidate's own"
    );
}

#[test]
fn the_proxy_section_allows_websocket_upgrades_by_default_and_compares_without_case() {
    let load = |text: &str| config::load_str(text, "c.yaml").unwrap().proxy;
    let default = load("version: 1\n");
    assert_eq!(default.upgrades, ["websocket"]);
    assert!(default.allows_upgrade(b"WebSocket"));
    assert!(!default.allows_upgrade(b"h2c"));
    let custom = load("version: 1\nproxy:\n  upgrades: [Foo, websocket, foo]\n");
    assert_eq!(
        custom.upgrades,
        ["foo", "websocket"],
        "lower case, once each"
    );
    assert!(custom.allows_upgrade(b"FOO/2"), "a version after the name");
    assert!(
        load("version: 1\nproxy:\n  upgrades: []\n")
            .upgrades
            .is_empty()
    );
    let schema = config::json_schema();
    assert!(
        schema["$defs"]["ProxyFile"]["properties"]
            .get("upgrades")
            .is_some(),
        "{schema}"
    );
    assert!(schema["properties"].get("proxy").is_some());
}

#[test]
fn a_response_cost_loads_with_its_source_weights_and_fallback() {
    let config = config::load_str(
        "version: 1
services:
  llm:
    buckets:
      - name: tokens
        limit: 100000/min
        algorithm: token-bucket
        cost: { response: \"json:usage\", request: 500, weights: { input_tokens: 1, output_tokens: 4 } }
      - name: by-trailer
        match: { caller: b }
        limit: 100000/min
        algorithm: gcra
        cost: { response: \"trailer:X-Usage-Tokens\", default: 200 }
",
        "t.yaml",
    )
    .unwrap();
    let buckets = &config.services[0].buckets;
    let Cost::Response(tokens) = &buckets[0].cost else {
        panic!("a response cost expected");
    };
    assert_eq!(
        tokens.source().unwrap(),
        config::ResponseSource::Json(vec!["usage".into()])
    );
    assert_eq!((tokens.estimate(), tokens.fallback()), (500, 500));
    assert_eq!(tokens.weights.as_ref().unwrap()["output_tokens"], 4);
    let Cost::Response(trailer) = &buckets[1].cost else {
        panic!("a response cost expected");
    };
    assert_eq!(
        trailer.source().unwrap(),
        config::ResponseSource::Trailer("x-usage-tokens".into())
    );
    assert_eq!((trailer.estimate(), trailer.fallback()), (0, 200));
}

#[test]
fn the_schema_describes_a_response_cost() {
    let schema = config::json_schema();
    let response = &schema["$defs"]["CostResponse"];
    assert_eq!(
        response["required"],
        serde_json::json!(["response"]),
        "{schema}"
    );
    assert_eq!(response["additionalProperties"], serde_json::json!(false));
    assert!(response["properties"]["weights"].is_object());
}

#[test]
fn the_token_budget_example_loads() {
    let config = example("token-budget.yaml");
    let bucket = &config.services[0].buckets[0];
    let Cost::Response(cost) = &bucket.cost else {
        panic!("a response cost expected");
    };
    assert_eq!(cost.fallback(), 2000);
    assert_eq!(bucket.algorithm, Algorithm::TokenBucket);
}
