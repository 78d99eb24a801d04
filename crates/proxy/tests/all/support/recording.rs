//! A raw upstream written for the upgrade and identity tests: it reads HTTP/1.1 request heads
//! off its sockets itself, records each one, and answers as its [`Mode`] says. Unlike an
//! application server it obeys no rule of the protocol it is not told to, so a test can play the
//! upstreams an attacker would pick: one that accepts `h2c` and then speaks HTTP/2, one that
//! answers `101` to any upgrade and goes on reading HTTP/1.1.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the upstream answers an upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Plain HTTP/1.1: every request answered 200, its head in the body.
    Plain,
    /// An `upgrade: h2c` request is answered `101` (RFC 7540 §3.2) and the connection then
    /// serves HTTP/2, every request recorded as `h2 METHOD PATH` and answered 200.
    H2c,
    /// Any upgrade is answered `101 upgrade: websocket` with a `sec-websocket-accept` that
    /// answers no key, and the connection goes on being read as HTTP/1.1.
    LenientWrongAccept,
    /// The same, with no `sec-websocket-accept` at all.
    LenientNoAccept,
}

/// The upstream: its address, and every request it received, in order (a head as received, in
/// lower case, or `h2 METHOD PATH`).
pub struct Recording {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recording {
    pub async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, mode, log.clone()));
            }
        });
        Self { addr, seen, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it has received so far.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one head (up to its blank line) a byte at a time, so nothing after it is taken off the
/// socket; `None` at the end of the stream or past 64 KiB.
pub async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 * 1024 || stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

async fn serve(mut stream: TcpStream, mode: Mode, seen: Arc<Mutex<Vec<String>>>) {
    while let Some(head) = read_head(&mut stream).await {
        let lower = head.to_ascii_lowercase();
        seen.lock().unwrap().push(lower.clone());
        let asks = |protocol: &str| {
            lower
                .lines()
                .any(|l| l.starts_with("upgrade:") && l.contains(protocol))
        };
        match mode {
            Mode::H2c if asks("h2c") => {
                let switch = "HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: h2c\r\n\r\n";
                if stream.write_all(switch.as_bytes()).await.is_err() {
                    return;
                }
                serve_h2(stream, seen).await;
                return;
            }
            Mode::LenientWrongAccept | Mode::LenientNoAccept if lower.contains("\nupgrade:") => {
                let accept = if mode == Mode::LenientWrongAccept {
                    "sec-websocket-accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n"
                } else {
                    ""
                };
                let switch = format!(
                    "HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\n{accept}\r\n"
                );
                if stream.write_all(switch.as_bytes()).await.is_err() {
                    return;
                }
                // And on it reads HTTP/1.1, as if nothing had switched.
            }
            _ => {
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{head}",
                    head.len()
                );
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// HTTP/2 on a switched connection, every request recorded.
async fn serve_h2(stream: TcpStream, seen: Arc<Mutex<Vec<String>>>) {
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let seen = seen.clone();
        async move {
            seen.lock()
                .unwrap()
                .push(format!("h2 {} {}", request.method(), request.uri().path()));
            Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                b"h2 ok",
            ))))
        }
    });
    let _ = tokio::time::timeout(
        Duration::from_secs(30),
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(stream), service),
    )
    .await;
}
