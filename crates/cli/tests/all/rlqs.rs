//! `spillway aggregator --rlqs-listen` as a process, driven by an outside client: Envoy
//! instances written in Python with grpcio, their stubs generated from Envoy's own .proto files
//! (`crates/rls/tests/proto`, never Spillway's code), on a real controller and aggregator.
//! Several instances report usage above a bucket's limit and must be assigned rates that sum to
//! the limit within three report intervals; a bucket removed from the rules is abandoned; a
//! reconnected instance is assigned again; bad usage reports end the stream with
//! INVALID_ARGUMENT; and the listener's loopback rule holds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::fleet::{Proc, aggregator, controller, metric, wait_for};
use crate::support::{SPILLWAY, free_port};

/// Reports every 500 ms; `checkout` a drop-ratio bucket of `limit`/s, `search` a local fixed
/// window of 40/s per instance.
fn rules(limit: u32, with_search: bool) -> String {
    let search = if with_search {
        "      - name: search\n        match: { descriptor: { domain: edge, entries: [ {key: route, value: search} ] } }\n        limit: 40/s\n        algorithm: fixed-window\n"
    } else {
        ""
    };
    format!(
        "version: 1\ncontrol:\n  report_interval: 500ms\n  instruction_ttl: 3s\nservices:\n  edge:\n    buckets:\n      - name: checkout\n        match: {{ descriptor: {{ domain: edge, entries: [ {{key: route, value: checkout}} ] }} }}\n        limit: {limit}/s\n{search}"
    )
}

fn protos() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../rls/tests/proto")
}

fn python() -> String {
    // scripts/test gives a virtual environment with grpcio and grpcio-tools.
    std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A controller following a rules file and one aggregator serving RLQS.
struct Zone {
    dir: tempfile::TempDir,
    _controller: Proc,
    aggregator: Proc,
    aggregator_admin: u16,
    rlqs: u16,
}

impl Zone {
    fn start(rules_yaml: &str) -> Zone {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules_yaml).unwrap();
        let controller_port = free_port();
        let controller = controller(controller_port, &dir.path().join("rules.yaml"), &[]);
        let (rlqs, aggregator_admin) = (free_port(), free_port());
        let aggregator = aggregator(
            free_port(),
            "z1",
            controller_port,
            &[
                "--admin",
                &format!("127.0.0.1:{aggregator_admin}"),
                "--rlqs-listen",
                &format!("127.0.0.1:{rlqs}"),
            ],
        );
        wait_for(Duration::from_secs(30), "the aggregator is ready", || {
            crate::support::get(([127, 0, 0, 1], aggregator_admin).into(), "/readyz")
                .is_ok_and(|(status, _)| status == 200)
        });
        Zone {
            dir,
            _controller: controller,
            aggregator,
            aggregator_admin,
            rlqs,
        }
    }

    fn rewrite(&self, rules_yaml: &str) {
        let path = self.dir.path().join("rules.yaml");
        let tmp = self.dir.path().join("rules.yaml.new");
        std::fs::write(&tmp, rules_yaml).unwrap();
        std::fs::rename(tmp, path).unwrap();
    }
}

/// One JSON line of the client's output.
type Line = serde_json::Value;

/// Runs the client with `args` against the zone's RLQS listener; `during` runs while it does.
fn envoys(zone: &Zone, args: &[&str], during: impl FnOnce()) -> Vec<Line> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rlqs_envoy.py");
    let child = Command::new(python())
        .arg(&script)
        .arg("--proto-dir")
        .arg(protos())
        .args(["--target", &format!("127.0.0.1:{}", zone.rlqs)])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "python runs (scripts/test makes SPILLWAY_PYTHON, a venv with grpcio and grpcio-tools)",
        );
    during();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Envoy client failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn events<'a>(lines: &'a [Line], event: &'a str) -> impl Iterator<Item = &'a Line> + 'a {
    lines.iter().filter(move |l| l["event"] == event)
}

