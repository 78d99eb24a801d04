//! `spillway configure plan` as a user runs it: the built binary, the synthetic source, and a
//! configuration file, quota files and policy files written by the test. The history behind the
//! numbers is the synthetic source's; what is checked here is what the binary promises whatever
//! the history: the plan's JSON, the headroom and the clamps, the charts, and the exit codes (2 for
//! bad input, 1 for a history source that cannot be reached, as `spillway rules` does for a
//! database that does not answer).

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A fixed end of the lookback, so the synthetic history is the same at every run.
const UNTIL: &str = "2026-01-01T00:00:00Z";

/// Two buckets of `svc-0` that the synthetic source has series for (`bucket-0` and `bucket-1`),
/// one limit per user, and a service the source knows nothing of.
const CONFIG: &str = "\
version: 1
services:
  svc-0:
    buckets:
      - name: bucket-0
        match: {caller: web}
        limit: 50/s
      - name: bucket-1
        match: {caller: mobile}
        limit: 6000/min
      - name: per-user
        match: {user: \"*\"}
        limit: 5/s
        algorithm: token-bucket
  other:
    buckets:
      - name: idle
        limit: 10/s
";

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        let dir = Dir(tempfile::tempdir().expect("a temporary folder"));
        dir.write("spillway.yaml", CONFIG);
        dir
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path().join(name);
        fs::write(&path, text).expect("write a test file");
        path
    }

    /// `spillway configure plan --until UNTIL ARGS...` in this folder.
    fn plan(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_spillway"))
            .current_dir(self.path())
            .args(["configure", "plan", "--until", UNTIL])
            .args(args)
            .output()
            .expect("the spillway binary runs")
    }

    /// A plan that must succeed, as JSON.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.plan(&[args, &["--output", "json"]].concat());
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).expect("the JSON of --output json")
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The proposal for `bucket`.
fn proposal<'a>(json: &'a Value, bucket: &str) -> &'a Value {
    json["proposals"]
        .as_array()
        .expect("a list of proposals")
        .iter()
        .find(|p| p["bucket"] == bucket)
        .unwrap_or_else(|| panic!("no proposal for {bucket} in {json:#}"))
}

fn number(value: &Value, what: &str) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {value}"))
}

/// `value` is `base` times (1 + headroom), rounded up to three significant digits: at least
/// that, and less than 1% above it.
fn is_base_with_headroom(value: f64, base: f64, headroom: f64) -> bool {
    let want = base * (1.0 + headroom);
    value >= want * (1.0 - 1e-12) && value <= want * 1.01
}

