//! The configurator on the built-in history, with real processes: `spillway up` serving paced
//! load writes its controller's history into its SQLite store at a resolution of a second, and
//! `spillway configure plan --source builtin:` proposes from it; `spillway configure apply`
//! rolls a new bucket out in shadow through the rules API as a service user, holds it while it
//! would drop traffic, retunes it, promotes it, and the proxy enforces it; a changed limit of
//! that bucket is tried as a candidate, held, retuned and promoted in one change. Bad input is
//! refused.

use std::process::Command;
use std::time::Duration;

use crate::support::fleet::{Load, Proc, wait_for};
use crate::support::up::{up, user};
use crate::support::{SPILLWAY, free_port};
use serde_json::Value;

/// `spillway configure ARGS...`: (exit code, stdout, stderr).
pub fn configure(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(SPILLWAY)
        .arg("configure")
        .args(args)
        .output()
        .expect("spillway configure runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The end of a lookback that takes in the minute now running.
pub fn until_next_minute() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    (now + 60).to_string()
}

const CONFIG: &str = "version: 1\ncontrol:\n  report_interval: 250ms\nservices:\n  api:\n    buckets:\n      - { name: orders, match: {procedure: /orders}, limit: 1000/s }\n      - { name: other, match: {procedure: /other}, limit: 1000/s }\n";

#[test]
fn spillway_up_writes_its_history_and_a_builtin_plan_proposes_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path(), CONFIG);
    let load = Load::on_path(up.listen, 40.0, "/orders");
    let config = dir.path().join("spillway.yaml");
    let source = format!("builtin:{}", up.db);
    let until = until_next_minute();
    let plan = || {
        configure(&[
            "plan",
            "--source",
            &source,
            "-c",
            config.to_str().unwrap(),
            "--lookback",
            "1h",
            "--until",
            &until,
            "--min-coverage",
            "0",
            "--quantile",
            "1",
            "--output",
            "json",
        ])
    };
    let parsed = |(code, out, err): (i32, String, String)| {
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<Value>(&out).unwrap()
    };
    let peak = |plan: &Value, bucket: &str| {
        plan["proposals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["bucket"] == bucket)
            .and_then(|p| p["evidence"]["peak_rps"].as_f64())
    };
    // Before the first slot is over the store has no series: exit 1, saying what to check.
    let (code, _, err) = plan();
    if code != 0 {
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("does a controller run with --database"),
            "{err}"
        );
    }
    // A few seconds of 40/s, in slots of a second, each written once it is over.
    wait_for(
        Duration::from_secs(20),
        "history of api/orders over 20/s",
        || {
            let (code, out, err) = plan();
            code == 0 && peak(&parsed((code, out, err)), "orders").is_some_and(|p| p > 20.0)
        },
    );
    drop(load);
    let plan = parsed(plan());
    let orders = peak(&plan, "orders").unwrap();
    assert!(orders < 60.0, "about 40/s, not more: {orders}");
    assert_eq!(peak(&plan, "other"), Some(0.0), "heard from, no traffic");
}

#[test]
fn a_history_resolution_that_does_not_divide_a_minute_is_refused() {
    for bad in ["7s", "1500ms", "2m", "1h"] {
        let out = Command::new(SPILLWAY)
            .args([
                "controller",
                "--listen",
                "127.0.0.1:0",
                "--region",
                "r1",
                "--database",
                "sqlite:///nonexistent/rules.db",
                "--history-resolution",
                bad,
            ])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--history-resolution") && err.contains("divide a minute"),
            "{bad}: {err}"
        );
    }
}

/// The rules service's rule `service/name`, if it has one.
fn rule(rules: u16, token: &str, name: &str) -> Option<Value> {
    let client = spillway_rules::client::RulesClient::new(
        &format!("http://127.0.0.1:{rules}"),
        Some(token.to_owned()),
    );
    let list = client.get("/v1/rules").unwrap().body;
    list.as_array()?.iter().find(|r| r["name"] == name).cloned()
}

