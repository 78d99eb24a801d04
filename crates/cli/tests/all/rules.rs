//! `spillway rules ...` end to end through the real binary: bootstrap users in an SQLite store,
//! serve the REST API on a loopback port, and drive it with the admin client commands, users and
//! tokens included; over TLS with a development CA, and plaintext only where the transport rules allow it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::{SPILLWAY, free_port};

fn workspace_file(relative: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
        .display()
        .to_string()
}

fn run(args: &[&str]) -> Output {
    Command::new(SPILLWAY)
        .args(args)
        .env_remove("SPILLWAY_TOKEN")
        .env_remove("SPILLWAY_CA")
        .output()
        .expect("spillway runs")
}

/// [`run`] for a command that must exit by itself (a refusal at start): killed, and the test
/// failed, if it still runs after 20 s, rather than hanging the suite on a server that started.
fn run_to_exit(args: &[&str]) -> Output {
    let mut child = Command::new(SPILLWAY)
        .args(args)
        .env_remove("SPILLWAY_TOKEN")
        .env_remove("SPILLWAY_CA")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spillway runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "spillway {args:?} did not exit: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn create_user(database: &str, name: &str, role: &str) -> String {
    crate::support::up::user(database, name, role)
}

/// The rules service as a child process, stopped with SIGTERM when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(database: &str) -> Server {
        let port = crate::support::free_port();
        let child = Command::new(SPILLWAY)
            .args(["rules", "serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", database])
            .stderr(Stdio::null())
            .spawn()
            .expect("rules serve starts");
        let server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !healthy(port) {
            assert!(
                Instant::now() < deadline,
                "rules serve never became healthy"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// `rules serve` over TLS on 127.0.0.1 with `DIR/cert.pem` and `DIR/key.pem`, once its port
    /// accepts connections.
    fn start_tls(database: &str, tls: &Path) -> Server {
        let port = crate::support::free_port();
        let child = Command::new(SPILLWAY)
            .args(["rules", "serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--database", database])
            .arg("--tls-cert")
            .arg(tls.join("cert.pem"))
            .arg("--tls-key")
            .arg(tls.join("key.pem"))
            .stderr(Stdio::null())
            .spawn()
            .expect("rules serve starts");
        let mut server = Server {
            child,
            url: format!("https://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "rules serve exited early"
            );
            assert!(Instant::now() < deadline, "rules serve never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn client(&self, token: Option<&str>, args: &[&str]) -> Output {
        let mut command = Command::new(SPILLWAY);
        command
            .arg("rules")
            .args(args)
            .args(["--server", &self.url]);
        command
            .env_remove("SPILLWAY_TOKEN")
            .env_remove("SPILLWAY_CA");
        if let Some(token) = token {
            command.env("SPILLWAY_TOKEN", token);
        }
        command.output().expect("spillway runs")
    }

    /// SIGTERM, then the exit status (bounded wait).
    fn stop(mut self) -> std::process::ExitStatus {
        terminate(&self.child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "rules serve ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn terminate(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

#[test]
fn an_admin_applies_lists_inspects_and_deletes_rules_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let admin = create_user(&database, "alice", "admin");
    let viewer = create_user(&database, "victor", "viewer");
    let server = Server::start(&database);
    let minimal = workspace_file("examples/minimal.yaml");

    // A dry run shows what would be created and changes nothing.
    let dry = server.client(Some(&admin), &["apply", "-f", &minimal, "--dry-run"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(
        stdout(&dry).contains("+ orders/all-callers"),
        "{}",
        stdout(&dry)
    );
    assert!(stdout(&dry).contains("dry run: nothing changed"));
    let listed = server.client(Some(&admin), &["list"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert_eq!(stdout(&listed).trim(), "", "the dry run stored nothing");

    let applied = server.client(Some(&admin), &["apply", "-f", &minimal]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(stdout(&applied).contains("applied: rules version"));

    // A controller following the store shows the change on its dashboard's /v1/rules/changes.
    let admin_port = free_port();
    let (controller_listen, admin_addr) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{admin_port}"),
    );
    // Killed when dropped, so a failure leaves no process behind.
    let controller = crate::support::fleet::Proc::spawn(&[
        "controller",
        "--listen",
        &controller_listen,
        "--region",
        "r1",
        "--database",
        &database,
        "--admin",
        &admin_addr,
    ]);
    let started = Instant::now();
    let listed = loop {
        let body = crate::support::fleet::admin_get(admin_port, "/v1/rules/changes");
        if body.contains("alice") {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the controller never listed the change: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(controller);
    assert!(listed.contains("orders/all-callers"), "{listed}");

    // Applying the same file again is not a modification.
    let again = server.client(Some(&admin), &["apply", "-f", &minimal]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).contains("nothing to apply"));

    // The viewer reads but may not write.
    let listed = server.client(Some(&viewer), &["list", "--service", "orders"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let line = stdout(&listed);
    assert!(line.contains("orders/all-callers"), "{line}");
    assert!(line.contains("1000/s"), "{line}");
    let id = line.split_whitespace().next().unwrap().to_owned();
    let refused = server.client(Some(&viewer), &["delete", &id]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("403"), "{}", stderr(&refused));

    // No token at all.
    let anonymous = server.client(None, &["list"]);
    assert_eq!(anonymous.status.code(), Some(1));
    assert!(stderr(&anonymous).contains("401"), "{}", stderr(&anonymous));

    // A broken file is bad configuration: exit 2 with core's message.
    let broken = workspace_file("crates/core/tests/broken/limit-zero.yaml");
    let rejected = server.client(Some(&admin), &["apply", "-f", &broken]);
    assert_eq!(rejected.status.code(), Some(2), "{}", stderr(&rejected));
    assert!(
        stderr(&rejected).contains("the count must be at least 1"),
        "{}",
        stderr(&rejected)
    );

    let shown = server.client(Some(&admin), &["get", &id]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let rule: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(rule["id"], id.as_str());
    assert_eq!(rule["name"], "all-callers");

    let deleted = server.client(Some(&admin), &["delete", &id]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let listed = server.client(Some(&admin), &["list"]);
    assert_eq!(stdout(&listed).trim(), "");

    // The audit log names who did what: one apply, one delete, nothing for the refusals.
    let history = server.client(Some(&viewer), &["history"]);
    assert!(history.status.success(), "{}", stderr(&history));
    let lines: Vec<String> = stdout(&history).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("alice") && l.contains("apply"))
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("alice") && l.contains("delete"))
    );

    assert!(server.stop().success(), "SIGTERM stops the service cleanly");
}

/// Propagation end to end: a rule committed through the API reaches a proxy that follows the PostgreSQL
/// store (`LISTEN`/`NOTIFY`), and is enforced without a restart; deleting it lifts the limit.
#[test]
fn a_proxy_following_postgres_enforces_a_rule_change_made_through_the_api() {
    let postgres = spillway_testkit::Postgres::start().expect("private PostgreSQL");
    let database = postgres.url();
    let admin = create_user(&database, "alice", "admin");
    let server = Server::start(&database);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("spillway.yaml");
    std::fs::write(&file, "version: 1\n").unwrap();
    let proxy = crate::support::Proxy::start_with(
        &file,
        crate::support::upstream(),
        &["--database", &database],
    );
    let status = |path: &str| {
        crate::support::get(proxy.listen, path)
            .expect("the proxy answers")
            .0
    };
    assert!((0..5).all(|_| status("/orders") == 200), "no rule yet");

    let rule = dir.path().join("rules.yaml");
    std::fs::write(
        &rule,
        "version: 1\nservices:\n  shop:\n    buckets:\n      - { name: orders, match: { procedure: /orders }, limit: 1/h, algorithm: token-bucket }\n",
    )
    .unwrap();
    let applied = server.client(Some(&admin), &["apply", "-f", rule.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let committed = Instant::now();
    // One token an hour: once the rule is in force, at most one more request passes.
    let deadline = committed + Duration::from_secs(10);
    while status("/orders") != 429 {
        assert!(
            Instant::now() < deadline,
            "the rule never reached the proxy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let delay = committed.elapsed();
    eprintln!("rule enforced {delay:?} after its commit");
    assert!(
        delay < Duration::from_secs(1),
        "a committed change is enforced within a second: {delay:?}"
    );
    assert_eq!(
        status("/other"),
        200,
        "only the rule's procedure is limited"
    );

    let listed = server.client(Some(&admin), &["list"]);
    let id = stdout(&listed)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let deleted = server.client(Some(&admin), &["delete", &id]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let deadline = Instant::now() + Duration::from_secs(10);
    while status("/orders") != 200 {
        assert!(
            Instant::now() < deadline,
            "the deletion never reached the proxy"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // A rule this proxy cannot enforce: `store: redis`, and the proxy's own file names no Redis
    // (the applied file needs one to validate; the store keeps rules, not connections). The
    // proxy refuses every rule set that holds it and keeps the rules in force (none), so the
    // rule applied beside it waits too, until the first is deleted.
    let both = dir.path().join("both.yaml");
    std::fs::write(
        &both,
        "version: 1\nredis: { url: redis://127.0.0.1:1 }\nservices:\n  vault:\n    buckets:\n      - { name: exact, match: { procedure: /orders }, limit: 1/h, algorithm: token-bucket, store: redis }\n  shop:\n    buckets:\n      - { name: other, match: { procedure: /other }, limit: 1/h, algorithm: token-bucket }\n",
    )
    .unwrap();
    let applied = server.client(Some(&admin), &["apply", "-f", both.to_str().unwrap()]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    // Propagation takes milliseconds (above); a second is ample for a change that would land.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        (0..5).all(|_| status("/orders") == 200 && status("/other") == 200),
        "a rule set the proxy cannot enforce changed nothing"
    );
    let listed = stdout(&server.client(Some(&admin), &["list"]));
    let exact = listed
        .lines()
        .find(|line| line.contains("exact"))
        .and_then(|line| line.split_whitespace().next())
        .unwrap_or_else(|| panic!("the exact rule is listed:\n{listed}"))
        .to_owned();
    let deleted = server.client(Some(&admin), &["delete", &exact]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let deadline = Instant::now() + Duration::from_secs(10);
    while status("/other") != 429 {
        assert!(
            Instant::now() < deadline,
            "the proxy stopped following the store after refusing a rule set"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(proxy.terminate().code(), Some(0));
}

/// The id part of `spw_<id>_<secret>`.
fn token_id(token: &str) -> &str {
    token
        .strip_prefix("spw_")
        .and_then(|rest| rest.split_once('_'))
        .expect("spw_<id>_<secret>")
        .0
}

/// Through the CLI: an admin makes a user and tokens, lists them (never a secret),
/// revokes, rotates, demotes and deletes; each change is refused by the server at once.
#[test]
fn an_admin_manages_users_and_tokens_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let admin = create_user(&database, "alice", "admin");
    let server = Server::start(&database);

    let made = server.client(
        Some(&admin),
        &["user", "create", "bob", "--role", "service"],
    );
    assert!(made.status.success(), "{}", stderr(&made));
    let bob = stdout(&made).trim().to_owned();
    assert!(bob.starts_with("spw_"), "{bob:?}");
    assert!(stderr(&made).contains("shown once"), "{}", stderr(&made));
    assert!(
        !stderr(&made).contains(&bob),
        "the token goes to stdout only"
    );

    let users = server.client(Some(&admin), &["user", "list"]);
    assert!(users.status.success(), "{}", stderr(&users));
    let listed = stdout(&users);
    assert!(
        listed.contains("alice  admin  1 active token(s)"),
        "{listed}"
    );
    assert!(
        listed.contains("bob  service  1 active token(s)"),
        "{listed}"
    );

    let second = server.client(
        Some(&admin),
        &["token", "create", "--user", "bob", "--expires", "30d"],
    );
    assert!(second.status.success(), "{}", stderr(&second));
    let second = stdout(&second).trim().to_owned();
    let works = |token: &str| server.client(Some(token), &["list"]);
    assert!(works(&second).status.success());

    let tokens = server.client(Some(&admin), &["token", "list", "--user", "bob"]);
    assert!(tokens.status.success(), "{}", stderr(&tokens));
    let text = stdout(&tokens);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for token in [&bob, &second] {
        let (id, secret) = token[4..].split_once('_').unwrap();
        assert!(!text.contains(secret), "no secret listed: {text}");
        let line = lines.iter().find(|l| l.starts_with(id)).unwrap();
        assert!(line.contains("bob  service  active"), "{line}");
    }
    let dated = lines
        .iter()
        .find(|l| l.starts_with(token_id(&second)))
        .unwrap();
    assert!(!dated.contains("expires never"), "{dated}");

    // Revoked: refused at once.
    let revoked = server.client(Some(&admin), &["token", "revoke", token_id(&second)]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    let refused = works(&second);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("401") && stderr(&refused).contains("revoked"),
        "{}",
        stderr(&refused)
    );

    // Rotated: the same id, a new secret; the old one is refused.
    let rotated = server.client(
        Some(&admin),
        &["token", "rotate", token_id(&bob), "--expires", "12h"],
    );
    assert!(rotated.status.success(), "{}", stderr(&rotated));
    let new = stdout(&rotated).trim().to_owned();
    assert_eq!(token_id(&new), token_id(&bob));
    assert_ne!(new, bob);
    assert_eq!(works(&bob).status.code(), Some(1));
    assert!(works(&new).status.success());

    // Demoted to viewer: bob reads, may not write, and never managed users.
    let demoted = server.client(Some(&admin), &["user", "update", "bob", "--role", "viewer"]);
    assert!(demoted.status.success(), "{}", stderr(&demoted));
    assert_eq!(stdout(&demoted).trim(), "bob is now viewer");
    let minimal = workspace_file("examples/minimal.yaml");
    let write = server.client(Some(&new), &["apply", "-f", &minimal]);
    assert_eq!(write.status.code(), Some(1));
    assert!(stderr(&write).contains("403"), "{}", stderr(&write));
    let manage = server.client(Some(&new), &["user", "list"]);
    assert_eq!(manage.status.code(), Some(1));
    assert!(stderr(&manage).contains("403"), "{}", stderr(&manage));

    // Deleted: every token of bob's is refused.
    let deleted = server.client(Some(&admin), &["user", "delete", "bob"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let gone = works(&new);
    assert_eq!(gone.status.code(), Some(1));
    assert!(stderr(&gone).contains("401"), "{}", stderr(&gone));

    // The last admin stays one.
    let last = server.client(
        Some(&admin),
        &["user", "update", "alice", "--role", "viewer"],
    );
    assert_eq!(last.status.code(), Some(1));
    assert!(stderr(&last).contains("last admin"), "{}", stderr(&last));

    // A duration that is none: bad usage, with the file format's words.
    let bad = server.client(Some(&admin), &["token", "create", "--expires", "30x"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("30x"), "{}", stderr(&bad));

    // The audit log in pages: two changes, one a page, and the way to the next.
    let applied = server.client(Some(&admin), &["apply", "-f", &minimal]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let listed = stdout(&server.client(Some(&admin), &["list"]));
    let id = listed.split_whitespace().next().unwrap().to_owned();
    assert!(
        server
            .client(Some(&admin), &["delete", &id])
            .status
            .success()
    );
    let page = server.client(Some(&admin), &["history", "--limit", "1"]);
    assert!(page.status.success(), "{}", stderr(&page));
    assert_eq!(stdout(&page).lines().count(), 1, "{}", stdout(&page));
    assert!(stdout(&page).contains("delete"));
    assert!(
        stderr(&page).contains("older entries: spillway rules history --limit 1 --before 2"),
        "{}",
        stderr(&page)
    );
    let next = server.client(Some(&admin), &["history", "--limit", "1", "--before", "2"]);
    assert!(stdout(&next).contains("apply"), "{}", stdout(&next));

    assert!(server.stop().success());
}

#[test]
fn rules_serve_refuses_a_maximum_override_ttl_that_is_no_duration() {
    let output = run(&[
        "rules",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--max-override-ttl",
        "a week",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("--max-override-ttl"),
        "{}",
        stderr(&output)
    );
}

/// A development CA in `dir/ca` and a server leaf from it in `dir/server` (it names localhost
/// and 127.0.0.1), made with `spillway certs`.
fn dev_pki(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = dir.join("ca");
    let leaf = dir.join("server");
    let init = run(&["certs", "init", "--out", &ca.display().to_string()]);
    assert!(init.status.success(), "{}", stderr(&init));
    let issue = run(&[
        "certs",
        "issue",
        "--ca",
        &ca.display().to_string(),
        "--role",
        "server",
        "--out",
        &leaf.display().to_string(),
    ]);
    assert!(issue.status.success(), "{}", stderr(&issue));
    (ca.join("ca.pem"), leaf)
}

#[test]
fn rules_serve_off_loopback_without_tls_exits_2_naming_both_ways_out() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:7070"] {
        let output = run_to_exit(&[
            "rules",
            "serve",
            "--listen",
            listen,
            "--database",
            &database,
        ]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{listen}: {}",
            stderr(&output)
        );
        let message = stderr(&output);
        for named in [
            "not a loopback address",
            "--tls-cert",
            "--tls-key",
            "--insecure-plaintext",
        ] {
            assert!(message.contains(named), "{listen}: {named} in {message}");
        }
    }
    assert!(
        !dir.path().join("rules.db").exists(),
        "refused before the store is opened"
    );
}

#[test]
fn rules_serve_tls_flags_come_in_pairs_and_never_with_insecure_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let (_, leaf) = dev_pki(dir.path());
    let cert = leaf.join("cert.pem").display().to_string();
    let key = leaf.join("key.pem").display().to_string();
    let serve = ["rules", "serve", "--listen", "127.0.0.1:0"];
    for (extra, named) in [
        (vec!["--tls-cert", &cert], "--tls-key"),
        (vec!["--tls-key", &key], "--tls-cert"),
        (
            vec![
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--insecure-plaintext",
            ],
            "--insecure-plaintext",
        ),
    ] {
        let args: Vec<&str> = serve.iter().copied().chain(extra.iter().copied()).collect();
        let output = run_to_exit(&args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{extra:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(named),
            "{extra:?}: {}",
            stderr(&output)
        );
    }

    // A key of another certificate is bad configuration, named at start.
    let other = tempfile::tempdir().unwrap();
    let (_, other_leaf) = dev_pki(other.path());
    let wrong_key = other_leaf.join("key.pem").display().to_string();
    let output = run_to_exit(&[
        "rules",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &wrong_key,
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("does not belong to the certificate"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn rules_serve_with_insecure_plaintext_starts_off_loopback_and_both_sides_warn() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let admin = create_user(&database, "alice", "admin");
    let port = crate::support::free_port();
    let mut child = Command::new(SPILLWAY)
        .args(["rules", "serve", "--listen", &format!("0.0.0.0:{port}")])
        .args(["--database", &database, "--insecure-plaintext"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("rules serve starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthy(port) {
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "rules serve --insecure-plaintext never became healthy: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // The client goes on over plaintext off loopback, but says what it exposes.
    let listed = Command::new(SPILLWAY)
        .args([
            "rules",
            "list",
            "--server",
            &format!("http://0.0.0.0:{port}"),
        ])
        .env("SPILLWAY_TOKEN", &admin)
        .env_remove("SPILLWAY_CA")
        .output()
        .unwrap();
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(
        stderr(&listed).contains("the bearer token crosses the network"),
        "{}",
        stderr(&listed)
    );
    // On loopback there is nothing to say.
    let local = Command::new(SPILLWAY)
        .args([
            "rules",
            "list",
            "--server",
            &format!("http://127.0.0.1:{port}"),
        ])
        .env("SPILLWAY_TOKEN", &admin)
        .env_remove("SPILLWAY_CA")
        .output()
        .unwrap();
    assert!(local.status.success(), "{}", stderr(&local));
    assert_eq!(stderr(&local), "");

    terminate(&child);
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let log = stderr(&output);
    assert!(
        log.contains("--insecure-plaintext") && log.contains("bearer tokens cross the network"),
        "{log}"
    );
}

#[test]
fn the_cli_speaks_https_to_rules_serve_with_tls_verified_by_the_given_ca() {
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("rules.db").display());
    let admin = create_user(&database, "alice", "admin");
    let (ca, leaf) = dev_pki(dir.path());
    let ca = ca.display().to_string();
    let server = Server::start_tls(&database, &leaf);
    let minimal = workspace_file("examples/minimal.yaml");

    let applied = server.client(Some(&admin), &["apply", "-f", &minimal, "--ca", &ca]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let listed = server.client(Some(&admin), &["list", "--ca", &ca]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(
        stdout(&listed).contains("orders/all-callers"),
        "{}",
        stdout(&listed)
    );
    // The CA may come from the environment too.
    let mut from_env = Command::new(SPILLWAY);
    from_env
        .args(["rules", "user", "list", "--server", &server.url])
        .env("SPILLWAY_TOKEN", &admin)
        .env("SPILLWAY_CA", &ca);
    let users = from_env.output().unwrap();
    assert!(users.status.success(), "{}", stderr(&users));
    assert!(stdout(&users).contains("alice"), "{}", stdout(&users));

    // Without --ca the system's roots do not know the development CA: refused, saying why.
    let refused = server.client(Some(&admin), &["list"]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    let message = stderr(&refused);
    assert!(
        message.contains("certificate") && message.contains("--ca"),
        "{message}"
    );
    assert!(!message.contains(&admin), "no token in the error");

    // A CA for a plaintext URL would protect nothing: bad usage, not a silent downgrade.
    let downgraded = Command::new(SPILLWAY)
        .args([
            "rules",
            "list",
            "--server",
            "http://127.0.0.1:7070",
            "--ca",
            &ca,
        ])
        .env("SPILLWAY_TOKEN", &admin)
        .output()
        .unwrap();
    assert_eq!(downgraded.status.code(), Some(2), "{}", stderr(&downgraded));
    assert!(
        stderr(&downgraded).contains("https://"),
        "{}",
        stderr(&downgraded)
    );

    assert!(
        server.stop().success(),
        "SIGTERM stops the TLS service cleanly"
    );
}
