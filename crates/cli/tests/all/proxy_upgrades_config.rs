//! `proxy.upgrades` as a user meets it: `spillway check` with the built binary refuses a file
//! that would let an h2c upgrade through, says where and why, and accepts the default.

use std::process::Command;

fn check(yaml: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spillway.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .expect("the spillway binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_refuses_h2c_in_proxy_upgrades_and_accepts_websocket() {
    let (code, _, stderr) = check("version: 1\nproxy:\n  upgrades: [websocket, h2c]\n");
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("spillway.yaml:3:25")
            && stderr.contains("h2c cannot be an allowed upgrade")
            && stderr.contains("pass the limiter undecided"),
        "where and why: {stderr}"
    );
    let (code, stdout, stderr) = check("version: 1\nproxy:\n  upgrades: [WebSocket]\n");
    assert_eq!(code, Some(0), "{stdout}{stderr}");
}
