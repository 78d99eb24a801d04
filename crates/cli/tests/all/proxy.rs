//! `spillway proxy` as a process: the real binary in front of a small upstream, driven over
//! loopback sockets, stopped with SIGTERM.

use std::process::Command;

use crate::support::{Proxy, SPILLWAY, get, upstream};

#[test]
fn the_proxy_forwards_limits_serves_metrics_and_exits_0_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spillway.yaml");
    std::fs::write(
        &config,
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: limited, match: { procedure: /limited }, limit: 2/h, algorithm: token-bucket }\n",
    )
    .unwrap();
    let proxy = Proxy::start(&config, upstream());

    assert_eq!(get(proxy.listen, "/free").unwrap(), (200, "ok".to_owned()));
    let statuses: Vec<u16> = (0..3)
        .map(|_| get(proxy.listen, "/limited").unwrap().0)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);

    let (status, metrics) = get(proxy.admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    for line in [
        "spillway_requests_total{service=\"api\",bucket=\"limited\",decision=\"allowed\",criticality=\"critical\"} 2",
        "spillway_requests_total{service=\"api\",bucket=\"limited\",decision=\"dropped\",criticality=\"critical\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }

    let status = proxy.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn a_bad_configuration_exits_2_naming_the_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("spillway.yaml");
    std::fs::write(
        &config,
        "version: 1\nservices:\n  api:\n    buckets:\n      - name: b\n        limit: fast\n",
    )
    .unwrap();
    let output = Command::new(SPILLWAY)
        .arg("proxy")
        .arg("-c")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9"])
        .output()
        .expect("spillway proxy runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("{}:6:16: ", config.display())),
        "the message names spillway.yaml:6:16 (limit's value): {stderr}"
    );
    assert!(stderr.contains("fast"), "{stderr}");
}

#[test]
fn bad_timeouts_exit_2_saying_what_a_timeout_looks_like() {
    for (flag, value, expected) in [
        ("--upstream-timeout", "0s", "at least 1ms, or off"),
        ("--upstream-timeout", "soon", "or off"),
        ("--header-timeout", "30", "has no unit"),
        ("--header-timeout", "off", "a whole number and a unit"),
        ("--idle-timeout", "75", "has no unit"),
        ("--idle-timeout", "off", "a whole number and a unit"),
        ("--body-timeout", "60", "has no unit"),
        ("--body-timeout", "soon", "or off"),
    ] {
        let output = Command::new(SPILLWAY)
            .arg("proxy")
            .args(["-c", "spillway.yaml"])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--upstream", "http://127.0.0.1:9"])
            .args([flag, value])
            .output()
            .expect("spillway proxy runs");
        assert_eq!(output.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(flag) && stderr.contains(expected),
            "{flag} {value}: {stderr}"
        );
    }
}
