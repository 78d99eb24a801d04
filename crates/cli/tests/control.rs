//! `spillway proxy --aggregator` end to end through the real binary: a controller, a zone
//! aggregator and two linked proxies as processes on loopback, a real upstream, and paced load
//! whose 429s are counted at the proxies (MISSION G5, G8, G9, G12).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SPILLWAY: &str = env!("CARGO_BIN_EXE_spillway");
const TTL: Duration = Duration::from_secs(1);

/// One global drop-ratio bucket of `limit`/s, reports every 250 ms, instructions valid 1 s.
fn rules(limit: u32) -> String {
    format!(
        "version: 1\ncontrol:\n  report_interval: 250ms\n  instruction_ttl: 1s\nservices:\n  api:\n    buckets:\n      - {{ name: all, limit: {limit}/s, scope: global }}\n"
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A child process, killed when dropped so a failing test leaves nothing behind.
struct Proc(Child);

impl Proc {
    fn spawn(args: &[&str]) -> Proc {
        Proc(
            Command::new(SPILLWAY)
                .args(args)
                .env("RUST_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spillway starts"),
        )
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A real upstream answering `200 ok` to every request on keep-alive connections.
fn upstream() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut stream = stream;
                loop {
                    let mut line = String::new();
                    // Requests carry no body: read the head up to its blank line.
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// One HTTP/1.1 request on a keep-alive connection; returns the status.
fn request(reader: &mut BufReader<TcpStream>, path: &str) -> std::io::Result<u16> {
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\n\r\n");
    reader.get_mut().write_all(head.as_bytes())?;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(status)
}

/// A GET on an admin listener; the body, or an empty string when it is not answering.
fn admin_get(port: u16, path: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    if stream.write_all(head.as_bytes()).is_err() {
        return String::new();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// The value of the first sample of `metric` whose line contains `with`.
fn metric(body: &str, metric: &str, with: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(metric) && l.contains(with))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn wait_for(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if condition() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Paced load on one proxy: `rps` requests a second from one thread, counting answers.
struct Load {
    sent: Arc<AtomicU64>,
    limited: Arc<AtomicU64>,
    /// When the last 429 came, in ms since the load started.
    last_limited_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    started: Instant,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(port: u16, rps: f64) -> Load {
        let sent = Arc::new(AtomicU64::new(0));
        let limited = Arc::new(AtomicU64::new(0));
        let last_limited_ms = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, l, last, halt) = (
            sent.clone(),
            limited.clone(),
            last_limited_ms.clone(),
            stop.clone(),
        );
        let started = Instant::now();
        let thread = std::thread::spawn(move || {
            let period = Duration::from_secs_f64(1.0 / rps);
            let start = started;
            let mut reader = None;
            let mut n = 0u32;
            // Bounded: at most 60 s of load whatever the test does.
            while !halt.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(60) {
                let due = start + period * n;
                n += 1;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let conn = match reader.take() {
                    Some(r) => r,
                    None => match TcpStream::connect(("127.0.0.1", port)) {
                        Ok(stream) => BufReader::new(stream),
                        Err(_) => continue,
                    },
                };
                let mut conn = conn;
                match request(&mut conn, "/orders") {
                    Ok(status) => {
                        s.fetch_add(1, Ordering::Relaxed);
                        if status == 429 {
                            l.fetch_add(1, Ordering::Relaxed);
                            last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                        }
                        reader = Some(conn);
                    }
                    Err(_) => reader = None,
                }
            }
        });
        Load {
            sent,
            limited,
            last_limited_ms,
            stop,
            started,
            thread: Some(thread),
        }
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.limited.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A controller watching a rules file, one aggregator, two linked proxies and an upstream.
struct Fleet {
    dir: tempfile::TempDir,
    controller_port: u16,
    controller: Proc,
    _aggregator: Proc,
    proxies: Vec<(Proc, u16, u16)>,
}

impl Fleet {
    fn start(limit: u32) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules(limit)).unwrap();
        let controller_port = free_port();
        let controller = Fleet::controller(dir.path(), controller_port);
        let aggregator_port = free_port();
        let aggregator = Proc::spawn(&[
            "aggregator",
            "--listen",
            &format!("127.0.0.1:{aggregator_port}"),
            "--region",
            "r1",
            "--zone",
            "z1",
            "--controller",
            &format!("http://127.0.0.1:{controller_port}"),
        ]);
        let upstream = upstream();
        let mut fleet = Fleet {
            dir,
            controller_port,
            controller,
            _aggregator: aggregator,
            proxies: Vec::new(),
        };
        for host in ["p1", "p2"] {
            let proxy = fleet.proxy(host, aggregator_port, upstream);
            fleet.proxies.push(proxy);
        }
        fleet
    }

    fn controller(dir: &Path, port: u16) -> Proc {
        Proc::spawn(&[
            "controller",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--region",
            "r1",
            "-c",
            &dir.join("rules.yaml").display().to_string(),
        ])
    }

    /// A linked proxy: (process, listen port, admin port). Its file has a limit nobody uses, so
    /// only rules from the control plane can make it drop.
    fn proxy(&self, host: &str, aggregator: u16, upstream: u16) -> (Proc, u16, u16) {
        let file = self.dir.path().join(format!("{host}.yaml"));
        std::fs::write(&file, rules(1_000_000)).unwrap();
        let (listen, admin) = (free_port(), free_port());
        let state = self.dir.path().join(format!("{host}-state"));
        let proc = Proc::spawn(&[
            "proxy",
            "-c",
            &file.display().to_string(),
            "--listen",
            &format!("127.0.0.1:{listen}"),
            "--upstream",
            &format!("http://127.0.0.1:{upstream}"),
            "--aggregator",
            &format!("http://127.0.0.1:{aggregator}"),
            "--region",
            "r1",
            "--zone",
            "z1",
            "--host-id",
            host,
            "--state-dir",
            &state.display().to_string(),
            "--admin",
            &format!("127.0.0.1:{admin}"),
        ]);
        (proc, listen, admin)
    }

    fn metrics(&self, i: usize) -> String {
        admin_get(self.proxies[i].2, "/metrics")
    }

    /// Both proxies hear from the control plane and run `limit`.
    fn wait_live(&self, limit: u32) {
        wait_for(
            Duration::from_secs(20),
            "both proxies linked and running the controller's rules",
            || {
                (0..2).all(|i| {
                    let m = self.metrics(i);
                    metric(&m, "spillway_control_plane_connected", "") == Some(1.0)
                        && metric(&m, "spillway_bucket_limit_rps", "bucket=\"all\"")
                            == Some(f64::from(limit))
                })
            },
        );
    }
}

#[test]
fn two_linked_proxies_at_one_and_a_half_times_a_global_limit_each_drop_a_third() {
    let fleet = Fleet::start(100);
    fleet.wait_live(100);
    // 75/s on each proxy: 150/s against 100/s.
    let loads: Vec<Load> = fleet
        .proxies
        .iter()
        .map(|p| Load::start(p.1, 75.0))
        .collect();
    // Let the loop see the load (a few 250 ms intervals), then measure over 4 s.
    std::thread::sleep(Duration::from_secs(2));
    let before: Vec<(u64, u64)> = loads.iter().map(Load::counts).collect();
    std::thread::sleep(Duration::from_secs(4));
    for (i, (load, before)) in loads.iter().zip(before).enumerate() {
        let (sent, limited) = load.counts();
        let (sent, limited) = (sent - before.0, limited - before.1);
        assert!(sent >= 240, "proxy {i} sent only {sent} requests in 4 s");
        let dropped = limited as f64 / sent as f64;
        assert!(
            (dropped - 1.0 / 3.0).abs() < 0.08,
            "proxy {i} dropped {limited} of {sent} ({dropped:.3}), not about 1/3"
        );
        let ratio = metric(&fleet.metrics(i), "spillway_drop_ratio", "bucket=\"all\"").unwrap();
        assert!((ratio - 1.0 / 3.0).abs() < 0.05, "proxy {i} ratio {ratio}");
    }
}

#[test]
fn killing_the_controller_makes_the_proxies_fail_open_within_the_ttl() {
    let mut fleet = Fleet::start(100);
    fleet.wait_live(100);
    let loads: Vec<Load> = fleet
        .proxies
        .iter()
        .map(|p| Load::start(p.1, 75.0))
        .collect();
    wait_for(Duration::from_secs(5), "both proxies dropping", || {
        loads.iter().all(|l| l.counts().1 > 10)
    });
    fleet.controller.kill();
    let killed: Vec<Duration> = loads.iter().map(|l| l.started.elapsed()).collect();
    // Within the TTL plus a report interval, no proxy drops any more and both say so.
    wait_for(
        TTL + Duration::from_secs(2),
        "control_plane_connected 0 on both proxies",
        || {
            (0..2).all(|i| {
                metric(&fleet.metrics(i), "spillway_control_plane_connected", "") == Some(0.0)
            })
        },
    );
    let quiet_from: Vec<u64> = loads.iter().map(|l| l.counts().1).collect();
    std::thread::sleep(Duration::from_secs(2));
    for (i, (load, before)) in loads.iter().zip(quiet_from).enumerate() {
        let (_, limited) = load.counts();
        assert_eq!(limited, before, "proxy {i} still drops after its TTL");
        let last = Duration::from_millis(load.last_limited_ms.load(Ordering::Relaxed));
        assert!(
            last <= killed[i] + TTL + Duration::from_millis(500),
            "proxy {i} dropped {:?} after the controller died (TTL {TTL:?})",
            last.saturating_sub(killed[i])
        );
        let m = fleet.metrics(i);
        assert!(
            metric(&m, "spillway_instructions_expired_total", "").unwrap_or(0.0) >= 1.0,
            "proxy {i} counted no expired instruction:\n{m}"
        );
        assert_eq!(
            metric(&m, "spillway_drop_ratio", "bucket=\"all\""),
            Some(0.0)
        );
    }
    // A restarted controller brings enforcement back.
    fleet.controller = Fleet::controller(fleet.dir.path(), fleet.controller_port);
    let before: Vec<u64> = loads.iter().map(|l| l.counts().1).collect();
    wait_for(Duration::from_secs(10), "enforcement back on both", || {
        loads
            .iter()
            .zip(&before)
            .all(|(l, b)| l.counts().1 > b + 10)
    });
}

#[test]
fn a_rule_change_reaches_both_proxies_and_a_restarted_proxy_starts_with_it() {
    let mut fleet = Fleet::start(100);
    fleet.wait_live(100);
    let path = fleet.dir.path().join("rules.yaml");
    std::fs::write(&path, rules(250)).unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(1))
        .unwrap();
    let took = wait_for(
        Duration::from_secs(10),
        "both proxies run the new limit",
        || {
            (0..2).all(|i| {
                metric(
                    &fleet.metrics(i),
                    "spillway_bucket_limit_rps",
                    "bucket=\"all\"",
                ) == Some(250.0)
            })
        },
    );
    eprintln!("the change reached both proxies in {took:?}");
    let version = metric(&fleet.metrics(0), "spillway_rules_version", "").unwrap();
    assert!(version > 1.0, "the control plane's version, got {version}");

    // Without any control plane, a restarted proxy enforces the last good rules at once.
    fleet.controller.kill();
    let (mut proc, listen, admin) = fleet.proxies.remove(0);
    proc.kill();
    let dead = free_port();
    let file = fleet.dir.path().join("p1.yaml");
    let state = fleet.dir.path().join("p1-state");
    let _restarted = Proc::spawn(&[
        "proxy",
        "-c",
        &file.display().to_string(),
        "--listen",
        &format!("127.0.0.1:{listen}"),
        "--upstream",
        "http://127.0.0.1:9",
        "--aggregator",
        &format!("http://127.0.0.1:{dead}"),
        "--region",
        "r1",
        "--zone",
        "z1",
        "--state-dir",
        &state.display().to_string(),
        "--admin",
        &format!("127.0.0.1:{admin}"),
    ]);
    wait_for(
        Duration::from_secs(10),
        "the restarted proxy runs the saved rules",
        || {
            let m = admin_get(admin, "/metrics");
            metric(&m, "spillway_bucket_limit_rps", "bucket=\"all\"") == Some(250.0)
                && metric(&m, "spillway_rules_version", "") == Some(version)
                && metric(&m, "spillway_control_plane_connected", "") == Some(0.0)
        },
    );
}