#[test]
fn envoy_instances_over_the_limit_are_assigned_the_limit_and_follow_the_rules() {
    let zone = Zone::start(&rules(150, true));
    let started = Instant::now();
    let lines = envoys(
        &zone,
        &[
            "--route",
            "checkout",
            "--route",
            "search",
            "--route",
            "unknown",
            "--instances",
            "3",
            "--rps",
            "100",
            "--interval",
            "0.5",
            "--seconds",
            "12",
            "--reconnect-at",
            "8",
        ],
        || {
            // The three streams are the aggregator's clients in its own process.
            wait_for(
                Duration::from_secs(5),
                "three RLQS streams attached",
                || {
                    let (_, metrics) = crate::support::get(
                        ([127, 0, 0, 1], zone.aggregator_admin).into(),
                        "/metrics",
                    )
                    .unwrap();
                    metric(&metrics, "spillway_aggregator_local_clients", "") == Some(3.0)
                },
            );
            // The rules lose `search` while the instances run.
            std::thread::sleep(Duration::from_secs(5).saturating_sub(started.elapsed()));
            zone.rewrite(&rules(150, false));
        },
    );
    // Three instances of 100/s against 150/s: each is assigned 50/s, together the limit, within
    // three report intervals (one round per interval) of the first token bucket.
    let rounds: Vec<&Line> = events(&lines, "round").collect();
    let first = rounds
        .iter()
        .position(|r| {
            r["told"]["checkout"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "rate")
        })
        .expect("a token bucket for checkout");
    let converged = rounds[first..]
        .iter()
        .position(|r| {
            r["rates"]["checkout"]
                .as_f64()
                .is_some_and(|s| (s - 150.0).abs() <= 0.05 * 150.0)
        })
        .unwrap_or_else(|| panic!("never converged: {rounds:#?}"));
    assert!(
        converged <= 3,
        "summed to the limit {converged} report intervals after the first token bucket: {rounds:#?}"
    );
    eprintln!("summed to the limit {converged} report intervals after the first token bucket");
    // Every action Envoy can read: whole-second TTLs of at least 2 s.
    for a in events(&lines, "action").filter(|a| a["told"] != "abandon") {
        let ttl = a["ttl"].as_f64().unwrap();
        assert!(ttl >= 2.0 && ttl.fract() == 0.0, "{a}");
    }
    // A bucket id no bucket matches is allowed; the local bucket is a token bucket at its limit
    // per instance until the rules lose it, then abandoned once per instance.
    let told = |route: &str, instance: u64| -> Vec<String> {
        events(&lines, "action")
            .filter(|a| a["route"] == route && a["instance"] == instance)
            .map(|a| match a["told"].as_str().unwrap() {
                "rate" => format!("rate {}", a["rate"]),
                other => other.to_owned(),
            })
            .collect()
    };
    for instance in 0..3 {
        assert!(told("unknown", instance).iter().all(|t| t == "allow"));
        let search = told("search", instance);
        let abandoned = search
            .iter()
            .position(|t| t == "abandon")
            .unwrap_or_else(|| panic!("search never abandoned for {instance}: {search:?}"));
        assert!(
            search[..abandoned].iter().all(|t| t == "rate 40.0"),
            "{search:?}"
        );
        // Envoy reports it again as a new bucket id: now it matches nothing.
        assert!(
            search[abandoned + 1..].iter().all(|t| t == "allow"),
            "{search:?}"
        );
        assert!(abandoned + 1 < search.len(), "{search:?}");
    }
    // Instance 0 reconnected at 8 s and was assigned its 50/s again on the new stream.
    let reconnect = events(&lines, "reconnect").next().expect("a reconnect")["t"]
        .as_f64()
        .unwrap();
    assert!(
        events(&lines, "action").any(|a| a["instance"] == 0
            && a["route"] == "checkout"
            && a["t"].as_f64().unwrap() > reconnect
            && a["told"] == "rate"
            && (a["rate"].as_f64().unwrap() - 50.0).abs() <= 2.5),
        "{lines:#?}"
    );
    assert!(events(&lines, "error").next().is_none(), "{lines:#?}");
    // The streams ended with the client: none attached now. The aggregator stops cleanly.
    wait_for(Duration::from_secs(5), "no RLQS stream attached", || {
        let (_, metrics) =
            crate::support::get(([127, 0, 0, 1], zone.aggregator_admin).into(), "/metrics")
                .unwrap();
        metric(&metrics, "spillway_aggregator_local_clients", "") == Some(0.0)
    });
    let mut aggregator = zone.aggregator;
    let status = crate::support::terminate(&mut aggregator.0, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn bad_usage_reports_are_refused_with_invalid_argument() {
    let zone = Zone::start(&rules(150, false));
    for (bad, says) in [
        ("empty-domain", "domain is empty"),
        ("no-usage", "no bucket_quota_usages"),
        ("no-bucket-id", "no bucket_id"),
        ("no-time-elapsed", "time_elapsed"),
    ] {
        let lines = envoys(
            &zone,
            &["--route", "checkout", "--seconds", "3", "--bad", bad],
            || {},
        );
        let error = events(&lines, "error")
            .next()
            .unwrap_or_else(|| panic!("{bad}: no error in {lines:#?}"));
        assert_eq!(error["code"], "INVALID_ARGUMENT", "{bad}: {error}");
        assert!(
            error["detail"].as_str().unwrap().contains(says),
            "{bad}: {error}"
        );
    }
}

#[test]
fn the_rlqs_listener_is_loopback_only_without_tls() {
    let output = Command::new(SPILLWAY)
        .args([
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--region",
            "r1",
            "--zone",
            "z1",
        ])
        .args(["--controller", "http://127.0.0.1:9"])
        .args(["--rlqs-listen", &format!("0.0.0.0:{}", free_port())])
        .output()
        .expect("spillway aggregator runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--rlqs-listen 0.0.0.0:") && stderr.contains("--insecure-plaintext"),
        "{stderr}"
    );
    // Client SANs are known only over mutual TLS.
    let output = Command::new(SPILLWAY)
        .args([
            "aggregator",
            "--listen",
            "127.0.0.1:0",
            "--region",
            "r1",
            "--zone",
            "z1",
        ])
        .args(["--controller", "http://127.0.0.1:9"])
        .args(["--rlqs-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--allow-client-san", "spiffe://cluster.local/**"])
        .output()
        .expect("spillway aggregator runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--tls-cert"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
