//! `spillway import envoy-ratelimit` as a process: envoyproxy/ratelimit's published example
//! configurations (its README's examples 1 to 9 and its docker-compose demo's `example.yaml`,
//! under `tests/import/`) convert into files that `spillway check` accepts, and the converted
//! buckets decide each request as envoyproxy/ratelimit documents (decided by `spillway_rls::
//! decide`, the RLS server's own call, on a fake clock; and once through a private Redis with
//! the default store). Every file of `tests/import/bad/` is refused with exit 2 and exactly the
//! message of its `.expected` file (`SPILLWAY_BLESS=1` rewrites them after an intended change of
//! wording; review the diff).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use spillway_client::Client;
use spillway_core::clock::FakeClock;
use spillway_core::config;
use spillway_rls::pb::{self, Code, Unit, request};
use spillway_rls::{RlsOptions, decide};

const SPILLWAY: &str = env!("CARGO_BIN_EXE_spillway");
const SEC: u64 = 1_000_000_000;

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `spillway import envoy-ratelimit ARGS...` run from the crate's folder, so that files are
/// named as `tests/import/...` in what it prints.
fn import(args: &[&str]) -> Output {
    Command::new(SPILLWAY)
        .current_dir(crate_dir())
        .args(["import", "envoy-ratelimit"])
        .args(args)
        .output()
        .expect("spillway runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The converted configuration of `args`, which must succeed.
fn converted(args: &[&str]) -> String {
    let out = import(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "spillway import {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn fixture(name: &str) -> String {
    format!("tests/import/{name}")
}

/// The published examples, every `tests/import/*.yaml`.
fn examples() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(crate_dir().join("tests/import"))
        .expect("tests/import exists")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    names.sort();
    names.into_iter().map(|n| fixture(&n)).collect()
}

/// `spillway check -c` on `yaml`, which must pass.
fn check(yaml: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("converted.yaml");
    fs::write(&path, yaml).unwrap();
    let out = Command::new(SPILLWAY)
        .arg("check")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("spillway check runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "spillway check: {}\n{yaml}",
        text(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "spillway check warns: {}",
        text(&out.stderr)
    );
}

#[test]
fn every_published_example_converts_into_a_file_that_passes_check() {
    let all = examples();
    assert!(all.len() >= 11, "only {} examples", all.len());
    for example in &all {
        check(&converted(&[example]));
        check(&converted(&["--store", "local", example]));
    }
    // All of them at once: one service per domain.
    let args: Vec<&str> = all.iter().map(String::as_str).collect();
    let yaml = converted(&args);
    check(&yaml);
    let config = config::load_str(&yaml, "converted.yaml").unwrap();
    assert_eq!(config.services.len(), all.len());
}

#[test]
fn the_default_is_envoyproxy_ratelimits_model_and_the_flags_change_it() {
    let yaml = converted(&[&fixture("example3-edge_proxy_per_ip.yaml")]);
    let config = config::load_str(&yaml, "converted.yaml").unwrap();
    let bucket = &config.services[0].buckets[0];
    assert_eq!(
        (bucket.algorithm.name(), bucket.store.name()),
        ("fixed-window", "redis")
    );
    assert!(config.redis.is_some());
    let yaml = converted(&[
        "--store",
        "local",
        "--algorithm",
        "gcra",
        &fixture("example3-edge_proxy_per_ip.yaml"),
    ]);
    check(&yaml);
    let config = config::load_str(&yaml, "converted.yaml").unwrap();
    for bucket in &config.services[0].buckets {
        assert_eq!(
            (bucket.algorithm.name(), bucket.store.name()),
            ("gcra", "local")
        );
    }
    assert!(config.redis.is_none());
    // The control plane's algorithms count in the control plane: another store is refused
    // before any file is read.
    let out = import(&[
        "--algorithm",
        "drop-ratio",
        "--store",
        "redis",
        "no-such-file.yaml",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--algorithm drop-ratio counts in the control plane"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn drop_ratio_converts_a_file_whose_limited_descriptors_all_carry_values() {
    for example in [
        "example1-mongo_cps.yaml",
        "example7-replaces.yaml",
        "units.yaml",
    ] {
        let example = fixture(example);
        let yaml = converted(&["--algorithm", "drop-ratio", &example]);
        check(&yaml);
        let config = config::load_str(&yaml, "converted.yaml").unwrap();
        assert!(config.redis.is_none(), "{example}");
        for bucket in &config.services[0].buckets {
            assert_eq!(
                (bucket.algorithm.name(), bucket.store.name()),
                ("drop-ratio", "control-plane"),
                "{example}"
            );
        }
    }
}

#[test]
fn detailed_metric_is_ignored_with_a_note_on_stderr() {
    let out = import(&[&fixture("example8-detailed_metric.yaml")]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stderr),
        "tests/import/example8-detailed_metric.yaml:5:22: note: detailed_metric is ignored: Spillway counts per bucket (spillway_requests_total{service,bucket}), never per value\n"
    );
    let yaml = text(&out.stdout);
    assert!(!yaml.contains("detailed_metric:"), "{yaml}");
    check(&yaml);
}

/// A converted configuration decided by the RLS server's own call on a fake clock.
struct Rls {
    runtime: tokio::runtime::Runtime,
    client: Client,
    clock: Arc<FakeClock>,
}

impl Rls {
    /// The buckets `spillway import envoy-ratelimit --store local EXAMPLE` prints.
    fn of(example: &str) -> Rls {
        let yaml = converted(&["--store", "local", &fixture(example)]);
        let config = config::load_str(&yaml, "converted.yaml").unwrap();
        // A second into the epoch's first minute, hour and day: windows end where counted.
        let clock = Arc::new(FakeClock::new(SEC));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime.block_on(async { Client::with_clock(config, clock.clone()).unwrap() });
        Rls {
            runtime,
            client,
            clock,
        }
    }

    fn ask(&self, domain: &str, descriptors: &[&[(&str, &str)]]) -> pb::RateLimitResponse {
        let request = request(domain, descriptors);
        self.runtime
            .block_on(decide(&self.client, &request, &RlsOptions::default()))
            .expect("a well-formed request")
    }

    /// The overall codes of `n` identical requests.
    fn codes(&self, n: usize, domain: &str, descriptors: &[&[(&str, &str)]]) -> Vec<Code> {
        (0..n)
            .map(|_| overall(&self.ask(domain, descriptors)))
            .collect()
    }
}

fn overall(answer: &pb::RateLimitResponse) -> Code {
    Code::try_from(answer.overall_code).unwrap()
}

fn code(status: &pb::DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap()
}

/// (requests per unit, unit) of a status's current limit.
fn limit(status: &pb::DescriptorStatus) -> Option<(u32, Unit)> {
    status
        .current_limit
        .as_ref()
        .map(|l| (l.requests_per_unit, Unit::try_from(l.unit).unwrap()))
}

/// `n` OKs and then one OVER_LIMIT.
fn ok_then_over(n: usize) -> Vec<Code> {
    let mut codes = vec![Code::Ok; n];
    codes.push(Code::OverLimit);
    codes
}

#[test]
fn example_1_gives_each_database_500_a_second() {
    let rls = Rls::of("example1-mongo_cps.yaml");
    let users: &[(&str, &str)] = &[("database", "users")];
    let default: &[(&str, &str)] = &[("database", "default")];
    assert_eq!(rls.codes(501, "mongo_cps", &[users]), ok_then_over(500));
    assert_eq!(rls.codes(500, "mongo_cps", &[default]), vec![Code::Ok; 500]);
    let answer = rls.ask("mongo_cps", &[default]);
    assert_eq!(overall(&answer), Code::OverLimit);
    assert_eq!(limit(&answer.statuses[0]), Some((500, Unit::Second)));
    // Another database has no limit; the next second, users has its 500 again.
    let other = rls.ask("mongo_cps", &[&[("database", "orders")]]);
    assert_eq!(
        (overall(&other), limit(&other.statuses[0])),
        (Code::Ok, None)
    );
    rls.clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(rls.codes(500, "mongo_cps", &[users]), vec![Code::Ok; 500]);
}

#[test]
fn example_2_limits_marketing_to_5_a_day_and_every_message_to_100_a_day_per_number() {
    let rls = Rls::of("example2-messaging.yaml");
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
    let number: &[(&str, &str)] = &[("to_number", "2061111111")];
    // The README's request: both descriptors at once, "a logical OR" of the two decisions.
    assert_eq!(
        rls.codes(6, "messaging", &[marketing, number]),
        ok_then_over(5)
    );
    let answer = rls.ask("messaging", &[marketing, number]);
    assert_eq!(
        (code(&answer.statuses[0]), code(&answer.statuses[1])),
        (Code::OverLimit, Code::Ok)
    );
    assert_eq!(limit(&answer.statuses[0]), Some((5, Unit::Day)));
    assert_eq!(limit(&answer.statuses[1]), Some((100, Unit::Day)));
    // Seven calls, each counted by the number's own limit.
    assert_eq!(answer.statuses[1].limit_remaining, 93);
    // Another number has its own 5 and 100.
    let other: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(rls.codes(5, "messaging", &[other]), vec![Code::Ok; 5]);
    assert_eq!(rls.codes(94, "messaging", &[number]), ok_then_over(93));
}

#[test]
fn example_3_gives_each_address_10_a_second_and_the_listed_one_none() {
    let rls = Rls::of("example3-edge_proxy_per_ip.yaml");
    let one: &[(&str, &str)] = &[("remote_address", "50.0.0.1")];
    assert_eq!(rls.codes(11, "edge_proxy_per_ip", &[one]), ok_then_over(10));
    // The key/value entry is more specific than the key: 50.0.0.5 is over from its first call.
    let blocked = rls.ask("edge_proxy_per_ip", &[&[("remote_address", "50.0.0.5")]]);
    assert_eq!(overall(&blocked), Code::OverLimit);
    assert_eq!(limit(&blocked.statuses[0]), Some((0, Unit::Second)));
    let two: &[(&str, &str)] = &[("remote_address", "50.0.0.2")];
    assert_eq!(
        rls.codes(10, "edge_proxy_per_ip", &[two]),
        vec![Code::Ok; 10]
    );
}

#[test]
fn example_4_matches_only_descriptors_as_deep_as_the_configuration() {
    let rls = Rls::of("example4-depth.yaml");
    let deep: &[(&str, &str)] = &[("key", "value"), ("subkey", "subvalue")];
    let answer = rls.ask("example4", &[deep]);
    assert_eq!(limit(&answer.statuses[0]), Some((300, Unit::Second)));
    assert_eq!(answer.statuses[0].limit_remaining, 299);
    // One entry: the configuration's first level has no limit of its own.
    let shallow = rls.ask("example4", &[&[("key", "value")]]);
    assert_eq!(
        (overall(&shallow), limit(&shallow.statuses[0])),
        (Code::Ok, None)
    );
    let deeper: &[(&str, &str)] = &[("key", "value"), ("subkey", "s"), ("x", "y")];
    let answer = rls.ask("example4", &[deeper]);
    assert_eq!(
        (overall(&answer), limit(&answer.statuses[0])),
        (Code::Ok, None)
    );
}

#[test]
fn example_5_answers_unlimited_descriptors_ok_with_the_largest_remaining() {
    let rls = Rls::of("example5-unlimited.yaml");
    for _ in 0..1000 {
        let answer = rls.ask("internal", &[&[("ldap", "cn=admin")]]);
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(limit(&answer.statuses[0]), None);
        assert_eq!(answer.statuses[0].limit_remaining, u32::MAX);
    }
    let azure: &[(&str, &str)] = &[("azure", "blob")];
    assert_eq!(rls.codes(101, "internal", &[azure]), ok_then_over(100));
}

#[test]
fn example_6_never_limits_a_shadow_mode_user_and_limits_the_other() {
    let rls = Rls::of("example6-shadow_mode.yaml");
    let a: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-a")];
    let b: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-b")];
    // "user-a ... would not get rate-limited regardless of the rate of requests"
    assert_eq!(rls.codes(50, "example6", &[a]), vec![Code::Ok; 50]);
    let answer = rls.ask("example6", &[a]);
    assert_eq!(limit(&answer.statuses[0]), Some((10, Unit::Second)));
    // "user-b would be limited to 20 req / sec"
    assert_eq!(rls.codes(21, "example6", &[b]), ok_then_over(20));
}

#[test]
fn example_7_replaces_the_named_limit_when_both_descriptors_come() {
    let rls = Rls::of("example7-replaces.yaml");
    let one: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let two: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    // "(key_1, value_1), (key_2, value_2), (user, bkthomps): 10 / sec since the (key_1, value_1),
    // (user, bkthomps) rule was replaced and this will not affect the 5 / sec limit"
    for _ in 0..10 {
        let answer = rls.ask("example7", &[one, two]);
        assert_eq!(overall(&answer), Code::Ok);
        assert_eq!(limit(&answer.statuses[0]), None, "replaced");
        assert_eq!(limit(&answer.statuses[1]), Some((10, Unit::Second)));
    }
    assert_eq!(overall(&rls.ask("example7", &[one, two])), Code::OverLimit);
    // "(key_1, value_1), (user, bkthomps): 5 / sec", untouched by the ten above.
    assert_eq!(rls.codes(6, "example7", &[one]), ok_then_over(5));
    // "(key_2, value_2), (user, bkthomps): 10 / sec", spent above.
    assert_eq!(overall(&rls.ask("example7", &[two])), Code::OverLimit);
}

#[test]
fn example_8_limits_any_value_and_the_listed_one_apart() {
    let rls = Rls::of("example8-detailed_metric.yaml");
    let unspecified: &[(&str, &str)] = &[("key1", "unspecified_value")];
    let unspecified2: &[(&str, &str)] = &[("key1", "unspecified_value2")];
    let listed: &[(&str, &str)] = &[("key1", "value1")];
    assert_eq!(rls.codes(11, "example8", &[unspecified]), ok_then_over(10));
    assert_eq!(rls.codes(11, "example8", &[unspecified2]), ok_then_over(10));
    assert_eq!(rls.codes(21, "example8", &[listed]), ok_then_over(20));
}

#[test]
fn example_9_counts_each_value_of_a_prefix_apart() {
    let rls = Rls::of("example9-wildcard.yaml");
    let one: &[(&str, &str)] = &[("key1", "value_1")];
    let two: &[(&str, &str)] = &[("key1", "value_2")];
    assert_eq!(rls.codes(21, "example9", &[one]), ok_then_over(20));
    assert_eq!(rls.codes(21, "example9", &[two]), ok_then_over(20));
    let other = rls.ask("example9", &[&[("key1", "other")]]);
    assert_eq!(
        (overall(&other), limit(&other.statuses[0])),
        (Code::Ok, None)
    );
}

#[test]
fn the_demo_configuration_decides_its_documented_curls() {
    let rls = Rls::of("rl-example.yaml");
    let foo: &[(&str, &str)] = &[("foo", "foo")];
    let bar: &[(&str, &str)] = &[("foo", "foo"), ("bar", "bar")];
    let banned: &[(&str, &str)] = &[("foo", "foo"), ("bar", "banned")];
    let baz: &[(&str, &str)] = &[("foo", "foo"), ("baz", "baz")];
    let shady: &[(&str, &str)] = &[("foo", "foo"), ("baz", "shady")];
    let not_so_shady: &[(&str, &str)] = &[("foo", "foo"), ("baz", "not-so-shady")];
    // `curl localhost:8888/header -H "foo: foo"`: 2 a minute.
    assert_eq!(rls.codes(3, "rl", &[foo]), ok_then_over(2));
    // `-H "foo: foo" -H "bar: bar"`: 3 a minute, below foo.
    assert_eq!(rls.codes(4, "rl", &[bar]), ok_then_over(3));
    // `-H "bar: banned"`: "Ban a particular header value".
    assert_eq!(rls.codes(1, "rl", &[banned]), vec![Code::OverLimit]);
    // `-H "baz: baz"`: "This will be rate limited", at 1 a second.
    assert_eq!(rls.codes(2, "rl", &[baz]), ok_then_over(1));
    // `-H "baz: shady"`: "never be ratelimited since ... shady is in shadow_mode".
    assert_eq!(rls.codes(5, "rl", &[shady]), vec![Code::Ok; 5]);
    // `-H "baz: not-so-shady"`: "subject to rate-limiting", by baz's 1 a second for each value.
    assert_eq!(rls.codes(2, "rl", &[not_so_shady]), ok_then_over(1));
    rls.clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(rls.codes(2, "rl", &[baz]), ok_then_over(1));
    // bay and qux are unlimited; source_cluster = proxy leads to a limit only with mock below.
    let bay = rls.ask("rl", &[&[("foo", "foo"), ("bay", "x")]]);
    assert_eq!(bay.statuses[0].limit_remaining, u32::MAX);
    let qux = rls.ask("rl", &[&[("qux", "x")]]);
    assert_eq!(qux.statuses[0].limit_remaining, u32::MAX);
    let mock: &[(&str, &str)] = &[("source_cluster", "proxy"), ("destination_cluster", "mock")];
    assert_eq!(rls.codes(2, "rl", &[mock]), ok_then_over(1));
    let proxy = rls.ask("rl", &[&[("source_cluster", "proxy")]]);
    assert_eq!(
        (overall(&proxy), limit(&proxy.statuses[0])),
        (Code::Ok, None)
    );
}

#[test]
fn every_unit_is_told_to_envoy_as_the_unit_it_was() {
    let rls = Rls::of("units.yaml");
    for (value, n, unit) in [
        ("second", 1, Unit::Second),
        ("minute", 2, Unit::Minute),
        ("hour", 3, Unit::Hour),
        ("day", 4, Unit::Day),
        ("week", 5, Unit::Week),
        ("month", 6, Unit::Month),
        ("year", 7, Unit::Year),
    ] {
        let descriptor: &[(&str, &str)] = &[("period", value)];
        let answer = rls.ask("units", &[descriptor]);
        assert_eq!(limit(&answer.statuses[0]), Some((n, unit)), "{value}");
        assert_eq!(
            rls.codes(n as usize, "units", &[descriptor]).last(),
            Some(&Code::OverLimit)
        );
    }
    // Listed without a limit: known, answered OK with no limit.
    let allowed = rls.ask("units", &[&[("period", "allowed")]]);
    assert_eq!(
        (overall(&allowed), limit(&allowed.statuses[0])),
        (Code::Ok, None)
    );
}

#[test]
fn unknown_domains_and_unmatched_descriptors_are_ok_one_status_each() {
    let rls = Rls::of("rl-example.yaml");
    let answer = rls.ask("no-such-domain", &[&[("foo", "a")], &[("bar", "b")]]);
    assert_eq!(overall(&answer), Code::Ok);
    assert_eq!(answer.statuses.len(), 2);
    let answer = rls.ask(
        "rl",
        &[&[("nothing", "here")], &[("foo", "a"), ("nope", "b")]],
    );
    assert_eq!(overall(&answer), Code::Ok);
    assert_eq!(answer.statuses.len(), 2);
    assert!(answer.statuses.iter().all(|s| s.current_limit.is_none()));
}

#[test]
fn with_the_default_store_two_processes_share_one_count_in_redis() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let yaml = converted(&[&fixture("example2-messaging.yaml")]);
    let default_url = "url: redis://127.0.0.1:6379";
    assert!(yaml.contains(default_url), "{yaml}");
    let yaml = yaml.replace(default_url, &format!("url: \"{}\"", redis.url()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let load = || Client::new(config::load_str(&yaml, "converted.yaml").unwrap()).unwrap();
        let (a, b) = (load(), load());
        let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "42")];
        let request = request("messaging", &[marketing]);
        let mut seen = Vec::new();
        // Day windows on the Unix epoch: one count across both, as ratelimit's replicas share one.
        for client in [&a, &b, &a, &b, &a, &b] {
            let answer = decide(client, &request, &RlsOptions::default())
                .await
                .unwrap();
            seen.push((overall(&answer), answer.statuses[0].limit_remaining));
        }
        use Code::{Ok, OverLimit};
        assert_eq!(
            seen,
            [(Ok, 4), (Ok, 3), (Ok, 2), (Ok, 1), (Ok, 0), (OverLimit, 0)]
        );
    });
}

fn bad_files(folder: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(crate_dir().join("tests/import").join(folder))
        .expect("the folder of bad files exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_bad_file_exits_2_with_its_place_and_what_is_wrong() {
    let files = bad_files("bad");
    assert!(files.len() >= 20, "only {} bad files", files.len());
    refused_as_expected("bad", files, &[]);
}

/// With `--algorithm drop-ratio` (one count per bucket), a limited descriptor with an entry that
/// counts each value apart (no value, an empty one, a prefix) is refused at that entry, naming
/// the descriptor's line: every file of `tests/import/bad-drop-ratio/`.
#[test]
fn with_drop_ratio_a_descriptor_without_a_value_is_named_at_its_place() {
    let files = bad_files("bad-drop-ratio");
    assert!(files.len() >= 4, "only {} bad files", files.len());
    refused_as_expected("bad-drop-ratio", files, &["--algorithm", "drop-ratio"]);
}

/// Each of `files` (in `tests/import/FOLDER`), imported with `args`, exits 2 with exactly its
/// `.expected` text, which begins `FILE:LINE:COLUMN:`.
fn refused_as_expected(folder: &str, files: Vec<PathBuf>, args: &[&str]) {
    let bless = std::env::var_os("SPILLWAY_BLESS").is_some();
    let mut mismatches = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let relative = format!("tests/import/{folder}/{name}");
        let mut all = args.to_vec();
        all.push(&relative);
        let out = import(&all);
        let got = text(&out.stderr);
        let expected_path = path.with_extension("expected");
        if bless {
            fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let expected = fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} is missing", expected_path.display()));
        if out.status.code() != Some(2) || got != expected || !out.stdout.is_empty() {
            mismatches.push(format!(
                "{name} (exit {:?})\n  expected: {expected}       got: {got}",
                out.status.code()
            ));
        }
        // FILE:LINE:COLUMN: what is wrong.
        let place = got
            .strip_prefix(&format!("{relative}:"))
            .unwrap_or_default();
        let mut parts = place.splitn(3, ':');
        let numbers = (parts.next(), parts.next());
        assert!(
            matches!(numbers, (Some(l), Some(c)) if l.parse::<usize>().is_ok() && c.parse::<usize>().is_ok()),
            "{name}: {got}"
        );
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn two_files_of_one_domain_exit_2_naming_both() {
    let out = import(&[
        &fixture("example1-mongo_cps.yaml"),
        &fixture("example3-edge_proxy_per_ip.yaml"),
        &fixture("example1-mongo_cps.yaml"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "tests/import/example1-mongo_cps.yaml:2:9: domain `mongo_cps` is also the domain of tests/import/example1-mongo_cps.yaml (line 2); envoyproxy/ratelimit refuses two files of one domain (unless MERGE_DOMAIN_CONFIG), and so does the importer: put its descriptors in one file\n"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn an_unreadable_file_exits_2_naming_it() {
    let out = import(&["tests/import/no-such-file.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("tests/import/no-such-file.yaml: cannot read the file: "),
        "{stderr}"
    );
}

/// The fenced blocks of a Markdown text: (language, text).
fn fenced(markdown: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        match &mut current {
            None => {
                if let Some(language) = line.strip_prefix("```") {
                    current = Some((language.to_owned(), String::new()));
                }
            }
            Some(_) if line.starts_with("```") => blocks.extend(current.take()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
        }
    }
    blocks
}

#[test]
fn the_migration_example_of_docs_envoy_md_is_what_the_importer_prints() {
    let docs = fs::read_to_string(crate_dir().join("../../docs/envoy.md")).unwrap();
    let (_, section) = docs
        .split_once("## Migrating from envoyproxy/ratelimit\n")
        .expect("docs/envoy.md has the migration section");
    let section = section.split("\n## ").next().unwrap();
    let blocks = fenced(section);
    let command = "spillway import envoy-ratelimit config/edge.yaml > spillway.yaml";
    assert!(
        blocks
            .iter()
            .any(|(language, text)| language == "sh" && text.contains(command)),
        "the section shows `{command}`"
    );
    let yaml: Vec<&str> = blocks
        .iter()
        .filter(|(language, _)| language == "yaml")
        .map(|(_, text)| text.as_str())
        .collect();
    let [input, output] = yaml[..] else {
        panic!(
            "the section has an input and an output block, not {}",
            yaml.len()
        );
    };
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("config")).unwrap();
    fs::write(dir.path().join("config/edge.yaml"), input).unwrap();
    let out = Command::new(SPILLWAY)
        .current_dir(dir.path())
        .args(["import", "envoy-ratelimit", "config/edge.yaml"])
        .output()
        .expect("spillway runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), output);
    check(output);
}
