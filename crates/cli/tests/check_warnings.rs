//! `spillway check` on a file that trusts a client-controlled header for `procedure`: it still
//! accepts the file (exit 0, the table on stdout) and warns on stderr (issue 18, "Changed
//! defaults").

use std::process::Command;

#[test]
fn check_warns_about_header_rpc_procedure_and_still_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mesh.yaml");
    std::fs::write(
        &path,
        "version: 1\nidentity:\n  procedure: header:rpc-procedure,path\nservices:\n  api:\n    buckets:\n      - { name: ip, match: { procedure: \"/ip*\" }, limit: 5/s }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("SERVICE"));
    assert!(
        stderr.starts_with(&format!("{}:3:14: warning: `procedure` reads header `rpc-procedure`, which the client controls unless a trusted hop sets it", path.display())),
        "{stderr}"
    );

    // The default identity: no warning.
    std::fs::write(&path, "version: 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
