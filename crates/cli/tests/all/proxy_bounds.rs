//! `spillway proxy` under a low file descriptor limit (`prlimit`), as an outside tester ran it:
//! HTTP/2 connections that send only their preface cannot exhaust its descriptors (the
//! connection cap refuses the excess at once and the idle timeout closes the rest), so a
//! legitimate request is still answered; and the soft limit is raised to the hard one at start.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{SPILLWAY, free_port, get, upstream};

/// The client connection preface of HTTP/2 and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// `spillway proxy` run by `prlimit --nofile=SOFT:HARD`, its log in a file; killed when dropped.
struct Limited {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Limited {
    fn start(nofile: &str, config: &Path, log: &Path, extra: &[&str]) -> Limited {
        let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let child = Command::new("prlimit")
            .arg(format!("--nofile={nofile}"))
            .arg(SPILLWAY)
            .arg("proxy")
            .arg("-c")
            .arg(config)
            .args(["--listen", &listen.to_string()])
            .args(["--upstream", &format!("http://{}", upstream())])
            .args(["--admin", &admin.to_string()])
            .args(extra)
            // Two serving threads, whatever the machine, so the descriptors it needs are known.
            .env("TOKIO_WORKER_THREADS", "2")
            .env("RUST_LOG", "info")
            .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
            .spawn()
            .expect("prlimit runs spillway proxy");
        let mut proxy = Limited {
            child,
            listen,
            admin,
        };
        // Bounded wait for the admin listener: 200 tries, 10 s at most.
        for _ in 0..200 {
            if get(admin, "/readyz").is_ok_and(|(status, _)| status == 200) {
                return proxy;
            }
            assert!(
                proxy.child.try_wait().unwrap().is_none(),
                "spillway proxy exited early: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("spillway proxy did not become ready");
    }

    /// The metric `name` (a plain counter or gauge) on the admin port.
    fn metric(&self, name: &str) -> u64 {
        let (_, metrics) = get(self.admin, "/metrics").unwrap();
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
            .parse()
            .unwrap()
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("spillway.yaml");
    std::fs::write(
        &config,
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: b, limit: 100/h, algorithm: token-bucket }\n",
    )
    .unwrap();
    config
}

/// Whether the proxy has closed `stream` (end of stream or reset) within `within`.
fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 1024];
    // At least one read, however little time is left.
    while let Some(left) =
        (deadline + Duration::from_millis(1)).checked_duration_since(Instant::now())
    {
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
    false
}

/// Sixty preface-only HTTP/2 connections against a proxy limited to 64 descriptors: before, they
/// exhausted its descriptors and held them forever, and a legitimate request got nothing. Now
/// the cap derived from the limit (16) refuses the excess at once, the idle timeout closes the
/// rest, and a legitimate request is answered.
#[test]
fn preface_only_http2_connections_cannot_exhaust_a_low_descriptor_limit() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    let proxy = Limited::start(
        "64",
        &config(dir.path()),
        &log,
        &["--idle-timeout", "1s", "--header-timeout", "1s"],
    );
    let mut held = Vec::new();
    for _ in 0..60 {
        let mut stream = TcpStream::connect(proxy.listen).unwrap();
        // A refused connection may be closed before the preface is written.
        let _ = stream.write_all(H2_PREFACE);
        held.push(stream);
    }
    // Refused ones are closed at once; the others within the idle timeout (1 s) and a margin:
    // 6 s for all of them.
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut closed = 0;
    for stream in &mut held {
        let left = deadline.saturating_duration_since(Instant::now());
        closed += usize::from(closed_within(stream, left));
    }
    assert_eq!(
        closed, 60,
        "connections still open 6 s after the idle timeout"
    );
    assert_eq!(get(proxy.listen, "/").unwrap(), (200, "ok".to_owned()));
    assert!(
        proxy.metric("spillway_connections_refused_total") >= 60 - 16,
        "the cap of 16 refused the rest"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("max_connections=16"), "{log}");
    assert!(log.contains("refused (closed at once)"), "{log}");
}

/// A soft limit below the hard one is raised to it at start, logged, and the default cap
/// follows: (4096 - 256) / 2 = 1920.
#[test]
fn the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    let proxy = Limited::start("64:4096", &config(dir.path()), &log, &[]);
    assert_eq!(get(proxy.listen, "/").unwrap(), (200, "ok".to_owned()));
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("file descriptor limit: soft 4096 (raised from 64), hard 4096"),
        "{log}"
    );
    assert!(log.contains("max_connections=1920"), "{log}");
    // An explicit cap wins over the derived one.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    let _proxy = Limited::start(
        "64:4096",
        &config(dir.path()),
        &log,
        &["--max-connections", "7"],
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("max_connections=7"), "{log}");
}

/// `spillway up` raises its soft limit as `spillway proxy` does, before its sidecar derives its
/// connection cap from it.
#[test]
fn spillway_up_raises_the_soft_descriptor_limit_too() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("up.log");
    let ports: Vec<String> = (0..7)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let mut child = Command::new("prlimit")
        .arg("--nofile=64:4096")
        .arg(SPILLWAY)
        .args(["up", "-c"])
        .arg(config(dir.path()))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--upstream", &format!("http://{}", upstream())])
        .args(["--listen", &ports[0], "--admin", &ports[1]])
        .args([
            "--rules-listen",
            &ports[2],
            "--controller-listen",
            &ports[3],
        ])
        .args([
            "--controller-admin",
            &ports[4],
            "--aggregator-listen",
            &ports[5],
        ])
        .args(["--aggregator-admin", &ports[6]])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .spawn()
        .expect("prlimit runs spillway up");
    let wanted = "file descriptor limit: soft 4096 (raised from 64), hard 4096";
    let started = Instant::now();
    let mut log = String::new();
    while started.elapsed() < Duration::from_secs(30) {
        log = std::fs::read_to_string(&log_path).unwrap_or_default();
        if log.contains(wanted) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.contains(wanted), "{log}");
}
