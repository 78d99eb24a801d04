//! `spillway demo` as a process: exits 0 after `--seconds`, prints a summary whose numbers are
//! sane (steady-state admitted within 15% of the limit, an enforcement delay), and writes an SVG
//! chart with the offered, admitted and limit series; its first line names the controller's
//! dashboard, served while it runs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SPILLWAY: &str = env!("CARGO_BIN_EXE_spillway");

/// The first number after `label` on the summary line that starts with it.
fn number_after(summary: &str, label: &str) -> Option<f64> {
    let line = summary
        .lines()
        .find(|l| l.trim_start().starts_with(label))?;
    line.trim_start()[label.len()..]
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

#[test]
fn demo_runs_a_surge_prints_a_sane_summary_and_writes_the_chart() {
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    // Bounded: the demo runs 10 s plus its start and stop.
    let (summary, log) = run_demo(
        &["--seconds", "10", "--out", out_dir],
        Duration::from_secs(90),
    );
    assert!(
        log.contains("shop/checkout") && log.contains("drop ratio"),
        "plain live lines on a non-terminal stderr:\n{log}"
    );

    let limit = number_after(&summary, "limit").expect("a limit line");
    assert_eq!(limit, 200.0, "{summary}");
    let admitted = number_after(&summary, "admitted (steady state)").expect("admitted");
    assert!(
        (admitted - limit).abs() <= 0.15 * limit,
        "steady state admitted {admitted}/s against {limit}/s:\n{summary}"
    );
    let offered = summary
        .lines()
        .find(|l| l.trim_start().starts_with("offered"))
        .expect("an offered line");
    assert!(offered.contains("during it"), "{offered}");
    let delay = number_after(&summary, "enforcement delay").expect("an enforcement delay");
    assert!(delay > 0.0 && delay < 5.0, "delay {delay} s:\n{summary}");
    assert!(summary.contains("added p99 latency"), "{summary}");

    let chart = out.path().join("spillway-demo.svg");
    assert!(
        summary.contains(&chart.display().to_string()),
        "the chart's path is printed:\n{summary}"
    );
    let svg = std::fs::read_to_string(&chart).expect("the chart was written");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for series in ["offered", "admitted", "limit"] {
        assert!(svg.contains(series), "no {series} series in the chart");
    }
    assert!(
        svg.matches("<polyline").count() >= 3,
        "three lines drawn in the chart"
    );
}

#[test]
fn a_surge_phase_outside_an_interval_is_refused_with_a_usage_error() {
    for phase in ["--surge-phase=1.0", "--surge-phase=-0.1"] {
        let output = Command::new(SPILLWAY)
            .args(["demo", "--seconds", "4", phase])
            .output()
            .expect("spillway demo runs");
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--surge-phase") && err.contains("[0, 1)"),
            "{err}"
        );
    }
}

