//! Shared by the process tests: a small upstream, free ports, one-shot GETs, and `spillway proxy`
//! as a child process.
// Each test file uses part of this module.
#![allow(dead_code)]

pub mod fleet;
pub mod up;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const SPILLWAY: &str = env!("CARGO_BIN_EXE_spillway");

/// A small HTTP/1.1 upstream on its own thread: answers `200 ok` to everything, one request per
/// connection.
pub fn upstream() -> SocketAddr {
    upstream_after(Duration::ZERO)
}

/// [`upstream`], holding every request for `delay` before it answers (each connection on a thread
/// of its own).
pub fn upstream_after(delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                // The request line and headers, up to the blank line; GETs have no body.
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line == "\r\n" {
                        break;
                    }
                    line.clear();
                }
                std::thread::sleep(delay);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
            });
        }
    });
    addr
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// One GET on a fresh connection: the status and the body.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

/// `spillway proxy` as a child process, killed when dropped.
pub struct Proxy {
    child: Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
}

impl Proxy {
    pub fn start(config: &Path, upstream: SocketAddr) -> Proxy {
        Self::start_with(config, upstream, &[])
    }

    /// Starts the proxy with `extra` arguments, and waits until `/readyz` answers.
    pub fn start_with(config: &Path, upstream: SocketAddr, extra: &[&str]) -> Proxy {
        Self::start_logged(config, upstream, extra, None)
    }

    /// Like [`Proxy::start_with`], its stderr (logs at `info`) written to `log` when given.
    pub fn start_logged(
        config: &Path,
        upstream: SocketAddr,
        extra: &[&str],
        log: Option<&Path>,
    ) -> Proxy {
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
            None => Stdio::null(),
        };
        let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let child = Command::new(SPILLWAY)
            .arg("proxy")
            .arg("-c")
            .arg(config)
            .args(["--listen", &listen.to_string()])
            .args(["--upstream", &format!("http://{upstream}")])
            .args(["--admin", &admin.to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .stderr(stderr)
            .spawn()
            .expect("spillway proxy starts");
        let mut proxy = Proxy {
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
                "spillway proxy exited early"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = proxy.child.kill();
        panic!("spillway proxy did not become ready");
    }

    /// Sends SIGTERM and waits (10 s at most) for the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        terminate(&mut self.child, Duration::from_secs(10))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `child` SIGTERM and waits at most `patience` for its exit status (killing it then).
pub fn terminate(child: &mut Child, patience: Duration) -> ExitStatus {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    panic!("the process did not stop within {patience:?} of SIGTERM");
}
