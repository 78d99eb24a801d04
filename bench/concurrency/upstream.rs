//! The benchmark's upstream (std only, built with `rustc -O`): a server of a fixed number of
//! workers, each serving one request at a time in a fixed service time, behind a FIFO queue, so
//! its capacity is `WORKERS / SERVICE` and, past its workers, every request more in flight only
//! waits longer. Like most servers it serves what it queued even when the client has gone.
//!
//! `upstream PORT WORKERS SERVICE_MS [QUEUE_MAX]`: HTTP/1.1 keep-alive GETs on 127.0.0.1:PORT,
//! answered `200 ok`; past QUEUE_MAX queued (default 100000) a request is answered 503 at once.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

struct Queue {
    jobs: Mutex<VecDeque<TcpStream>>,
    ready: Condvar,
    max: usize,
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4\r\n\r\nfull";

fn serve(mut stream: TcpStream, queue: Arc<Queue>) {
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; 8192];
    let mut pending = Vec::new();
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        // One job per complete request head (GETs: no bodies).
        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            pending.drain(..end + 4);
            let Ok(reply) = stream.try_clone() else {
                return;
            };
            let mut jobs = queue.jobs.lock().unwrap();
            if jobs.len() >= queue.max {
                drop(jobs);
                let _ = (&reply).write_all(FULL);
                continue;
            }
            jobs.push_back(reply);
            drop(jobs);
            queue.ready.notify_one();
        }
    }
}

fn work(queue: Arc<Queue>, service: Duration) {
    loop {
        let mut jobs = queue.jobs.lock().unwrap();
        let job = loop {
            match jobs.pop_front() {
                Some(job) => break job,
                None => jobs = queue.ready.wait(jobs).unwrap(),
            }
        };
        drop(jobs);
        thread::sleep(service);
        let _ = (&job).write_all(OK);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: upstream PORT WORKERS SERVICE_MS [QUEUE_MAX]");
        std::process::exit(2);
    }
    let port: u16 = args[0].parse().expect("PORT");
    let workers: usize = args[1].parse().expect("WORKERS");
    let service = Duration::from_millis(args[2].parse().expect("SERVICE_MS"));
    let max = args.get(3).map_or(100_000, |m| m.parse().expect("QUEUE_MAX"));
    let queue = Arc::new(Queue {
        jobs: Mutex::new(VecDeque::new()),
        ready: Condvar::new(),
        max,
    });
    for _ in 0..workers {
        let queue = queue.clone();
        thread::spawn(move || work(queue, service));
    }
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind");
    println!("upstream on {} with {workers} workers of {service:?}", listener.local_addr().unwrap());
    for stream in listener.incoming().flatten() {
        let queue = queue.clone();
        let _ = thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || serve(stream, queue));
    }
}
