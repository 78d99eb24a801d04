//! The rest of a fleet, for `run.sh`: background `EVALSHA` calls to the networked Redis at a
//! fixed rate, so that the Redis-per-request baseline meets a Redis that is also serving other
//! clients, as GRL's was, instead of an idle one. Std-only, built with `rustc -O` like `delay.rs`.
//!
//! `fleet ADDR SHA RATE SECONDS [CONNECTIONS] [KEYS]`: over CONNECTIONS connections (default 4),
//! sends `EVALSHA SHA 1 fleet:K 1000000000 1000000000 1000000 1 1` (the token bucket script of
//! `spillway-redis`, over KEYS keys, default 1000, a limit never hit) at RATE calls per second in
//! all, written in pipelined batches once a millisecond, for SECONDS seconds at most: a bounded
//! count. No connection has more than 256 calls unanswered, so with a RATE above what Redis can
//! answer the fleet measures its capacity instead. Prints `FLEET answered_per_second answered`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const WINDOW: u64 = 256;

/// The end of the RESP value that starts at `at`, when `buf` holds all of it.
fn value_end(buf: &[u8], at: usize) -> Option<usize> {
    let line_end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let next = line_end + 2;
    let number = || -> Option<i64> { std::str::from_utf8(&buf[at + 1..line_end]).ok()?.parse().ok() };
    match buf[at] {
        b'+' | b'-' | b':' => Some(next),
        b'$' => match number()? {
            n if n < 0 => Some(next),
            n => {
                let end = next + n as usize + 2;
                (buf.len() >= end).then_some(end)
            }
        },
        b'*' => {
            let mut end = next;
            for _ in 0..number()?.max(0) {
                end = value_end(buf, end)?;
            }
            Some(end)
        }
        _ => None,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: fleet ADDR SHA RATE SECONDS [CONNECTIONS] [KEYS]");
        std::process::exit(2);
    }
    let addr = args[1].clone();
    let sha = args[2].clone();
    let rate: f64 = args[3].parse().expect("RATE");
    let seconds: f64 = args[4].parse().expect("SECONDS");
    let connections: u64 = args.get(5).map_or(4, |c| c.parse().expect("CONNECTIONS"));
    let keys: u64 = args.get(6).map_or(1000, |k| k.parse().expect("KEYS"));
    let per_connection = rate / connections as f64;
    let limit = Duration::from_secs_f64(seconds);
    let answered = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut threads = Vec::new();
    for c in 0..connections {
        let stream = TcpStream::connect(&addr).expect("connect to Redis");
        stream.set_nodelay(true).expect("nodelay");
        let mut reader = stream.try_clone().expect("clone");
        let mut writer = stream;
        let done = Arc::new(AtomicU64::new(0));
        let (sha, answered, read) = (sha.clone(), answered.clone(), done.clone());
        threads.push(std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 65536];
            reader
                .set_read_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            while start.elapsed() < limit + Duration::from_secs(1) {
                match reader.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(_) => continue,
                }
                let mut at = 0;
                while let Some(end) = value_end(&buf, at) {
                    at = end;
                    read.fetch_add(1, Ordering::Relaxed);
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                buf.drain(..at);
            }
        }));
        threads.push(std::thread::spawn(move || {
            let mut sent = 0u64;
            let mut batch = Vec::new();
            while start.elapsed() < limit {
                let due = (start.elapsed().as_secs_f64() * per_connection) as u64;
                let room = (done.load(Ordering::Relaxed) + WINDOW).saturating_sub(sent);
                let n = due.saturating_sub(sent).min(room);
                batch.clear();
                for i in sent..sent + n {
                    let key = format!("fleet:{}", (i * connections + c) % keys);
                    let parts = [
                        "EVALSHA", &sha, "1", &key, "1000000000", "1000000000", "1000000", "1",
                        "1",
                    ];
                    write!(batch, "*{}\r\n", parts.len()).unwrap();
                    for part in parts {
                        write!(batch, "${}\r\n{part}\r\n", part.len()).unwrap();
                    }
                }
                if n > 0 && writer.write_all(&batch).is_err() {
                    return;
                }
                sent += n;
                std::thread::sleep(Duration::from_millis(1));
            }
        }));
    }
    for thread in threads {
        let _ = thread.join();
    }
    let elapsed = start.elapsed().as_secs_f64().min(seconds);
    let answered = answered.load(Ordering::Relaxed);
    println!("FLEET {:.0} {answered}", answered as f64 / elapsed);
}
