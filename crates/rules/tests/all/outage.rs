//! The rules service without its database: a private PostgreSQL stopped with `pg_ctl stop`
//! (fast and immediate shutdowns) and started again under a running service. `/readyz` follows
//! within a second of the stop and of the start, an API route answers 503 with a problem
//! document and `retry-after` within two seconds while the database is down and works again
//! after, and `/metrics` answers within a second throughout. Times are measured from the moment
//! the stop or start returns; every wait is bounded. A server frozen with SIGSTOP, which
//! answers nothing at all, releases the requests waiting on it within the same bounds.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{Db, Service, rule, start};
use spillway_rules::client::{RulesClient, RulesResponse};
use spillway_testkit::Postgres;

/// One request gets this long to answer before the test fails (the client's own limit is a
/// minute).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// `/readyz` follows the database within this long of a stop or a start.
const READY_WITHIN: Duration = Duration::from_secs(1);
/// An API route answers 503 within this long of the stop, and works again within it of the
/// start.
const API_WITHIN: Duration = Duration::from_secs(2);
/// `/metrics` answers within this long, database or not.
const METRICS_WITHIN: Duration = Duration::from_secs(1);

#[test]
fn postgres_stopped_fast_and_started_again() {
    outage_and_recovery("fast");
}

#[test]
fn postgres_stopped_immediately_and_started_again() {
    outage_and_recovery("immediate");
}

fn outage_and_recovery(mode: &str) {
    let mut service = start(Db::postgres());
    let token = service.viewer.clone();
    let url = service.url.clone();
    let created = service.create(&service.admin, &rule(1));
    assert_eq!(created.status, 201, "{}", created.body);
    let listed = ask(&url, Some(&token), "/v1/rules", Instant::now()).0;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let metrics = self::metrics(&url);
    assert!(metrics.contains("spillway_rules_store_up 1\n"), "{metrics}");

    pg_ctl_stop(postgres(&mut service), mode);
    let stopped = Instant::now();
    // Sent at once, when the probe may not have looked yet: it may wait on the pool, but
    // boundedly.
    let first = ask_in_background(&url, Some(&token), "/v1/rules", stopped);
    let (ready, took) = until(READY_WITHIN, stopped, "/readyz answers 503", || {
        let answer = ask(&url, None, "/readyz", stopped).0;
        (answer.status == 503).then_some(answer)
    });
    assert_store_unavailable(&ready);
    println!("{mode} stop: /readyz 503 after {took:?}");

    let (first, took) = first
        .recv_timeout(ANSWER_WITHIN)
        .expect("GET /v1/rules answers");
    assert!(
        took <= API_WITHIN,
        "GET /v1/rules sent at the stop answered after {took:?}"
    );
    assert_eq!(first.status, 503, "{}", first.body);
    assert_store_unavailable(&first);
    println!("{mode} stop: GET /v1/rules sent at once answered 503 after {took:?}");

    // Found down: refused without waiting on the database.
    let refused_at = Instant::now();
    let (refused, took) = ask(&url, Some(&token), "/v1/rules", refused_at);
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_store_unavailable(&refused);
    assert!(
        refused.body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("has not answered for")),
        "{}",
        refused.body
    );
    assert!(took < Duration::from_millis(500), "refused after {took:?}");
    let (metrics, took) = ask(&url, None, "/metrics", Instant::now());
    assert_eq!(metrics.status, 200);
    assert!(took <= METRICS_WITHIN, "/metrics answered after {took:?}");
    let text = metrics.body.as_str().expect("text");
    assert!(text.contains("spillway_rules_store_up 0\n"), "{text}");
    assert!(
        text.contains("spillway_rules_version 1\n"),
        "the version last read stays: {text}"
    );

    postgres(&mut service)
        .restart()
        .expect("PostgreSQL starts again");
    let started = Instant::now();
    let (_, took) = until(READY_WITHIN, started, "/readyz answers 200", || {
        let answer = ask(&url, None, "/readyz", started).0;
        (answer.status == 200).then_some(())
    });
    println!("{mode} start: /readyz 200 after {took:?}");
    let (listed, took) = until(API_WITHIN, started, "GET /v1/rules answers 200", || {
        let answer = ask(&url, Some(&token), "/v1/rules", started).0;
        (answer.status == 200).then_some(answer)
    });
    assert_eq!(listed.body.as_array().map(Vec::len), Some(1));
    println!("{mode} start: GET /v1/rules 200 after {took:?}");
    let metrics = self::metrics(&url);
    assert!(metrics.contains("spillway_rules_store_up 1\n"), "{metrics}");
    // Writes work again too.
    let created = service.create(&service.admin, &rule(2));
    assert_eq!(created.status, 201, "{}", created.body);
}

