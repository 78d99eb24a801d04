//! `spillway proxy --rls-listen` called by an outside client: `crates/rls/tests/envoy_client.py`,
//! a Python grpcio client whose stubs are generated from Envoy's own .proto files
//! (`crates/rls/tests/proto`), never from Spillway's code. The proxy serves what `spillway import
//! envoy-ratelimit` makes of envoyproxy/ratelimit's published configurations (its demo's
//! `example.yaml` and its README's example 2), and each answer is checked request by request
//! against what envoyproxy/ratelimit documents: codes, statuses in request order, current limits,
//! `limit_remaining`, the RateLimit headers, OK with one status per descriptor for an unknown
//! domain or an unmatched descriptor, and INVALID_ARGUMENT for bad input.
//!
//! The interpreter is `SPILLWAY_PYTHON` (scripts/test makes a virtual environment with grpcio and
//! grpcio-tools), else `python3`, as for the control plane's attacker (tests/tls.rs).

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::support::{Proxy, SPILLWAY, free_port, upstream};

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// The importer's configuration of envoyproxy/ratelimit's `example.yaml` (domain `rl`) and its
/// README's example 2 (domain `messaging`), counted in the proxy.
fn converted(dir: &Path) -> PathBuf {
    let out = Command::new(SPILLWAY)
        .current_dir(crate_dir())
        .args(["import", "envoy-ratelimit", "--store", "local"])
        .args([
            "tests/import/rl-example.yaml",
            "tests/import/example2-messaging.yaml",
        ])
        .output()
        .expect("spillway runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = dir.join("converted.yaml");
    std::fs::write(&config, &out.stdout).unwrap();
    config
}

/// Runs the Python client against `rls` with `requests`, one JSON answer per request.
fn envoy_client(rls: SocketAddr, requests: &[Value]) -> Vec<Value> {
    let script = crate_dir().join("../rls/tests/envoy_client.py");
    let protos = crate_dir().join("../rls/tests/proto");
    // scripts/test gives a virtual environment with grpcio and grpcio-tools.
    let python = std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = Command::new(python)
        .arg(&script)
        .args(["--proto-dir", &path(&protos)])
        .args(["--target", &rls.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "python runs (scripts/test makes SPILLWAY_PYTHON, a venv with grpcio and grpcio-tools)",
        );
    let mut stdin = child.stdin.take().unwrap();
    for request in requests {
        writeln!(stdin, "{request}").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Envoy client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(answers.len(), requests.len(), "{stdout}");
    answers
}

/// A request of `domain` with one descriptor per list of entries.
fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> Value {
    json!({
        "domain": domain,
        "descriptors": descriptors
            .iter()
            .map(|entries| json!({ "entries": entries }))
            .collect::<Vec<_>>(),
    })
}

/// (code, limit name, requests per unit, unit, remaining) of status `i`, for a compact assert.
fn status(answer: &Value, i: usize) -> (String, Option<(String, u64, String)>, u64) {
    let s = &answer["statuses"][i];
    let limit = s["limit"].as_object().map(|l| {
        (
            l["name"].as_str().unwrap().to_owned(),
            l["requests_per_unit"].as_u64().unwrap(),
            l["unit"].as_str().unwrap().to_owned(),
        )
    });
    (
        s["code"].as_str().unwrap_or("?").to_owned(),
        limit,
        s["remaining"].as_u64().unwrap(),
    )
}

fn limited(
    code: &str,
    name: &str,
    n: u64,
    unit: &str,
    remaining: u64,
) -> (String, Option<(String, u64, String)>, u64) {
    (
        code.to_owned(),
        Some((name.to_owned(), n, unit.to_owned())),
        remaining,
    )
}

fn unlimited(code: &str, remaining: u64) -> (String, Option<(String, u64, String)>, u64) {
    (code.to_owned(), None, remaining)
}

fn code(answer: &Value) -> &str {
    answer["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no code: {answer}"))
}

#[test]
fn envoys_own_protos_get_envoyproxy_ratelimits_documented_answers() {
    let dir = tempfile::tempdir().unwrap();
    let rls: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let proxy = Proxy::start_with(
        &converted(dir.path()),
        upstream(),
        &["--rls-listen", &rls.to_string(), "--rls-response-headers"],
    );
    let foo: &[(&str, &str)] = &[("foo", "a")];
    let banned: &[(&str, &str)] = &[("foo", "a"), ("bar", "banned")];
    let shady: &[(&str, &str)] = &[("foo", "a"), ("baz", "shady")];
    let bay: &[(&str, &str)] = &[("foo", "a"), ("bay", "x")];
    let qux: &[(&str, &str)] = &[("qux", "y")];
    let mock: &[(&str, &str)] = &[("source_cluster", "proxy"), ("destination_cluster", "mock")];
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
    let number: &[(&str, &str)] = &[("to_number", "2061111111")];
    let mut requests = vec![
        request("rl", &[foo]),
        request("rl", &[foo]),
        request("rl", &[foo]),
        request("rl", &[banned]),
        request("rl", &[shady]),
        request("rl", &[shady]),
        request("rl", &[bay]),
        request("rl", &[qux]),
    ];
    // README example 2's request: both descriptors in one call, five marketing messages a day.
    requests.extend((0..6).map(|_| request("messaging", &[marketing, number])));
    requests.extend([
        request("no-such-domain", &[&[("foo", "a")], &[("bar", "b")]]),
        request(
            "rl",
            &[&[("nothing", "here")], &[("foo", "a"), ("qux", "b")]],
        ),
        request("rl", &[foo, qux]),
        // Bad input: an empty domain, no descriptors, a descriptor without entries, an empty key.
        json!({ "domain": "", "descriptors": [{ "entries": [["foo", "a"]] }] }),
        json!({ "domain": "rl", "descriptors": [] }),
        json!({ "domain": "rl", "descriptors": [{ "entries": [] }] }),
        json!({ "domain": "rl", "descriptors": [{ "entries": [["", "a"]] }] }),
        // Huge costs: over any limit, never an overflow, and not counted.
        json!({ "domain": "rl", "descriptors": [{ "entries": mock, "hits_addend": u64::MAX }] }),
        json!({ "domain": "rl", "hits_addend": u32::MAX, "descriptors": [{ "entries": mock }] }),
        request("rl", &[mock]),
    ]);
    let answers = envoy_client(rls, &requests);
    let mut answers = answers.iter();
    let mut next = || answers.next().unwrap();

    // `foo`: 2 a minute (its README's demo: `curl localhost:8888/header -H "foo: foo"`).
    let first = next();
    assert_eq!(code(first), "OK");
    assert_eq!(status(first, 0), limited("OK", "foo", 2, "MINUTE", 1));
    let reset = first["statuses"][0]["reset"].as_f64().unwrap();
    assert!(reset > 0.0 && reset <= 60.0, "{first}");
    assert_eq!(
        first["headers"],
        json!([
            ["RateLimit-Limit", "2"],
            ["RateLimit-Remaining", "1"],
            ["RateLimit-Reset", (reset as u64).to_string()]
        ])
    );
    assert_eq!(status(next(), 0), limited("OK", "foo", 2, "MINUTE", 0));
    let third = next();
    assert_eq!(code(third), "OVER_LIMIT");
    assert_eq!(
        status(third, 0),
        limited("OVER_LIMIT", "foo", 2, "MINUTE", 0)
    );
    // `bar: banned`: requests_per_unit 0, over from the first call.
    let banned = next();
    assert_eq!(code(banned), "OVER_LIMIT");
    assert_eq!(
        status(banned, 0),
        limited("OVER_LIMIT", "foo.bar_banned", 0, "MINUTE", 0)
    );
    // `baz: shady` is in shadow_mode: OK even over its 1 a minute.
    for remaining in [0, 0] {
        let shady = next();
        assert_eq!(code(shady), "OK");
        assert_eq!(
            status(shady, 0),
            limited("OK", "foo.baz_shady", 1, "MINUTE", remaining)
        );
    }
    // `unlimited: true`: OK, no limit, the largest remaining.
    for _ in [bay, qux] {
        let answer = next();
        assert_eq!(code(answer), "OK");
        assert_eq!(status(answer, 0), unlimited("OK", u64::from(u32::MAX)));
        assert_eq!(answer["headers"], json!([]));
    }
    // Example 2: the sixth marketing message is over its 5 a day, the number's 100 a day not.
    for n in 1..=6u64 {
        let answer = next();
        let over = n == 6;
        assert_eq!(
            code(answer),
            if over { "OVER_LIMIT" } else { "OK" },
            "message {n}"
        );
        let first_code = if over { "OVER_LIMIT" } else { "OK" };
        assert_eq!(
            status(answer, 0),
            limited(
                first_code,
                "message_type_marketing.to_number",
                5,
                "DAY",
                5u64.saturating_sub(n)
            )
        );
        assert_eq!(
            status(answer, 1),
            limited("OK", "to_number", 100, "DAY", 100 - n)
        );
    }
    // An unknown domain, and descriptors no bucket decides: OK, one status per descriptor.
    for _ in 0..2 {
        let answer = next();
        assert_eq!(code(answer), "OK");
        assert_eq!(answer["statuses"].as_array().unwrap().len(), 2, "{answer}");
        assert_eq!(status(answer, 0), unlimited("OK", 0));
        assert_eq!(status(answer, 1), unlimited("OK", 0));
    }
    // Statuses in request order; one over-limit descriptor makes the overall code.
    let mixed = next();
    assert_eq!(code(mixed), "OVER_LIMIT");
    assert_eq!(
        status(mixed, 0),
        limited("OVER_LIMIT", "foo", 2, "MINUTE", 0)
    );
    assert_eq!(status(mixed, 1), unlimited("OK", u64::from(u32::MAX)));
    for what in ["domain", "descriptors", "entries", "key"] {
        let answer = next();
        assert_eq!(answer["error"], "INVALID_ARGUMENT", "{what}: {answer}");
        let details = answer["details"].as_str().unwrap();
        assert!(details.contains(what), "{what}: {details}");
    }
    for _ in 0..2 {
        let huge = next();
        assert_eq!(code(huge), "OVER_LIMIT");
        let name = "source_cluster_proxy.destination_cluster_mock";
        assert_eq!(status(huge, 0), limited("OVER_LIMIT", name, 1, "MINUTE", 1));
    }
    let after = next();
    assert_eq!(
        status(after, 0),
        limited(
            "OK",
            "source_cluster_proxy.destination_cluster_mock",
            1,
            "MINUTE",
            0
        )
    );

    let status = proxy.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// Descriptors and entries are capped (64 and 32 by default, beyond any Envoy route's
/// `rate_limits`): one more is INVALID_ARGUMENT that names the count and the cap, before any
/// descriptor is decided, so the 100,000 descriptors of one call that once cost 0.12 s of CPU
/// cost a count; as many as the cap are decided as usual.
#[test]
fn descriptors_and_entries_beyond_the_caps_are_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let rls: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let proxy = Proxy::start_with(
        &converted(dir.path()),
        upstream(),
        &["--rls-listen", &rls.to_string()],
    );
    let qux: &[(&str, &str)] = &[("qux", "y")];
    let entries: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let wide = |n: usize| json!({ "domain": "rl", "descriptors": [{ "entries": &entries[..n] }] });
    let requests = vec![
        request("rl", &[qux; 64]),
        request("rl", &[qux; 65]),
        request("rl", &vec![qux; 100_000]),
        wide(32),
        wide(33),
    ];
    let answers = envoy_client(rls, &requests);
    assert_eq!(code(&answers[0]), "OK");
    assert_eq!(answers[0]["statuses"].as_array().unwrap().len(), 64);
    for (answer, count) in [(&answers[1], "65"), (&answers[2], "100000")] {
        assert_eq!(answer["error"], "INVALID_ARGUMENT", "{answer}");
        let details = answer["details"].as_str().unwrap();
        assert!(
            details.contains(&format!("{count} descriptors")) && details.contains("64"),
            "{details}"
        );
    }
    assert_eq!(code(&answers[3]), "OK", "{}", answers[3]);
    assert_eq!(answers[4]["error"], "INVALID_ARGUMENT", "{}", answers[4]);
    let details = answers[4]["details"].as_str().unwrap();
    assert!(
        details.contains("descriptors[0] has 33 entries") && details.contains("32"),
        "{details}"
    );
    let status = proxy.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
}
