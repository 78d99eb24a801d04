//! `spillway emulate` through the real binary: a hundred emulated hosts, each on its own link
//! stream, against a real controller and aggregator (processes on loopback), in plaintext with a
//! 15x step of the load, and over mutual TLS with a certificate per host from `spillway certs
//! issue --hosts`; and the usage errors of a run that cannot start.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::SPILLWAY;
use crate::support::fleet::{Proc, admin_get, metric, wait_for};
use crate::support::free_port;

const HOSTS: usize = 100;
const BUCKETS: usize = 10;
/// Each bucket's limit; the fleet offers half of it, then fifteen times that.
const LIMIT: f64 = 2000.0;

/// Rules of `BUCKETS` global drop-ratio buckets of `LIMIT`/s, one per procedure, reports every
/// second.
fn rules(dir: &Path) -> String {
    let buckets: String = (0..BUCKETS)
        .map(|i| {
            format!("      - {{ name: b{i}, match: {{ procedure: /b{i} }}, limit: {LIMIT}/s, scope: global }}\n")
        })
        .collect();
    let yaml = format!(
        "version: 1\ncontrol:\n  report_interval: 1s\nservices:\n  api:\n    buckets:\n{buckets}"
    );
    let path = dir.join("rules.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.display().to_string()
}

fn spillway(args: &[&str]) -> Output {
    Command::new(SPILLWAY)
        .args(args)
        .output()
        .expect("spillway runs")
}

/// Runs `spillway emulate` with `args` and reads its summary.
fn emulate(args: &[&str]) -> serde_json::Value {
    let out = spillway(&[&["emulate"], args].concat());
    assert!(
        out.status.success(),
        "emulate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON summary")
}

fn f(summary: &serde_json::Value, field: &str) -> f64 {
    summary[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {summary}"))
}

/// Waits until the aggregator on `admin` is linked to its controller.
fn wait_linked(admin: u16) {
    wait_for(
        std::time::Duration::from_secs(20),
        "the aggregator links to its controller",
        || {
            metric(
                &admin_get(admin, "/metrics"),
                "spillway_control_plane_connected",
                "",
            ) == Some(1.0)
        },
    );
}

#[test]
fn a_hundred_emulated_hosts_report_every_second_and_a_15x_step_is_cut_to_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(dir.path());
    let (controller, aggregator, admin) = (free_port(), free_port(), free_port());
    let _controller = crate::support::fleet::controller(controller, Path::new(&rules), &[]);
    let _aggregator = crate::support::fleet::aggregator(
        aggregator,
        "z1",
        controller,
        &["--admin", &format!("127.0.0.1:{admin}")],
    );
    wait_linked(admin);
    let (hosts, rate) = (HOSTS.to_string(), (LIMIT / 2.0).to_string());
    let url = format!("http://127.0.0.1:{aggregator}");
    let summary = emulate(&[
        "-c",
        &rules,
        "--hosts",
        &hosts,
        "--aggregator",
        &url,
        "--region",
        "r1",
        "--zone",
        "z1",
        "--seconds",
        "12",
        "--rate",
        &rate,
        "--step",
        "15@6s",
    ]);
    assert_eq!(summary["hosts"], HOSTS, "{summary}");
    assert_eq!(summary["connected"], HOSTS, "{summary}");
    assert!(summary["all_linked_after_s"].is_number(), "{summary}");
    // A report per host per second, less the first interval's partial one.
    let reports = f(&summary, "reports_sent");
    assert!(reports >= (HOSTS * 9) as f64, "{summary}");
    assert!(
        f(&summary, "instructions_received") >= reports * 0.8,
        "{summary}"
    );
    let limit = f(&summary, "limit_rps");
    assert_eq!(limit, LIMIT * BUCKETS as f64);
    // Before the step every request passes: half the limit.
    let seconds = summary["per_second"].as_array().unwrap();
    let before = &seconds[3];
    assert!(
        (f(before, "admitted_to_limit") - 0.5).abs() < 0.05,
        "{before}"
    );
    // After it, 7.5 times the limit is offered and the limit admitted.
    assert!(
        (f(&summary, "offered_rps") / limit - 7.5).abs() < 0.3,
        "{summary}"
    );
    assert!(
        (f(&summary, "admitted_to_limit") - 1.0).abs() < 0.1,
        "{summary}"
    );
    let delay = &summary["step"]["enforcement_delay_s"];
    assert!(delay.is_number(), "the step was never cut: {summary}");
    // Every host closed its stream when the run ended.
    wait_for(
        std::time::Duration::from_secs(10),
        "the aggregator has no clients left",
        || {
            metric(
                &admin_get(admin, "/metrics"),
                "spillway_aggregator_clients",
                "",
            ) == Some(0.0)
        },
    );
}

#[test]
fn emulated_hosts_link_over_mutual_tls_each_with_its_own_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(dir.path());
    let p = |name: &str| dir.path().join(name).display().to_string();
    let issue = |args: &[&str]| {
        let out = spillway(&[&["certs", "issue", "--ca", &p("ca")], args].concat());
        assert!(out.status.success(), "certs issue: {out:?}");
        out
    };
    assert!(
        spillway(&["certs", "init", "--out", &p("ca")])
            .status
            .success()
    );
    issue(&[
        "--role",
        "controller",
        "--region",
        "r1",
        "--out",
        &p("controller"),
    ]);
    issue(&[
        "--role",
        "aggregator",
        "--region",
        "r1",
        "--zone",
        "z1",
        "--out",
        &p("aggregator"),
    ]);
    let hosts = HOSTS.to_string();
    let out = issue(&[
        "--role",
        "proxy",
        "--region",
        "r1",
        "--zone",
        "z1",
        "--hosts",
        &hosts,
        "--out",
        &p("hosts"),
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("100 proxy leaves, emu-0 to emu-99"), "{said}");
    assert!(dir.path().join("hosts/emu-99/key.pem").exists());
    let flags = |leaf: &str| {
        vec![
            "--tls-cert".to_owned(),
            p(&format!("{leaf}/cert.pem")),
            "--tls-key".to_owned(),
            p(&format!("{leaf}/key.pem")),
            "--tls-ca".to_owned(),
            p("ca/ca.pem"),
        ]
    };
    let (controller, aggregator, admin) = (free_port(), free_port(), free_port());
    let controller_flags = flags("controller");
    let mut args: Vec<&str> = controller_flags.iter().map(String::as_str).collect();
    let _controller = crate::support::fleet::controller(controller, Path::new(&rules), &args);
    let aggregator_flags = flags("aggregator");
    args = aggregator_flags.iter().map(String::as_str).collect();
    let admin_addr = format!("127.0.0.1:{admin}");
    args.extend(["--admin", &admin_addr]);
    let controller_url = format!("https://127.0.0.1:{controller}");
    let listen = format!("127.0.0.1:{aggregator}");
    let mut all = vec![
        "aggregator",
        "--listen",
        &listen,
        "--controller",
        &controller_url,
    ];
    all.extend(args);
    let _aggregator = Proc::spawn(&all);
    // Over TLS the admin port speaks HTTPS: wait on the emulator's own summary instead.
    let url = format!("https://127.0.0.1:{aggregator}");
    let tls_dir = p("hosts");
    let mut summary = serde_json::Value::Null;
    // The aggregator may still be starting: up to three short runs.
    for _ in 0..3 {
        summary = emulate(&[
            "-c",
            &rules,
            "--hosts",
            &hosts,
            "--aggregator",
            &url,
            "--region",
            "r1",
            "--zone",
            "z1",
            "--seconds",
            "6",
            "--tls-dir",
            &tls_dir,
        ]);
        if summary["connected"] == HOSTS && f(&summary, "instructions_received") > 0.0 {
            break;
        }
    }
    assert_eq!(summary["tls"], true, "{summary}");
    assert_eq!(summary["connected"], HOSTS, "{summary}");
    assert!(
        f(&summary, "reports_sent") >= (HOSTS * 4) as f64,
        "{summary}"
    );
    // Offered 1.5 times the limit, the fleet admits the limit once instructed.
    let last = summary["per_second"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        (f(&last, "admitted_to_limit") - 1.0).abs() < 0.1,
        "{summary}"
    );
}

#[test]
fn a_run_that_cannot_start_says_why_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(dir.path());
    let base = [
        "emulate",
        "-c",
        &rules,
        "--aggregator",
        "http://127.0.0.1:9",
        "--region",
        "r1",
        "--zone",
        "z1",
        "--seconds",
        "1",
    ];
    let run = |more: &[&str]| {
        let out = spillway(&[&base[..], more].concat());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--hosts", "2", "--buckets", "11"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--buckets 11: the rules have only 10"),
        "{err}"
    );
    let (code, err) = run(&["--hosts", "2", "--step", "15"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("FACTOR@SECONDS"), "{err}");
    let (code, err) = run(&[
        "--hosts",
        "2",
        "--tls-dir",
        &dir.path().display().to_string(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("host emu-0's certificate"), "{err}");
    // More hosts than descriptors: said at the start, not met as EMFILE host by host.
    let out = Command::new("prlimit")
        .arg("--nofile=128:128")
        .arg(SPILLWAY)
        .args(&base[..])
        .args(["--hosts", "1000"])
        .output()
        .expect("prlimit runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--hosts 1000 needs about 1256 file descriptors"),
        "{err}"
    );
}

#[test]
fn emulated_hosts_given_two_aggregators_spread_over_both() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules(dir.path());
    let controller = free_port();
    let _controller = crate::support::fleet::controller(controller, Path::new(&rules), &[]);
    let pair: Vec<(u16, u16)> = (0..2).map(|_| (free_port(), free_port())).collect();
    let _aggregators: Vec<_> = pair
        .iter()
        .map(|(port, admin)| {
            crate::support::fleet::aggregator(
                *port,
                "z1",
                controller,
                &["--admin", &format!("127.0.0.1:{admin}")],
            )
        })
        .collect();
    for (_, admin) in &pair {
        wait_linked(*admin);
    }
    let mut args: Vec<String> = ["-c", &rules, "--hosts", "20", "--region", "r1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (port, _) in &pair {
        args.extend(["--aggregator".into(), format!("http://127.0.0.1:{port}")]);
    }
    args.extend(["--zone", "z1", "--seconds", "6", "--rate", "10"].map(String::from));
    let run =
        std::thread::spawn(move || emulate(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    let clients = |admin: u16| {
        metric(
            &admin_get(admin, "/metrics"),
            "spillway_aggregator_clients",
            "",
        )
        .unwrap_or(0.0)
    };
    // Each host starts at the aggregator its id picks: both have some, and all 20 are linked.
    wait_for(
        std::time::Duration::from_secs(5),
        "the 20 hosts are linked, spread over both aggregators",
        || {
            let (a, b) = (clients(pair[0].1), clients(pair[1].1));
            a > 0.0 && b > 0.0 && a + b == 20.0
        },
    );
    let summary = run.join().unwrap();
    assert_eq!(summary["connected"], 20, "{summary}");
}
