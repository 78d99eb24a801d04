//! `spillway demo` as a process: exits 0 after `--seconds`, prints a summary whose numbers are
//! sane (steady-state admitted within 15% of the limit, an enforcement delay), and writes an SVG
//! chart with the offered, admitted and limit series.

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
    let mut child = Command::new(SPILLWAY)
        .args(["demo", "--seconds", "10", "--out"])
        .arg(out.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spillway demo starts");
    // Bounded: the demo runs 10 s plus its start and stop.
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("spillway demo --seconds 10 still running after 90 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = child.wait_with_output().unwrap();
    let summary = String::from_utf8_lossy(&output.stdout);
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(status.success(), "exit {status}\n{summary}\n{log}");
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
