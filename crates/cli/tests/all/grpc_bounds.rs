//! The gRPC listeners' bounds, against the real binary with a raw HTTP/2 client
//! (`tests/grpc_streams.py`, frames written with the `h2` package's hyperframe and hpack, so it
//! can do what client libraries refuse to: open streams past the advertised limit and never send
//! their message). `spillway rls`: 20,000 bodiless `ShouldRateLimit` streams on one connection
//! once held every stream open (205 MB peak for the debug build, 187 MB for the release one);
//! now the listener advertises `SETTINGS_MAX_CONCURRENT_STREAMS`, refuses the streams beyond it
//! and stays under 60 MB (VmHWM from /proc). A call whose message never comes is answered
//! `DEADLINE_EXCEEDED`; a connection beyond `--grpc-max-connections` is closed at once; an idle
//! one gets `GOAWAY`. The aggregator, its RLQS listener, the controller and the proxy's
//! `--rls-listen` advertise their limit too, and an RLQS stream that never sends its first
//! message is ended.
//!
//! The interpreter is `SPILLWAY_PYTHON` (scripts/test makes a virtual environment with `h2`),
//! else `python3`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::fleet::{aggregator, controller, wait_for};
use crate::support::{Proxy, SPILLWAY, free_port, get, upstream};
use serde_json::Value;

const RLQS_METHOD: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy-ratelimit.yaml")
}

/// A running `spillway rls` with `extra` flags, killed when dropped.
struct Rls {
    child: Child,
    listen: SocketAddr,
}

impl Rls {
    fn start(extra: &[&str]) -> Rls {
        let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let child = Command::new(SPILLWAY)
            .arg("rls")
            .arg("-c")
            .arg(example())
            .args(["--listen", &listen.to_string()])
            .args(["--admin", &admin.to_string()])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .expect("spillway rls starts");
        let mut rls = Rls { child, listen };
        wait_for(Duration::from_secs(15), "spillway rls is ready", || {
            assert!(
                rls.child.try_wait().unwrap().is_none(),
                "spillway rls exited early"
            );
            get(admin, "/readyz").is_ok_and(|(status, _)| status == 200)
        });
        rls
    }

