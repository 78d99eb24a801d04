//! The pieces of the control-plane process tests: child processes of the binary, a keep-alive
//! upstream, paced load that counts 429s, admin GETs and metric lookups, and bounded waits.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{SPILLWAY, free_port};

/// A child process, killed when dropped so a failing test leaves nothing behind.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(args: &[&str]) -> Proc {
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

    /// Like [`Proc::spawn`], its stderr (logs at `info`) written to `log`.
    pub fn spawn_logged(args: &[&str], log: &std::path::Path) -> Proc {
        let file = std::fs::File::create(log).expect("the log file");
        Proc(
            Command::new(SPILLWAY)
                .args(args)
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(file)
                .spawn()
                .expect("spillway starts"),
        )
    }

    /// Asks the process to stop (SIGTERM, as an orchestrator does) and waits at most 30 s for
    /// it to exit: its exit status, or `None` when it had to be killed.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let asked = Instant::now();
        while asked.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        None
    }

    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `spillway controller` of region `r1` on `port`, watching the rules file `rules`, with
/// `extra` arguments.
pub fn controller(port: u16, rules: &Path, extra: &[&str]) -> Proc {
    let (listen, rules) = (format!("127.0.0.1:{port}"), rules.display().to_string());
    let mut args = vec![
        "controller",
        "--listen",
        &listen,
        "--region",
        "r1",
        "-c",
        &rules,
    ];
    args.extend_from_slice(extra);
    Proc::spawn(&args)
}

/// `spillway aggregator` of zone `zone` in region `r1` on `port`, linked to the controller on
/// `controller`, with `extra` arguments.
pub fn aggregator(port: u16, zone: &str, controller: u16, extra: &[&str]) -> Proc {
    let listen = format!("127.0.0.1:{port}");
    let controller = format!("http://127.0.0.1:{controller}");
    let mut args = vec![
        "aggregator",
        "--listen",
        &listen,
        "--region",
        "r1",
        "--zone",
        zone,
        "--controller",
        &controller,
    ];
    args.extend_from_slice(extra);
    Proc::spawn(&args)
}

/// A `spillway proxy` of region `r1` linked to the aggregator of `zone` on `aggregator`: its
/// own configuration `file`, host id `host`, its state in `dir/HOST-state`, in front of the
/// upstream on `upstream`. Returns the process, its listen port and its admin port.
pub fn linked_proxy(
    dir: &Path,
    file: &Path,
    upstream: u16,
    aggregator: u16,
    zone: &str,
    host: &str,
) -> (Proc, u16, u16) {
    let (listen, admin) = (free_port(), free_port());
    let state = dir.join(format!("{host}-state"));
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
        zone,
        "--host-id",
        host,
        "--state-dir",
        &state.display().to_string(),
        "--admin",
        &format!("127.0.0.1:{admin}"),
    ]);
    (proc, listen, admin)
}

/// A real upstream answering `200 ok` to every request on keep-alive connections.
pub fn keep_alive_upstream() -> u16 {
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
pub fn request(reader: &mut BufReader<TcpStream>, path: &str) -> std::io::Result<u16> {
    request_with(reader, path, "")
}

/// [`request`] with more header lines, each ending in CRLF.
pub fn request_with(
    reader: &mut BufReader<TcpStream>,
    path: &str,
    headers: &str,
) -> std::io::Result<u16> {
    let head = format!("GET {path} HTTP/1.1\r\nhost: test\r\n{headers}\r\n");
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
pub fn admin_get(port: u16, path: &str) -> String {
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
pub fn metric(body: &str, metric: &str, with: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(metric) && l.contains(with))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

pub fn wait_for(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) -> Duration {
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
pub struct Load {
    pub sent: Arc<AtomicU64>,
    pub limited: Arc<AtomicU64>,
    /// When the last 429 came, in ms since the load started.
    pub last_limited_ms: Arc<AtomicU64>,
    pub stop: Arc<AtomicBool>,
    pub started: Instant,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

/// How far behind its schedule a [`Load`] still catches up.
const CATCH_UP: Duration = Duration::from_millis(100);

impl Load {
    /// `rps` GETs of `/orders` a second.
    pub fn start(port: u16, rps: f64) -> Load {
        Load::on_path(port, rps, "/orders")
    }

    /// `rps` GETs of `path` a second.
    pub fn on_path(port: u16, rps: f64, path: &str) -> Load {
        Load::with_headers(port, rps, path, "")
    }

    /// `rps` GETs of `path` a second with more header lines (each ending in CRLF).
    pub fn with_headers(port: u16, rps: f64, path: &str, headers: &str) -> Load {
        let path = path.to_owned();
        let headers = headers.to_owned();
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
                let mut due = start + period * n;
                // A thread starved for a while (two busy cores) makes up at most 100 ms of
                // missed requests and skips the rest: catching all of them up would send a
                // burst the test never meant to offer.
                let now = Instant::now();
                if now.saturating_duration_since(due) > CATCH_UP {
                    n = ((now - CATCH_UP - start).as_secs_f64() / period.as_secs_f64()) as u32;
                    due = start + period * n;
                }
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
                match request_with(&mut conn, &path, &headers) {
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

    pub fn counts(&self) -> (u64, u64) {
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