#[test]
fn the_table_explains_every_proposal() {
    let dir = Dir::new();
    let out = dir.plan(&["--source", "synthetic:4", "-c", "spillway.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    let mut lines = table.lines();
    assert_eq!(
        lines.next(),
        Some("lookback 2025-12-04T00:00Z .. 2026-01-01T00:00Z (rates in requests/s)")
    );
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "SERVICE", "BUCKET", "CURRENT", "PROPOSED", "ACTION", "POLICY", "EVIDENCE"
        ]
    );
    let row = |bucket: &str| -> Vec<&str> {
        table
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cells| cells.get(1) == Some(&bucket))
            .unwrap_or_else(|| panic!("no row for {bucket} in\n{table}"))
    };
    // 6000/min is 100 requests/s; the evidence names the peak, the quantile and the forecast.
    assert_eq!(
        row("bucket-1")[..6],
        ["svc-0", "bucket-1", "100", "200", "update", "historical"]
    );
    let evidence = row("bucket-1")[6..].join(" ");
    assert!(
        evidence.starts_with("peak ")
            && evidence.contains("; q0.999 ")
            && evidence.contains("; forecast ")
            && evidence.contains("+25% headroom")
            && evidence.contains("clamp max-change-up from "),
        "{evidence}"
    );
    // A new bucket has no current limit.
    let new = row("bucket-2");
    assert_eq!((new[2], new[4]), ("-", "create"), "{new:?}");
    assert_eq!(row("per-user")[2..5], ["5.00", "5.00", "keep"]);
    assert!(table.contains("a limit per user: the history is the bucket's total"));
    assert_eq!(row("idle")[..5], ["other", "idle", "10.0", "10.0", "keep"]);
    assert!(table.contains("no history: the source has no series for this bucket"));
    assert_eq!(
        table.lines().last(),
        Some("4 series; 2 to create, 2 to update, 2 to keep")
    );
    assert!(
        stderr(&out).contains("planned 4 series from the synthetic source (seed 1)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn json_carries_spec_fields_and_the_arithmetic_holds() {
    let dir = Dir::new();
    let json = dir.json(&["--source", "synthetic:4", "-c", "spillway.yaml"]);
    assert_eq!(json["lookback"]["from"], "2025-12-04T00:00Z");
    assert_eq!(json["lookback"]["until"], "2026-01-01T00:00Z");
    let proposals = json["proposals"].as_array().unwrap();
    assert_eq!(proposals.len(), 6, "{json:#}");
    for p in proposals {
        for field in [
            "service",
            "bucket",
            "current_limit_rps",
            "proposed_limit_rps",
            "policy",
            "action",
            "evidence",
        ] {
            assert!(p.get(field).is_some(), "{field} missing from {p}");
        }
        assert_eq!(p["policy"], "historical");
        assert!(
            ["create", "update", "keep"].contains(&p["action"].as_str().unwrap()),
            "{p}"
        );
        assert!(p["evidence"].is_object(), "{p}");
        // Never a limit of zero.
        if let Some(limit) = p["proposed_limit_rps"].as_f64() {
            assert!(limit > 0.0, "{p}");
        }
    }

    // A new bucket: the quantile of 28 days of minutes times 1.25, rounded up, unclamped.
    let new = proposal(&json, "bucket-2");
    let e = &new["evidence"];
    assert_eq!(new["action"], "create");
    assert!(new["current_limit_rps"].is_null());
    assert_eq!(e["points"], 28 * 1440);
    assert_eq!(e["coverage"], 1.0);
    assert_eq!(e["quantile"], 0.999);
    assert_eq!(e["headroom"], 0.25);
    assert_eq!(e["base_rps"], e["quantile_rps"]);
    let q = number(&e["quantile_rps"], "quantile_rps");
    let proposed = number(&new["proposed_limit_rps"], "proposed_limit_rps");
    assert!(is_base_with_headroom(proposed, q, 0.25), "{new}");
    assert_eq!(e["unclamped_rps"], new["proposed_limit_rps"]);
    assert!(e.get("clamp").is_none(), "{new}");
    assert!(number(&e["peak_rps"], "peak_rps") >= q);
    assert!(e["peak_at"].as_str().unwrap().ends_with('Z'));

    // bucket-1 (100/s) has more traffic than twice its limit: cut to (1 + 1.0) x 100.
    let up = proposal(&json, "bucket-1");
    assert_eq!(
        (
            &up["action"],
            &up["current_limit_rps"],
            &up["proposed_limit_rps"]
        ),
        (&"update".into(), &100.0.into(), &200.0.into())
    );
    assert_eq!(up["evidence"]["clamp"], "max-change-up");
    assert!(number(&up["evidence"]["unclamped_rps"], "unclamped_rps") > 200.0);

    // bucket-0 (50/s) stays within the band of the max change, [25, 100].
    let b0 = proposal(&json, "bucket-0");
    let p0 = number(&b0["proposed_limit_rps"], "proposed_limit_rps");
    assert!((25.0..=100.0).contains(&p0), "{b0}");

    // Limits per user and buckets without a series are kept, and say why.
    for (bucket, current, why) in [
        ("per-user", 5.0, "a limit per user"),
        ("idle", 10.0, "no history"),
    ] {
        let p = proposal(&json, bucket);
        assert_eq!(p["action"], "keep", "{p}");
        assert_eq!(p["current_limit_rps"], current);
        assert_eq!(p["proposed_limit_rps"], current);
        assert!(
            p["evidence"]["reason"].as_str().unwrap().contains(why),
            "{p}"
        );
    }
}

#[test]
fn the_flags_set_quantile_headroom_and_bounds() {
    let dir = Dir::new();
    let base = ["--source", "synthetic:4", "-c", "spillway.yaml"];
    let json = dir.json(
        &[
            &base[..],
            &[
                "--quantile",
                "0.99",
                "--headroom",
                "0.1",
                "--max-change",
                "0.5",
            ],
        ]
        .concat(),
    );
    let new = proposal(&json, "bucket-2");
    assert_eq!(new["evidence"]["quantile"], 0.99);
    assert_eq!(new["evidence"]["headroom"], 0.1);
    let q = number(&new["evidence"]["quantile_rps"], "quantile_rps");
    assert!(
        is_base_with_headroom(number(&new["proposed_limit_rps"], "proposed"), q, 0.1),
        "{new}"
    );
    // (1 + 0.5) x 100.
    assert_eq!(proposal(&json, "bucket-1")["proposed_limit_rps"], 150.0);

    // A ceiling (written as a limit) caps a new bucket; a floor raises one.
    let q2 = number(
        &proposal(&dir.json(&base), "bucket-2")["evidence"]["quantile_rps"],
        "quantile_rps",
    );
    let capped = dir.json(&[&base[..], &["--ceiling", "6000/min"]].concat());
    let p = proposal(&capped, "bucket-2");
    assert!(q2 * 1.25 > 100.0, "the test needs bucket-2 above 100/s");
    assert_eq!(p["proposed_limit_rps"], 100.0);
    assert_eq!(p["evidence"]["clamp"], "ceiling");
    let floored = dir.json(&[&base[..], &["--floor", "100000"]].concat());
    let p = proposal(&floored, "bucket-2");
    assert_eq!(p["proposed_limit_rps"], 100_000.0);
    assert_eq!(p["evidence"]["clamp"], "floor");
}

#[test]
fn forecast_and_a_policy_file() {
    let dir = Dir::new();
    let json = dir.json(&[
        "--source",
        "synthetic:4",
        "-c",
        "spillway.yaml",
        "--policy",
        "forecast",
    ]);
    let p = proposal(&json, "bucket-2");
    assert_eq!(p["policy"], "forecast");
    let e = &p["evidence"];
    let peak = number(&e["forecast_peak_rps"], "forecast_peak_rps");
    assert_eq!(e["base_rps"], e["forecast_peak_rps"]);
    let band = e["forecast_band_rps"].as_array().unwrap();
    assert!(
        number(&band[0], "low") <= peak && peak <= number(&band[1], "high"),
        "{e}"
    );
    assert!(
        e["forecast_peak_day"]
            .as_str()
            .unwrap()
            .contains("2026-01-0")
    );
    assert!(is_base_with_headroom(
        number(&p["proposed_limit_rps"], "proposed"),
        peak,
        0.25
    ));

    // The policy file sets svc-0's policy and headroom; the flags stay the defaults elsewhere.
    dir.write(
        "policies.yaml",
        "services:\n  svc-0: {policy: forecast, headroom: 0.5}\n",
    );
    let json = dir.json(&[
        "--source",
        "synthetic:4",
        "-c",
        "spillway.yaml",
        "--policy-file",
        "policies.yaml",
    ]);
    let p = proposal(&json, "bucket-2");
    assert_eq!(
        (&p["policy"], &p["evidence"]["headroom"]),
        (&"forecast".into(), &0.5.into())
    );
    assert_eq!(proposal(&json, "idle")["policy"], "historical");
}

#[test]
fn fixed_takes_the_quota_file_as_it_is() {
    let dir = Dir::new();
    dir.write(
        "quotas.yaml",
        "quotas:\n  - {service: svc-0, bucket: bucket-0, limit: 30000/min}\n  - {service: svc-0, bucket: contract, limit: 20}\n",
    );
    let json = dir.json(&[
        "--source",
        "synthetic:2",
        "-c",
        "spillway.yaml",
        "--policy",
        "fixed",
        "--quota-file",
        "quotas.yaml",
    ]);
    // 500/s is ten times the current 50/s: a contract is not clamped.
    let b0 = proposal(&json, "bucket-0");
    assert_eq!(
        (&b0["action"], &b0["proposed_limit_rps"]),
        (&"update".into(), &500.0.into())
    );
    assert_eq!(b0["evidence"]["quota_file"], "quotas.yaml");
    let contract = proposal(&json, "contract");
    assert_eq!(
        (&contract["action"], &contract["proposed_limit_rps"]),
        (&"create".into(), &20.0.into())
    );
    let b1 = proposal(&json, "bucket-1");
    assert_eq!(b1["action"], "keep");
    assert!(
        b1["evidence"]["reason"]
            .as_str()
            .unwrap()
            .contains("no quota for svc-0/bucket-1 in quotas.yaml"),
        "{b1}"
    );
}

#[test]
fn the_same_seed_gives_the_same_plan() {
    let dir = Dir::new();
    let args = |source: &'static str| [source, "-c", "spillway.yaml", "--output", "json"];
    let a = dir.plan(&[&["--source"][..], &args("synthetic:3:7")].concat());
    let b = dir.plan(&[&["--source"][..], &args("synthetic:3:7")].concat());
    let c = dir.plan(&[&["--source"][..], &args("synthetic:3:8")].concat());
    assert!(a.status.success() && b.status.success() && c.status.success());
    assert_eq!(a.stdout, b.stdout);
    assert_ne!(a.stdout, c.stdout);
}

#[test]
fn chart_writes_an_svg_per_bucket_with_history() {
    let dir = Dir::new();
    let out = dir.plan(&[
        "--source",
        "synthetic:3",
        "-c",
        "spillway.yaml",
        "--chart",
        "charts/plan",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let charts = dir.path().join("charts/plan");
    let mut names: Vec<String> = fs::read_dir(&charts)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // A chart per series; the buckets without history (per-user, idle) have nothing to draw.
    assert_eq!(
        names,
        [
            "svc-0__bucket-0.svg",
            "svc-0__bucket-1.svg",
            "svc-0__bucket-2.svg"
        ]
    );
    for name in &names {
        let svg = fs::read_to_string(charts.join(name)).unwrap();
        // plotters' SVG backend writes each text's content on a line of its own.
        assert!(svg.starts_with("<svg "), "{name}");
        assert!(
            svg.lines()
                .next()
                .is_some_and(|head| head.contains("xmlns=\"http://www.w3.org/2000/svg\"")),
            "{name}"
        );
        assert!(svg.trim_end().ends_with("</svg>"), "{name}");
        assert!(svg.contains(">\nproposed "), "{name} has no proposed limit");
        assert!(svg.contains("forecast, with its band"), "{name}");
    }
    let b1 = fs::read_to_string(charts.join("svc-0__bucket-1.svg")).unwrap();
    assert!(
        b1.contains(">\ncurrent 100\n<"),
        "bucket-1's chart lacks its current limit"
    );
    assert!(b1.contains("svc-0/bucket-1 — historical: update 100 → 200 requests/s"));
}

#[test]
fn bad_input_is_a_clear_error_and_a_non_zero_exit() {
    let dir = Dir::new();
    dir.write(
        "bad-limit.yaml",
        "quotas:\n  - {service: svc-0, bucket: bucket-0, limit: fast}\n",
    );
    dir.write(
        "twice.yaml",
        "quotas:\n  - {service: a, bucket: b, limit: 1}\n  - {service: a, bucket: b, limit: 2}\n",
    );
    dir.write("not-a-list.yaml", "quotas: {svc-0: 3}\n");
    dir.write(
        "capacity.yaml",
        "capacity:\n  - {from: 2026-01-01, until: 2026-01-02, multiplier: 0}\n",
    );
    dir.write(
        "broken.yaml",
        "version: 1\nservices:\n  api:\n    buckets:\n      - name: a\n        limit: 0/s\n",
    );
    let fixed = |file: &'static str| {
        vec![
            "--source",
            "synthetic:2",
            "-c",
            "spillway.yaml",
            "--policy",
            "fixed",
            "--quota-file",
            file,
        ]
    };
    let synthetic = |extra: &[&'static str]| {
        [
            &["--source", "synthetic:2", "-c", "spillway.yaml"][..],
            extra,
        ]
        .concat()
    };
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        // A Prometheus that does not answer is a failure at run time, not bad usage.
        (
            vec![
                "--source",
                "prometheus:http://127.0.0.1:1",
                "-c",
                "spillway.yaml",
            ],
            1,
            "cannot reach Prometheus at http://127.0.0.1:1",
        ),
        (
            vec![
                "--source",
                "prometheus:127.0.0.1:9090",
                "-c",
                "spillway.yaml",
            ],
            2,
            "write the URL of a Prometheus, like prometheus:http://127.0.0.1:9090",
        ),
        (
            vec![
                "--source",
                "influx:http://127.0.0.1:8086",
                "-c",
                "spillway.yaml",
            ],
            2,
            "--source influx:http://127.0.0.1:8086: write prometheus:URL",
        ),
        (
            vec![
                "--source",
                "builtin:mysql://db/rules",
                "-c",
                "spillway.yaml",
            ],
            2,
            "--source builtin:mysql://db/rules: write builtin:sqlite://PATH or builtin:postgres://",
        ),
        (
            vec![
                "--source",
                "builtin:postgres://spw:secret@127.0.0.1:1/rules",
                "-c",
                "spillway.yaml",
            ],
            1,
            "cannot reach the rules store at postgres://127.0.0.1:1/rules",
        ),
        (
            vec!["--source", "synthetic:0", "-c", "spillway.yaml"],
            2,
            "synthetic:N or synthetic:N:SEED (N series, at least 1)",
        ),
        (
            synthetic(&["--query", "up"]),
            2,
            "--query is for a prometheus: source",
        ),
        (
            synthetic(&["--per-region"]),
            2,
            "--per-region needs a history per region, which the synthetic source",
        ),
        (
            synthetic(&["--capacity-file", "capacity.yaml"]),
            2,
            "--capacity-file multiplies forecasts: give --policy forecast",
        ),
        (
            synthetic(&["--policy", "forecast", "--capacity-file", "capacity.yaml"]),
            2,
            "capacity.yaml: capacity[0]: multiplier 0: write how many times",
        ),
        (fixed("bad-limit.yaml"), 2, "bad-limit.yaml:2:"),
        (
            fixed("twice.yaml"),
            2,
            "twice.yaml: quotas[1]: a second quota for a/b",
        ),
        (fixed("not-a-list.yaml"), 2, "not-a-list.yaml:1:"),
        (
            fixed("missing.yaml"),
            2,
            "missing.yaml: cannot read the file",
        ),
        (
            synthetic(&["--policy", "fixed"]),
            2,
            "the fixed policy takes its limits from --quota-file FILE",
        ),
        (synthetic(&["--quantile", "1.5"]), 2, "--quantile 1.5"),
        (synthetic(&["--headroom", "lots"]), 2, "--headroom \"lots\""),
        (
            synthetic(&["--floor", "10", "--ceiling", "5"]),
            2,
            "the floor 10 is above the ceiling 5",
        ),
        (
            synthetic(&["--lookback", "10m"]),
            2,
            "--lookback: give at least 1h",
        ),
        (
            vec!["--source", "synthetic:2", "-c", "broken.yaml"],
            2,
            "broken.yaml:6:",
        ),
        (
            vec!["--source", "synthetic:2"],
            2,
            "the following required arguments were not provided",
        ),
    ];
    for (args, code, message) in cases {
        let out = dir.plan(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.contains(message),
            "{args:?}: {err}\n  wanted: {message}"
        );
        assert!(out.stdout.is_empty(), "{args:?} printed {}", stdout(&out));
    }
    // The malformed quota says what is wrong with it, not only where.
    let out = dir.plan(&fixed("bad-limit.yaml"));
    assert!(stderr(&out).contains("limit \"fast\""), "{}", stderr(&out));
}

/// A child process (`rules serve`, `prometheus`), killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` on 127.0.0.1:`port` answers 200.
fn answers_200(port: u16, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// `--server URL`: the current limits are the rules service's, as `rules apply` stored them
/// from the same file that `-c` reads, so the plan is the same.
#[test]
fn the_current_limits_can_come_from_the_rules_service() {
    let dir = Dir::new();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let spillway = |args: &[&str], token: Option<&str>| {
        let mut command = Command::new(crate::support::SPILLWAY);
        command
            .current_dir(dir.path())
            .args(args)
            .env_remove("SPILLWAY_TOKEN")
            .env_remove("SPILLWAY_CA");
        if let Some(token) = token {
            command.env("SPILLWAY_TOKEN", token);
        }
        command.output().expect("spillway runs")
    };
    let created = spillway(
        &[
            "rules",
            "admin",
            "create",
            "ada",
            "--role",
            "admin",
            "--database",
            &database,
        ],
        None,
    );
    assert!(created.status.success(), "{}", stderr(&created));
    let token = stdout(&created).trim().to_owned();
    let port = crate::support::free_port();
    let _server = Killed(
        Command::new(crate::support::SPILLWAY)
            .args(["rules", "serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", &database])
            .stderr(Stdio::null())
            .spawn()
            .expect("rules serve starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers_200(port, "/healthz") {
        assert!(
            Instant::now() < deadline,
            "rules serve never became healthy"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("http://127.0.0.1:{port}");
    let applied = spillway(
        &["rules", "apply", "-f", "spillway.yaml", "--server", &url],
        Some(&token),
    );
    assert!(applied.status.success(), "{}", stderr(&applied));

    let plan = |limits: &[&str], token: Option<&str>| {
        let args = [
            &[
                "configure",
                "plan",
                "--until",
                UNTIL,
                "--source",
                "synthetic:4",
            ][..],
            limits,
            &["--output", "json"],
        ]
        .concat();
        spillway(&args, token)
    };
    let from_server = plan(&["--server", &url], Some(&token));
    assert_eq!(
        from_server.status.code(),
        Some(0),
        "{}",
        stderr(&from_server)
    );
    let from_file = plan(&["-c", "spillway.yaml"], None);
    assert_eq!(from_file.status.code(), Some(0), "{}", stderr(&from_file));
    let sorted = |out: &Output| {
        let json: Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut proposals = json["proposals"].as_array().unwrap().clone();
        proposals.sort_by_key(|p| p["bucket"].as_str().unwrap().to_owned());
        proposals
    };
    let (server_plan, file_plan) = (sorted(&from_server), sorted(&from_file));
    assert_eq!(server_plan, file_plan);
    let per_user = server_plan
        .iter()
        .find(|p| p["bucket"] == "per-user")
        .unwrap();
    assert_eq!(per_user["action"], "keep", "{per_user}");

    // Without a token the rules service refuses, and the plan says so: a failure at run time.
    let refused = plan(&["--server", &url], None);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("the current limits: "),
        "{}",
        stderr(&refused)
    );
    assert!(refused.stdout.is_empty());
}

/// Debian's `prometheus` on PATH, or `None` when the test should skip (a failure instead when
/// SPILLWAY_REQUIRE_PROMETHEUS is set, as scripts/test sets it).
fn prometheus_binary() -> Option<PathBuf> {
    spillway_testkit::tools::on_path(
        "prometheus",
        "Debian's prometheus package",
        "SPILLWAY_REQUIRE_PROMETHEUS",
    )
}

/// A real Prometheus without any history: a query it refuses is bad input (2), a query that
/// finds no series a failure at run time (1), each with Prometheus's own words or the reason.
/// (crates/configure/tests/all/prometheus.rs plans over a real Prometheus loaded with history.)
#[test]
fn a_prometheus_without_the_series_or_refusing_the_query_is_a_clear_error() {
    let Some(prometheus) = prometheus_binary() else {
        return;
    };
    let dir = Dir::new();
    dir.write("prometheus.yml", "global:\n  scrape_interval: 1h\n");
    let port = crate::support::free_port();
    let mut child = Killed(
        Command::new(prometheus)
            .current_dir(dir.path())
            .args([
                "--config.file=prometheus.yml",
                "--storage.tsdb.path=data",
                &format!("--web.listen-address=127.0.0.1:{port}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !answers_200(port, "/-/ready") {
        assert!(child.0.try_wait().unwrap().is_none(), "prometheus exited");
        assert!(Instant::now() < deadline, "prometheus never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let source = format!("prometheus:http://127.0.0.1:{port}");
    let refused = dir.plan(&[
        "--source",
        &source,
        "-c",
        "spillway.yaml",
        "--query",
        "sum by (service, bucket) (rate(",
    ]);
    let err = stderr(&refused);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "Prometheus at http://127.0.0.1:{port} answered 400: bad_data: "
        )),
        "{err}"
    );
    let empty = dir.plan(&["--source", &source, "-c", "spillway.yaml"]);
    let err = stderr(&empty);
    assert_eq!(empty.status.code(), Some(1), "{err}");
    assert!(
        err.contains("(query sum by (service, bucket) (rate(spillway_requests_total{decision!=\"candidate_dropped\"}[1m]))) returned no series over the lookback"),
        "{err}"
    );
    assert!(refused.stdout.is_empty() && empty.stdout.is_empty());
}

/// Whether two JSON values are equal, numbers within a relative 1e-9 (the last digits of a
/// float may differ with another libm).
fn close_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| close_json(v, w)))
        }
        _ => a == b,
    }
}

/// docs/configurator.md's worked example is what the binary prints: the page's configuration
/// file is [`CONFIG`], and its command, table, JSON and chart (docs/configurator-example.svg)
/// are the binary's. When the planner changes on purpose, run the page's command and paste.
#[test]
fn the_worked_example_in_the_docs_is_what_the_binary_prints() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let page = fs::read_to_string(docs.join("configurator.md")).unwrap();
    assert!(
        page.contains(&format!("```yaml\n{CONFIG}```")),
        "the page's spillway.yaml is not this test's CONFIG"
    );
    assert!(page.contains(&format!(
        "spillway configure plan --source synthetic:4 -c spillway.yaml --until {UNTIL} --chart charts\n"
    )));
    let dir = Dir::new();
    let out = dir.plan(&[
        "--source",
        "synthetic:4",
        "-c",
        "spillway.yaml",
        "--chart",
        "charts",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(
        page.contains(&format!("```text\n{table}```")),
        "docs/configurator.md's table is not what the binary prints:\n{table}"
    );
    let chart = fs::read_to_string(dir.path().join("charts/svc-0__bucket-0.svg")).unwrap();
    assert!(
        chart == fs::read_to_string(docs.join("configurator-example.svg")).unwrap(),
        "docs/configurator-example.svg is not the chart the binary draws"
    );

    let block = page
        .split("```json\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a JSON block in the page");
    let shown: Value = serde_json::from_str(block).expect("the page's JSON parses");
    let json = dir.json(&["--source", "synthetic:4", "-c", "spillway.yaml"]);
    assert!(close_json(&shown["lookback"], &json["lookback"]));
    let shown = &shown["proposals"][0];
    let bucket = shown["bucket"].as_str().unwrap();
    assert!(
        close_json(shown, proposal(&json, bucket)),
        "the page's JSON for {bucket} is not the binary's:\n{:#}",
        proposal(&json, bucket)
    );
}