/// PostgreSQL ending the service's sessions while it stays up (as after a quick restart, or an
/// administrator's `pg_terminate_backend`) is no outage: the liveness probe and the pool drop
/// the connections it closed and ask again on fresh ones. So `/readyz` never answers 503 (the
/// probe looks every 250 ms; this watches four of its looks) and the next change goes through.
#[test]
fn postgres_ending_the_sessions_is_no_outage() {
    let service = start(Db::postgres());
    let url = service.url.clone();
    let created = service.create(&service.admin, &rule(1));
    assert_eq!(created.status, 201, "{}", created.body);
    let database = service.db.url();
    let ended: i64 = service.runtime.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&database)
            .await
            .expect("connects");
        sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND datname = current_database()) AS ended",
        )
        .fetch_one(&mut conn)
        .await
        .expect("ends the other sessions")
    });
    assert!(
        ended >= 2,
        "the probe's and the pool's sessions, at least: {ended}"
    );
    let ended_at = Instant::now();
    while ended_at.elapsed() < Duration::from_secs(1) {
        let (answer, after) = ask(&url, None, "/readyz", ended_at);
        assert_eq!(
            answer.status, 200,
            "/readyz {after:?} after: {}",
            answer.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let created = service.create(&service.admin, &rule(2));
    assert_eq!(created.status, 201, "{}", created.body);
}

#[test]
fn postgres_frozen_releases_the_requests_waiting_on_it() {
    let service = start(Db::postgres());
    let token = service.viewer.clone();
    let url = service.url.clone();
    let listed = ask(&url, Some(&token), "/v1/rules", Instant::now()).0;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let Db::Postgres(pg) = &service.db else {
        unreachable!("on PostgreSQL")
    };

    let frozen = Frozen::stop(server_processes(pg));
    let stopped = Instant::now();
    // Its connection is open and its server silent: only the service's own bounds end the wait.
    let waiting = ask_in_background(&url, Some(&token), "/v1/rules", stopped);
    until(READY_WITHIN, stopped, "/readyz answers 503", || {
        let answer = ask(&url, None, "/readyz", stopped).0;
        (answer.status == 503).then_some(())
    });
    let (answer, took) = waiting
        .recv_timeout(ANSWER_WITHIN)
        .expect("GET /v1/rules answers");
    assert!(took <= API_WITHIN, "answered after {took:?}");
    assert_store_unavailable(&answer);
    println!("frozen: GET /v1/rules answered 503 after {took:?}");
    let text = metrics(&url);
    assert!(text.contains("spillway_rules_store_up 0\n"), "{text}");

    drop(frozen);
    let thawed = Instant::now();
    until(READY_WITHIN, thawed, "/readyz answers 200", || {
        let answer = ask(&url, None, "/readyz", thawed).0;
        (answer.status == 200).then_some(())
    });
    let (_, took) = until(API_WITHIN, thawed, "GET /v1/rules answers 200", || {
        let answer = ask(&url, Some(&token), "/v1/rules", thawed).0;
        (answer.status == 200).then_some(())
    });
    println!("thawed: GET /v1/rules 200 after {took:?}");
}

/// On either store the probe keeps the store up and the version gauge in step with changes,
/// however busy the pool is.
fn the_store_stays_up_and_metrics_follow_the_version(db: Db) {
    let service = start(db);
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|n| {
                let service = &service;
                scope.spawn(move || service.create(&service.robot, &rule(n)).status)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|&s| s == 201), "{statuses:?}");
    let (text, _) = until(
        Duration::from_secs(2),
        Instant::now(),
        "the version gauge reads 20",
        || {
            let text = metrics(&service.url);
            text.contains("spillway_rules_version 20\n").then_some(text)
        },
    );
    assert!(text.contains("spillway_rules_store_up 1\n"), "{text}");
    assert_eq!(service.anonymous().get("/readyz").unwrap().status, 200);
}

on_both!(the_store_stays_up_and_metrics_follow_the_version);

fn postgres(service: &mut Service) -> &mut Postgres {
    match &mut service.db {
        Db::Postgres(pg) => pg,
        Db::Sqlite(_) => unreachable!("these tests run on PostgreSQL"),
    }
}