#[test]
fn demo_prints_its_dashboard_first_and_serves_it_while_it_runs() {
    let out = tempfile::tempdir().unwrap();
    let mut child = Command::new(SPILLWAY)
        .args(["demo", "--seconds", "6", "--out"])
        .arg(out.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spillway demo starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // The fleet links within 15 s; the line comes before the load starts.
    let first = lines.recv_timeout(Duration::from_secs(60));
    let url = first
        .as_deref()
        .ok()
        .and_then(|l| l.strip_prefix("dashboard: http://"))
        .and_then(|l| l.split_once('/'))
        .map(|(addr, _)| addr.to_owned());
    let page = url.as_deref().map(|addr| get(addr, "/"));
    let buckets = url.as_deref().map(|addr| get(addr, "/v1/buckets"));
    let changes = url.as_deref().map(|addr| get(addr, "/v1/rules/changes"));
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("spillway demo --seconds 6 still running after 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "exit {status}");
    assert!(
        url.is_some(),
        "the first line names the dashboard: {first:?}"
    );
    let page = page.unwrap();
    assert!(
        page.contains("<title>spillway controller</title>"),
        "{page}"
    );
    let buckets = buckets.unwrap();
    assert!(
        buckets.contains("\"bucket\":\"checkout\"") && buckets.contains("\"region\":\"demo\""),
        "{buckets}"
    );
    let changes = changes.unwrap();
    assert!(
        changes.contains("\"source\":\"rules store\"") && changes.contains("shop/checkout"),
        "the demo's rules store lists its seeding: {changes}"
    );
}

/// One GET with `connection: close` to `addr`; the body ("" when nothing answers).
fn get(addr: &str, path: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let head = format!("GET {path} HTTP/1.1\r\nhost: demo\r\nconnection: close\r\n\r\n");
    let _ = stream.write_all(head.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// `spillway demo --scenario tokens`: each API key is answered within 15% of the tokens its
/// budget allows over the run (its rate times the run plus its burst; the requests in flight
/// when it goes into debt overspend it by a few percent, and the load's own jitter may leave a
/// little unspent), every answer's usage is read and debited, and keys offering twice their
/// budget are refused.
#[test]
fn demo_tokens_holds_each_keys_budget_and_reads_every_usage() {
    let summary = run_tokens(&["--seconds", "6"]);
    for key in ["key-1", "key-2", "key-3"] {
        assert_key_within(&summary, key, 15.0);
    }
    assert_every_usage_debited(&summary);
}

/// The Redis harness of bench/tokens/run.sh, briefly: four sidecars share a budget per API key in
/// a private `redis-server` (one bucket whose subject is the key), two keys each offering 4 times
/// it over all of them, and each key's tokens admitted stay within 15% of its own allowance over
/// 6 s (the 60 s runs are within 1%: what is over is what was in flight or owed at the end,
/// which a short run weighs more). Were the keys one meter, each would get half.
#[test]
fn demo_tokens_in_redis_holds_each_keys_budget_across_four_sidecars() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let summary = run_tokens(&[
        "--seconds",
        "6",
        "--sidecars",
        "4",
        "--keys",
        "2",
        "--budget",
        "10000",
        "--offered",
        "4",
        "--redis-url",
        &redis.url(),
    ]);
    assert!(summary.contains("4 sidecars, store: redis"), "{summary}");
    for key in ["key-1", "key-2"] {
        assert_key_within(&summary, key, 15.0);
    }
    assert_every_usage_debited(&summary);
    assert!(summary.contains("wrongful refusals"), "{summary}");
}

/// Runs `spillway demo --scenario tokens ARGS` (bounded: a minute) and returns its summary.
fn run_tokens(args: &[&str]) -> String {
    let args = [&["--scenario", "tokens"], args].concat();
    run_demo(&args, Duration::from_secs(60)).0
}

/// Runs `spillway demo ARGS`, killed after `bound`, asserts it exits 0, and returns its stdout
/// (the summary) and stderr (the log).
fn run_demo(args: &[&str], bound: Duration) -> (String, String) {
    let mut child = Command::new(SPILLWAY)
        .arg("demo")
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spillway demo starts");
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("spillway demo {args:?} still running after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = child.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&output.stdout).into_owned();
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(status.success(), "exit {status}\n{summary}\n{log}");
    (summary, log)
}

/// `key` was admitted and refused, with no errors, and answered within `percent` of the tokens
/// its budget allows.
fn assert_key_within(summary: &str, key: &str, percent: f64) {
    {
        let line = summary
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("a line for {key}:\n{summary}"));
        let numbers: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .map(|n| n.trim_end_matches('%').parse().unwrap())
            .collect();
        let [_, admitted, refused, errors, _, share] = numbers[..] else {
            panic!("{line}");
        };
        assert!(admitted > 0.0 && refused > 0.0, "{line}\n{summary}");
        assert_eq!(errors, 0.0, "{line}");
        assert!(
            (100.0 - percent..=100.0 + percent).contains(&share),
            "{key} was answered {share}% of what its budget allows:\n{summary}"
        );
    }
}

/// Every answer's usage was read and debited.
fn assert_every_usage_debited(summary: &str) {
    let admitted = number_after(summary, "tokens admitted").expect("tokens admitted");
    let debited = number_after(summary, "tokens debited").expect("tokens debited");
    assert_eq!(
        admitted, debited,
        "every answer's usage debited:\n{summary}"
    );
    assert_eq!(
        number_after(summary, "unreported costs"),
        Some(0.0),
        "{summary}"
    );
}
