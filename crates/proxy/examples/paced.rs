//! An open-loop load generator for `bench/proxy/run.sh`: sends GETs at a fixed rate (wrk2 is
//! not in Debian, and wrk's closed loop cannot hold an offered rate), for a bounded count.
//!
//! `paced URL RATE SECONDS [CONNECTIONS]` spreads `RATE x SECONDS` requests over CONNECTIONS
//! keep-alive HTTP/1.1 connections, request `i` due at `i / RATE` seconds. A connection that
//! falls behind sends at once to catch up, so the offered rate holds while the server keeps up.
//! Latency is measured from the moment each request is sent (tokio's timer is millisecond
//! grained, so measuring from the due time would add timer slack to every request).
//! Prints `RESULT rps p50 p99 p99.5 non2xx total` (latencies in microseconds), like the wrk
//! script of the benchmark.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

struct Tally {
    latencies_us: Vec<u32>,
    non_2xx: u64,
    /// Requests lost to a closed connection (not counted in the latencies).
    failed: u64,
}

async fn connect(authority: &str) -> SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(authority).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// What every connection shares: where to send, and the schedule.
#[derive(Clone)]
struct Plan {
    authority: String,
    path: String,
    start: Instant,
    interval: Duration,
    /// Requests in all; connection `k` of `step` sends requests `k`, `k + step`, ...
    total: u64,
    step: u64,
}

async fn connection(plan: Plan, first: u64) -> Tally {
    let Plan {
        authority,
        path,
        start,
        interval,
        total,
        step,
    } = plan;
    let mut tally = Tally {
        latencies_us: Vec::with_capacity((total / step + 1) as usize),
        non_2xx: 0,
        failed: 0,
    };
    let mut sender = None;
    let mut i = first;
    while i < total {
        let due = start + interval.mul_f64(i as f64);
        if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
        }
        i += step;
        let request = Request::get(path.as_str())
            .header("host", authority.as_str())
            .body(Empty::<Bytes>::new())
            .expect("request");
        let sent = Instant::now();
        let connection = match &mut sender {
            Some(connection) => connection,
            None => sender.insert(connect(&authority).await),
        };
        let answered = connection.send_request(request).await;
        let Ok(response) = answered else {
            // The server closed the connection (keep-alive limits): reconnect for the next one.
            tally.failed += 1;
            sender = None;
            continue;
        };
        let ok = response.status().is_success();
        if response.into_body().collect().await.is_err() {
            tally.failed += 1;
            sender = None;
            continue;
        }
        let micros = sent.elapsed().as_micros();
        tally
            .latencies_us
            .push(u32::try_from(micros).unwrap_or(u32::MAX));
        tally.non_2xx += u64::from(!ok);
    }
    tally
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: paced URL RATE SECONDS [CONNECTIONS]");
        std::process::exit(2);
    }
    let uri: http::Uri = args[1].parse().expect("URL like http://127.0.0.1:8080/");
    let rate: f64 = args[2].parse().expect("RATE per second");
    let seconds: f64 = args[3].parse().expect("SECONDS");
    let connections: u64 = args.get(4).map_or(32, |c| c.parse().expect("CONNECTIONS"));
    let authority = uri.authority().expect("URL with a host").to_string();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let total = (rate * seconds).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    // One worker: the generator shares two cores with the server under test.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (tallies, elapsed) = runtime.block_on(async {
        let start = Instant::now();
        let plan = Plan {
            authority,
            path,
            start,
            interval,
            total,
            step: connections,
        };
        let tasks: Vec<_> = (0..connections)
            .map(|k| tokio::spawn(connection(plan.clone(), k)))
            .collect();
        let mut tallies = Vec::new();
        for task in tasks {
            tallies.push(task.await.expect("connection task"));
        }
        (tallies, start.elapsed())
    });
    let mut latencies: Vec<u32> = tallies
        .iter()
        .flat_map(|t| t.latencies_us.iter().copied())
        .collect();
    latencies.sort_unstable();
    let non_2xx: u64 = tallies.iter().map(|t| t.non_2xx).sum();
    let failed: u64 = tallies.iter().map(|t| t.failed).sum();
    if failed > 0 {
        eprintln!("paced: {failed} requests lost to closed connections");
    }
    println!(
        "RESULT {:.1} {} {} {} {} {}",
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 50.0),
        percentile(&latencies, 99.0),
        percentile(&latencies, 99.5),
        non_2xx,
        latencies.len()
    );
}