    /// The process's peak resident set (`VmHWM`), in kB.
    fn peak_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status")
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `tests/grpc_streams.py` against `addr` with `args` and returns its JSON line.
fn raw_client(addr: SocketAddr, args: &[&str]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc_streams.py");
    let python = std::env::var("SPILLWAY_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .arg(&script)
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .args(args)
        .output()
        .expect("python runs (scripts/test makes SPILLWAY_PYTHON, a venv with h2)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the raw HTTP/2 client failed (scripts/test installs h2 into SPILLWAY_PYTHON): {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn twenty_thousand_bodiless_rls_streams_on_one_connection_stay_under_60_mb() {
    let rls = Rls::start(&[]);
    let before = rls.peak_kb();
    let seen = raw_client(rls.listen, &["streams", "20000", "3"]);
    let peak = rls.peak_kb();
    eprintln!("VmHWM {before} kB before, {peak} kB after: {seen}");
    assert_eq!(seen["max_concurrent_streams"], 1024, "{seen}");
    assert!(
        seen["refused"].as_u64().unwrap() > 0,
        "the streams beyond the advertised limit are refused: {seen}"
    );
    assert!(
        peak < 60 * 1024,
        "peak RSS {peak} kB (from {before} kB) for 20,000 bodiless streams: {seen}"
    );
}

#[test]
fn an_rls_call_whose_message_never_comes_is_answered_deadline_exceeded() {
    let rls = Rls::start(&["--grpc-request-timeout", "1s", "--grpc-max-streams", "50"]);
    // Ten streams that send their headers only; the client reads for up to 8 s.
    let seen = raw_client(rls.listen, &["streams", "10", "8"]);
    assert_eq!(seen["max_concurrent_streams"], 50, "{seen}");
    assert_eq!(seen["refused"], 0, "{seen}");
    // grpc-status 4: DEADLINE_EXCEEDED.
    assert_eq!(seen["statuses"]["4"], 10, "{seen}");
    assert_eq!(seen["open"], true, "the connection stays usable: {seen}");
}

/// A raw client connection that has sent the HTTP/2 preface: whether the server answered with
/// its SETTINGS (`true`) or closed it at once (`false`).
fn greeted(addr: SocketAddr) -> (TcpStream, bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The preface and an empty SETTINGS frame.
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let _ = stream.write_all(&hello);
    let mut buf = [0u8; 9];
    let answered = match stream.read(&mut buf) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => false,
        Err(e) => panic!("reading the server's greeting: {e}"),
    };
    (stream, answered)
}

#[test]
fn connections_beyond_the_cap_are_closed_at_once() {
    let rls = Rls::start(&["--grpc-max-connections", "2"]);
    let (_a, a) = greeted(rls.listen);
    let (_b, b) = greeted(rls.listen);
    assert!(a && b, "the first two connections are served");
    let (_c, c) = greeted(rls.listen);
    assert!(!c, "a third connection is closed without a greeting");
    drop((_a, _b));
    // Once the others close, a new connection is served again.
    wait_for(
        Duration::from_secs(10),
        "a connection is served again",
        || greeted(rls.listen).1,
    );
}

#[test]
fn a_connection_with_no_call_gets_goaway_after_the_idle_timeout() {
    let rls = Rls::start(&["--grpc-idle-timeout", "1s"]);
    let seen = raw_client(rls.listen, &["idle", "10"]);
    assert!(seen["goaway_after"].is_number(), "{seen}");
    assert!(seen["closed_after"].is_number(), "{seen}");
}

#[test]
fn the_control_plane_rlqs_and_proxy_listeners_advertise_their_limit_and_end_silent_streams() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::copy(example(), &rules).unwrap();
    let controller_port = free_port();
    let bounds = ["--grpc-max-streams", "7", "--grpc-idle-timeout", "1s"];
    let _controller = controller(controller_port, &rules, &bounds);
    let (aggregator_port, rlqs_port, admin) = (free_port(), free_port(), free_port());
    let rlqs = format!("127.0.0.1:{rlqs_port}");
    let admin_addr = format!("127.0.0.1:{admin}");
    let mut args = vec!["--rlqs-listen", &rlqs, "--admin", &admin_addr];
    args.extend(bounds);
    let _aggregator = aggregator(aggregator_port, "z1", controller_port, &args);
    wait_for(Duration::from_secs(30), "the aggregator is ready", || {
        get(([127, 0, 0, 1], admin).into(), "/readyz").is_ok_and(|(status, _)| status == 200)
    });
    for port in [controller_port, aggregator_port, rlqs_port] {
        let seen = raw_client(([127, 0, 0, 1], port).into(), &["streams", "0", "0"]);
        assert_eq!(seen["max_concurrent_streams"], 7, "port {port}: {seen}");
    }
    // RLQS streams that never send their first report are ended after the idle timeout (each
    // gets its trailers), as are the control plane's.
    let seen = raw_client(rlqs.parse().unwrap(), &["streams", "3", "8", RLQS_METHOD]);
    assert_eq!(seen["answered"], 3, "{seen}");
    let link = "/spillway.v1.Aggregator/Link";
    let seen = raw_client(
        ([127, 0, 0, 1], aggregator_port).into(),
        &["streams", "3", "8", link],
    );
    assert_eq!(seen["answered"], 3, "{seen}");

    let rls: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let _proxy = Proxy::start_with(
        &example(),
        upstream(),
        &["--rls-listen", &rls.to_string(), "--grpc-max-streams", "9"],
    );
    let seen = raw_client(rls, &["streams", "0", "0"]);
    assert_eq!(seen["max_concurrent_streams"], 9, "{seen}");
}
