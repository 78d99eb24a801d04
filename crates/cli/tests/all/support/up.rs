//! `spillway up` as a child process on free ports, for the tests of what one node does.

use std::time::Duration;

use super::fleet::{Proc, keep_alive_upstream};
use super::{SPILLWAY, free_port};

/// A running `spillway up` on free ports, its state in `dir`.
pub struct Up {
    pub proc: Proc,
    pub listen: u16,
    pub rules: u16,
    pub admin: u16,
    pub db: String,
}

pub fn up(dir: &std::path::Path, yaml: &str) -> Up {
    up_with(dir, yaml, &[])
}

/// [`up`] with more arguments.
pub fn up_with(dir: &std::path::Path, yaml: &str, more: &[&str]) -> Up {
    let config = dir.join("spillway.yaml");
    std::fs::write(&config, yaml).unwrap();
    let upstream = keep_alive_upstream();
    let state = dir.join("state");
    let log = dir.join("up.log");
    // A free port is free when asked for, not when the child binds it: another test's
    // connection may take it between the two. The child then exits saying so, and is started
    // again on other ports; any other exit, or no answer within a minute, fails with its log.
    for _ in 0..3 {
        let ports: Vec<u16> = (0..7).map(|_| free_port()).collect();
        let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
        let mut args: Vec<String> = [
            "up",
            "-c",
            config.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--upstream",
            &format!("http://127.0.0.1:{upstream}"),
            "--history-resolution",
            "1s",
        ]
        .map(str::to_owned)
        .into();
        let flags = [
            "--listen",
            "--admin",
            "--rules-listen",
            "--controller-listen",
            "--controller-admin",
            "--aggregator-listen",
            "--aggregator-admin",
        ];
        for (i, flag) in flags.iter().enumerate() {
            args.extend([(*flag).to_owned(), addr(i)]);
        }
        args.extend(more.iter().map(|a| (*a).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut proc = Proc::spawn_logged(&args, &log);
        let started = std::time::Instant::now();
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", ports[2])).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_ok()
            {
                return Up {
                    proc,
                    listen: ports[0],
                    rules: ports[2],
                    admin: ports[1],
                    db: format!("sqlite://{}", state.join("rules.db").display()),
                };
            }
            let written = || std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(status) = proc.0.try_wait().unwrap() {
                let text = written();
                assert!(
                    text.contains("in use"),
                    "spillway up exited ({status}) before serving:\n{text}"
                );
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "spillway up does not serve within 60 s:\n{}",
                written()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!(
        "spillway up found a port of its seven taken three times:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// A user of the rules store at `db`, made with `spillway rules admin create`: its token,
/// printed once, on stdout only.
pub fn user(db: &str, name: &str, role: &str) -> String {
    let args = [
        "rules",
        "admin",
        "create",
        name,
        "--role",
        role,
        "--database",
        db,
    ];
    let out = std::process::Command::new(SPILLWAY)
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        token.starts_with("spw_"),
        "a token, printed once: {token:?}"
    );
    assert!(!stderr.contains(&token), "the token goes to stdout only");
    token
}
