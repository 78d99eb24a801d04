//! `spillway check` on a file that trusts a client-controlled header for `procedure`: it still
//! accepts the file (exit 0, the table on stdout) and warns on stderr (issue 18, "Changed
//! defaults").

use std::path::Path;
use std::process::{Command, Output};

/// `spillway check -c PATH`.
fn check(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["check", "-c"])
        .arg(path)
        .output()
        .unwrap()
}

#[test]
fn check_warns_about_header_rpc_procedure_and_still_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.yaml");
    std::fs::write(
        &path,
        "version: 1\nidentity:\n  procedure: header:rpc-procedure,path\nservices:\n  api:\n    buckets:\n      - { name: ip, match: { procedure: \"/ip*\" }, limit: 5/s }\n",
    )
    .unwrap();
    let out = check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("SERVICE"));
    assert!(
        stderr.starts_with(&format!("{}:3:14: warning: `procedure` reads header `rpc-procedure`, which the client controls unless a trusted hop sets it", path.display())),
        "{stderr}"
    );

    // The default identity: no warning.
    std::fs::write(&path, "version: 1\n").unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_refuses_a_per_value_descriptor_bucket_on_drop_ratio() {
    // `{key: user}` counts each user apart, which drop-ratio (the default algorithm) cannot: the
    // control plane holds one limit for the bucket. A fixed window counts each value apart.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("envoy.yaml");
    let file = |algorithm: &str| {
        format!(
            "version: 1\nservices:\n  api:\n    buckets:\n      - name: per-user\n        match: {{ descriptor: {{ domain: api, entries: [ {{key: user}} ] }} }}\n        limit: 5/s\n{algorithm}"
        )
    };
    std::fs::write(&path, file("")).unwrap();
    let out = check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the entry `user` without a value asks for a limit per value"),
        "{stderr}"
    );

    std::fs::write(&path, file("        algorithm: fixed-window\n")).unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_warns_when_a_criticality_header_may_raise_a_request_and_still_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiers.yaml");
    std::fs::write(
        &path,
        "version: 1\nidentity:\n  criticality: header:x-criticality\n  criticality_trusted: true\n",
    )
    .unwrap();
    let out = check(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "{}:4:24: warning: `criticality_trusted: true` lets header `x-criticality` raise a request above `critical`",
            path.display()
        )),
        "{stderr}"
    );
    // Read but not trusted (a client may only lower its tier): no warning.
    std::fs::write(
        &path,
        "version: 1\nidentity:\n  criticality: header:x-criticality\n",
    )
    .unwrap();
    let out = check(&path);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