/// `pg_ctl stop -m MODE`, waiting (at most ten seconds) until the server is gone.
fn pg_ctl_stop(pg: &Postgres, mode: &str) {
    let data = pg.dir().join("data");
    let mut command = Command::new(pg_ctl(&data));
    command
        .arg("stop")
        .arg("-D")
        .arg(&data)
        .args(["-m", mode, "-w", "-t", "10"])
        .current_dir(pg.dir())
        .env("LC_ALL", "C");
    // pg_ctl refuses to run as root: run it as the data folder's owner, as the server runs.
    let owner = fs::metadata(&data).expect("the data folder");
    let me = fs::metadata("/proc/self").expect("/proc/self").uid();
    if owner.uid() != me {
        command.uid(owner.uid()).gid(owner.gid());
    }
    let output = command.output().expect("running pg_ctl");
    assert!(
        output.status.success(),
        "pg_ctl stop -m {mode}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The `pg_ctl` beside the running server's binary, so that their versions agree.
fn pg_ctl(data: &Path) -> PathBuf {
    let pid = postmaster_pid(data);
    let postgres = fs::read_link(format!("/proc/{pid}/exe")).expect("the postmaster's binary");
    postgres.with_file_name("pg_ctl")
}

/// The postmaster and its children (the backends of every connection): the whole server.
fn server_processes(pg: &Postgres) -> Vec<u32> {
    let postmaster = postmaster_pid(&pg.dir().join("data"));
    let mut pids = vec![postmaster];
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // `pid (comm) state ppid ...`; the name may hold spaces, never the last `)`.
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}

/// Processes stopped with SIGSTOP, continued when dropped, whatever the test did meanwhile.
struct Frozen(Vec<u32>);

impl Frozen {
    fn stop(pids: Vec<u32>) -> Frozen {
        signal("-STOP", &pids);
        Frozen(pids)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal("-CONT", &self.0);
    }
}

fn signal(which: &str, pids: &[u32]) {
    let status = Command::new("kill")
        .arg(which)
        .args(pids.iter().map(u32::to_string))
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {which} {pids:?}");
}

fn postmaster_pid(data: &Path) -> u32 {
    let pidfile = fs::read_to_string(data.join("postmaster.pid")).expect("postmaster.pid");
    let pid = pidfile.lines().next().expect("the postmaster's pid").trim();
    pid.parse().expect("a pid")
}

/// GET `path`, answered within [`ANSWER_WITHIN`]; also how long after `since` it answered.
fn ask(url: &str, token: Option<&str>, path: &str, since: Instant) -> (RulesResponse, Duration) {
    ask_in_background(url, token, path, since)
        .recv_timeout(ANSWER_WITHIN)
        .unwrap_or_else(|_| panic!("GET {path}: no answer within {ANSWER_WITHIN:?}"))
}

/// GET `path` on a thread of its own: the answer, and how long after `since` it came.
fn ask_in_background(
    url: &str,
    token: Option<&str>,
    path: &str,
    since: Instant,
) -> mpsc::Receiver<(RulesResponse, Duration)> {
    let (tx, rx) = mpsc::channel();
    let client = RulesClient::new(url, token.map(str::to_owned));
    let path = path.to_owned();
    std::thread::spawn(move || {
        let answer = client
            .get(&path)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        let _ = tx.send((answer, since.elapsed()));
    });
    rx
}

fn metrics(url: &str) -> String {
    let (answer, took) = ask(url, None, "/metrics", Instant::now());
    assert_eq!(answer.status, 200);
    assert!(took <= METRICS_WITHIN, "/metrics answered after {took:?}");
    answer.body.as_str().expect("text").to_owned()
}

/// Asks `check` every 20 ms until it returns `Some`; fails once `limit` has passed since
/// `since`. Returns the value and when, after `since`, it came.
fn until<T>(
    limit: Duration,
    since: Instant,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> (T, Duration) {
    loop {
        if let Some(value) = check() {
            let took = since.elapsed();
            assert!(took <= limit, "{what}: only after {took:?}, not {limit:?}");
            return (value, took);
        }
        assert!(since.elapsed() <= limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_store_unavailable(answer: &RulesResponse) {
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(
        answer.content_type.as_deref(),
        Some("application/problem+json"),
        "{}",
        answer.body
    );
    assert_eq!(
        answer.body["type"], "urn:spillway:problem:store-unavailable",
        "{}",
        answer.body
    );
    assert_eq!(answer.body["status"], 503);
    let retry_after: Option<u64> = answer.retry_after.as_deref().and_then(|s| s.parse().ok());
    assert!(
        retry_after.is_some_and(|s| s >= 1),
        "retry-after {:?}",
        answer.retry_after
    );
}