/// The proxy's count of `decision` for api/guard, over every criticality tier.
fn guard(admin: u16, decision: &str) -> f64 {
    let body = crate::support::fleet::admin_get(admin, "/metrics");
    let with = format!("bucket=\"guard\",decision=\"{decision}\"");
    body.lines()
        .filter(|l| l.starts_with("spillway_requests_total") && l.contains(&with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `spillway configure apply` on a node's builtin history with the fixed policy, one quota for
/// api/guard, a 6 s validation window and at most 1% virtual drops.
struct Rollout {
    quotas: std::path::PathBuf,
    source: String,
    server: String,
    token: String,
}

impl Rollout {
    fn new(dir: &std::path::Path, up: &crate::support::up::Up, token: String) -> Self {
        Rollout {
            quotas: dir.join("quotas.yaml"),
            source: format!("builtin:{}", up.db),
            server: format!("http://127.0.0.1:{}", up.rules),
            token,
        }
    }

    /// One run with api/guard's quota at `limit` and `extra` flags; its table.
    fn apply(&self, limit: &str, extra: &[&str]) -> String {
        std::fs::write(
            &self.quotas,
            format!("quotas:\n  - {{service: api, bucket: guard, limit: {limit}}}\n"),
        )
        .unwrap();
        let mut args = vec![
            "apply",
            "--source",
            &self.source,
            "--server",
            &self.server,
            "--token",
            &self.token,
            "--policy",
            "fixed",
            "--quota-file",
            self.quotas.to_str().unwrap(),
            "--lookback",
            "1h",
            "--min-coverage",
            "0",
            "--validate-for",
            "6s",
            "--max-virtual-drop",
            "0.01",
        ];
        args.extend(extra);
        let (code, out, err) = configure(&args);
        assert_eq!(code, 0, "{out}{err}");
        out
    }

    /// Runs with `--promote` until the window and its history are over (the history of a slot
    /// is written about 3 s after it): the step that decides.
    fn decided(&self, limit: &str, extra: &[&str]) -> String {
        let start = std::time::Instant::now();
        let args: Vec<&str> = extra.iter().copied().chain(["--promote"]).collect();
        loop {
            let out = self.apply(limit, &args);
            if !out.contains("validating") || start.elapsed() > Duration::from_secs(20) {
                return out;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn apply_creates_in_shadow_holds_what_would_drop_and_promotes_what_fits_and_the_proxy_enforces_it()
{
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path(), CONFIG);
    let token = user(&up.db, "robot", "service");
    let rollout = Rollout::new(dir.path(), &up, token.clone());
    let apply = |limit: &str, promote: bool| {
        rollout.apply(limit, if promote { &["--promote"] } else { &[] })
    };
    let decided = |limit: &str| rollout.decided(limit, &[]);
    // Paced load on a path no bucket in force matches: only the new bucket, of the whole
    // service, counts it.
    let load = Load::on_path(up.listen, 20.0, "/x");

    // A bucket with no limit yet: created in shadow, by the service user, and run by the proxy.
    let out = apply("5/s", false);
    assert!(
        out.contains("create  api      guard   5/s    created in shadow"),
        "{out}"
    );
    let created = rule(up.rules, &token, "guard").expect("the rule is in the store");
    assert_eq!(created["mode"], "shadow");
    assert_eq!(created["limit"], "5/s");
    assert_eq!(created["created_by"], "robot");
    wait_for(
        Duration::from_secs(10),
        "the proxy counts virtual drops of api/guard",
        || guard(up.admin, "shadow_dropped") > 10.0,
    );
    assert_eq!(load.counts().1, 0, "a shadow bucket drops nothing");

    // Still in its window: validating. After it: held, since 5/s would drop most of 20/s.
    let out = apply("5/s", true);
    assert!(out.contains("validating"), "{out}");
    let out = decided("5/s");
    assert!(
        out.contains("hold") && out.contains("would have dropped"),
        "{out}"
    );
    assert!(out.contains("1 steps; 1 held"), "{out}");
    assert_eq!(
        rule(up.rules, &token, "guard").unwrap()["mode"],
        "shadow",
        "held in shadow"
    );

    // A proposal that fits: the shadow bucket takes it and a new window, then is promoted.
    let out = apply("40/s", true);
    assert!(out.contains("retune") && out.contains("40/s"), "{out}");
    let retuned = rule(up.rules, &token, "guard").unwrap();
    assert_eq!(
        (retuned["mode"].as_str(), retuned["limit"].as_str()),
        (Some("shadow"), Some("40/s"))
    );
    let out = decided("40/s");
    assert!(
        out.contains("promote") && out.contains("promoted to enforce"),
        "{out}"
    );
    assert_eq!(rule(up.rules, &token, "guard").unwrap()["mode"], "enforce");
    assert_eq!(load.counts().1, 0, "nothing was dropped on the way");
    drop(load);

    // The proxy enforces it: three times its limit gets 429s.
    wait_for(
        Duration::from_secs(10),
        "the proxy runs api/guard in enforce mode",
        || {
            let before = guard(up.admin, "shadow_dropped");
            let surge = Load::on_path(up.listen, 120.0, "/x");
            std::thread::sleep(Duration::from_secs(2));
            let (_, limited) = surge.counts();
            drop(surge);
            limited > 20 && guard(up.admin, "shadow_dropped") == before
        },
    );
    // Nothing left to do: a promoted bucket is no longer the configurator's to validate.
    let out = apply("40/s", true);
    assert!(out.contains("0 steps; 0 held"), "{out}");

    // A changed limit of the bucket in force is a candidate on its rule: 40/s stays in force
    // while the proxy tries 10/s beside it and counts what it would have dropped.
    let load = Load::on_path(up.listen, 20.0, "/x");
    let out = apply("10/s", false);
    assert!(
        out.contains("candidate  api      guard   10/s   a candidate beside 40/s"),
        "{out}"
    );
    let tried = rule(up.rules, &token, "guard").unwrap();
    assert_eq!(
        (tried["limit"].as_str(), tried["mode"].as_str()),
        (Some("40/s"), Some("enforce"))
    );
    assert_eq!(tried["candidate"]["limit"], "10/s", "{tried}");
    wait_for(
        Duration::from_secs(10),
        "the proxy counts what api/guard's candidate would have dropped",
        || guard(up.admin, "candidate_dropped") > 10.0,
    );
    // The surge's drop ratio may still have been in force for the first requests; from here
    // on nothing is dropped, since 20/s is within every limit in force.
    let dropped = load.counts().1;
    let out = decided("10/s");
    assert!(
        out.contains("held as a candidate: would have dropped"),
        "{out}"
    );
    assert_eq!(
        rule(up.rules, &token, "guard").unwrap()["limit"],
        "40/s",
        "a held candidate leaves the limit in force"
    );
    // It moves to what fits, and is promoted in one change: the candidate becomes the limit.
    let out = apply("30/s", true);
    assert!(out.contains("retune") && out.contains("30/s"), "{out}");
    let out = decided("30/s");
    assert!(out.contains("promoted: 30/s replaces 40/s"), "{out}");
    let promoted = rule(up.rules, &token, "guard").unwrap();
    assert_eq!(promoted["limit"], "30/s");
    assert!(promoted["candidate"].is_null(), "{promoted}");
    assert_eq!(
        load.counts().1,
        dropped,
        "the candidates dropped nothing; the limits in force did not drop 20/s"
    );
    let out = apply("30/s", true);
    assert!(out.contains("0 steps; 0 held"), "{out}");
}

#[test]
fn apply_refuses_a_token_that_is_not_a_service_users_and_a_file_instead_of_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path(), CONFIG);
    let admin = user(&up.db, "ops", "admin");
    let server = format!("http://127.0.0.1:{}", up.rules);
    let source = format!("builtin:{}", up.db);
    let (code, out, err) = configure(&[
        "apply", "--source", &source, "--server", &server, "--token", &admin,
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("ops's, an admin user: apply changes rules as a service user"),
        "{err}"
    );
    let config = dir.path().join("spillway.yaml");
    let (code, _, err) = configure(&["apply", "--source", &source, "-c", config.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("give --server URL"), "{err}");
    let (code, _, err) = configure(&[
        "apply",
        "--source",
        &source,
        "--server",
        &server,
        "--token",
        &admin,
        "--max-virtual-drop",
        "1.5",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--max-virtual-drop 1.5: write a share from 0 to 1"),
        "{err}"
    );
}

#[test]
fn run_promotes_when_the_window_ends_wakes_on_rules_changes_and_counts_on_its_admin_port() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(dir.path(), CONFIG);
    let token = user(&up.db, "robot", "service");
    let admin_token = user(&up.db, "ops", "admin");
    let quotas = dir.path().join("quotas.yaml");
    std::fs::write(
        &quotas,
        "quotas:\n  - {service: api, bucket: guard, limit: 40/s}\n",
    )
    .unwrap();
    let load = Load::on_path(up.listen, 10.0, "/x");
    let admin = free_port();
    let source = format!("builtin:{}", up.db);
    let mut run = Proc::spawn_logged(
        &[
            "configure",
            "run",
            "--every",
            "1h",
            "--admin",
            &format!("127.0.0.1:{admin}"),
            "--source",
            &source,
            "--server",
            &format!("http://127.0.0.1:{}", up.rules),
            "--token",
            &token,
            "--policy",
            "fixed",
            "--quota-file",
            quotas.to_str().unwrap(),
            "--lookback",
            "1h",
            "--min-coverage",
            "0",
            "--validate-for",
            "6s",
        ],
        &dir.path().join("run.log"),
    );
    let metric = |name: &str, with: &str| {
        crate::support::fleet::metric(
            &crate::support::fleet::admin_get(admin, "/metrics"),
            name,
            with,
        )
    };
    let steps = |action: &str| {
        metric(
            "spillway_configurator_proposals_total",
            &format!("action=\"{action}\""),
        )
        .unwrap_or(0.0)
    };
    wait_for(
        Duration::from_secs(10),
        "the first run creates api/guard in shadow",
        || steps("create") == 1.0,
    );
    assert_eq!(rule(up.rules, &token, "guard").unwrap()["mode"], "shadow");
    let last = metric("spillway_configurator_last_run_timestamp_seconds", "").unwrap();
    assert!(last > 1.7e9, "a Unix time: {last}");

    // An operator's change wakes a run at once, not in an hour. The runs a change woke are told
    // apart by their reason in the log: the end of the validation window (6 s after the
    // creation) also wakes one, and must not pass for the change's. The first run's own
    // creation is a change too, and wakes one run after it.
    let runs = || metric("spillway_configurator_runs_total", "result=\"ok\"").unwrap_or(0.0);
    let log = dir.path().join("run.log");
    let woken = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("configurator run: the rules changed")
            .count()
    };
    wait_for(
        Duration::from_secs(10),
        "a run woken by the first run's own change",
        || woken() == 1,
    );
    let before = runs();
    let operator = spillway_rules::client::RulesClient::new(
        &format!("http://127.0.0.1:{}", up.rules),
        Some(admin_token),
    );
    let answer = operator
        .post(
            "/v1/rules",
            r#"{"service": "api", "name": "b2", "match": {"procedure": "/b2"}, "limit": "10/s"}"#,
        )
        .unwrap();
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    wait_for(Duration::from_secs(5), "a run woken by the change", || {
        woken() == 2
    });
    wait_for(Duration::from_secs(5), "the woken run counted", || {
        runs() > before
    });

    // The window's end wakes the run that promotes it.
    wait_for(Duration::from_secs(15), "api/guard promoted by run", || {
        steps("promote") == 1.0
    });
    assert_eq!(rule(up.rules, &token, "guard").unwrap()["mode"], "enforce");
    assert_eq!(metric("spillway_configurator_held_total", "").unwrap(), 0.0);
    assert_eq!(load.counts().1, 0, "nothing dropped on the way");

    // SIGTERM ends it cleanly.
    let pid = run.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut status = None;
    for _ in 0..100 {
        if let Some(s) = run.0.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "stopped on SIGTERM with 0"
    );
    run.kill();
}

#[test]
fn per_region_proposes_a_limit_of_its_regions_own_tried_as_a_candidate_and_then_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let up = up(
        dir.path(),
        "version: 1\ncontrol:\n  report_interval: 250ms\nservices:\n  api:\n    buckets:\n      - { name: guard, limit: 40/s, scope: region }\n",
    );
    let token = user(&up.db, "robot", "service");
    let rollout = Rollout::new(dir.path(), &up, token.clone());
    let (source, server) = (rollout.source.clone(), rollout.server.clone());
    // The window takes in the minute now running, where the history is.
    let until = until_next_minute();
    let per_region = ["--until", until.as_str(), "--per-region"];
    let apply = |limit: &str| {
        let args: Vec<&str> = per_region.iter().copied().chain(["--promote"]).collect();
        rollout.apply(limit, &args)
    };
    let decided = |limit: &str| rollout.decided(limit, &per_region);
    let load = Load::on_path(up.listen, 20.0, "/x");
    // The region is heard from once a slot of its history is written.
    wait_for(Duration::from_secs(15), "the region's history", || {
        let (code, out, err) = configure(&[
            "plan",
            "--source",
            &source,
            "--server",
            &server,
            "--token",
            &token,
            "--lookback",
            "1h",
            "--min-coverage",
            "0",
            "--until",
            &until,
            "--per-region",
        ]);
        let seen = code == 0 && out.contains("guard (local)");
        if !seen {
            eprintln!("plan --per-region: exit {code}\n{out}{err}");
        }
        seen
    });
    // The region's own limit is proposed as a candidate's region_limits; 40/s stays in force.
    let out = apply("10/s");
    assert!(
        out.contains("candidate") && out.contains("local 10/s"),
        "{out}"
    );
    let tried = rule(up.rules, &token, "guard").unwrap();
    assert_eq!(tried["limit"], "40/s");
    assert_eq!(
        tried["candidate"]["region_limits"]["local"], "10/s",
        "{tried}"
    );
    wait_for(
        Duration::from_secs(10),
        "the candidate's twin is steered to the region's limit",
        || guard(up.admin, "candidate_dropped") > 10.0,
    );
    let out = decided("10/s");
    assert!(out.contains("held as a candidate"), "{out}");
    // A region limit that fits is promoted into the rule's region_limits.
    let out = apply("30/s");
    assert!(out.contains("retune"), "{out}");
    let out = decided("30/s");
    assert!(
        out.contains("promoted: the regions' limits are local 30/s"),
        "{out}"
    );
    let promoted = rule(up.rules, &token, "guard").unwrap();
    assert_eq!(promoted["limit"], "40/s");
    assert_eq!(promoted["region_limits"]["local"], "30/s", "{promoted}");
    assert!(promoted["candidate"].is_null());
    drop(load);
    // The region's controller enforces 30/s, not the bucket's 40/s: at 60/s about half is
    // dropped (a third at 40/s).
    wait_for(
        Duration::from_secs(15),
        "region local admits about 30/s of 60/s",
        || {
            let surge = Load::on_path(up.listen, 60.0, "/x");
            std::thread::sleep(Duration::from_secs(3));
            let (sent, limited) = surge.counts();
            drop(surge);
            let share = limited as f64 / sent.max(1) as f64;
            share > 0.42
        },
    );
}
