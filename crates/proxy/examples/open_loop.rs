//! The concurrency benchmark's load generator (`bench/concurrency/run.sh`): a truly open loop,
//! which `paced` is not (its fixed connections wait for their answers, so a slow server slows
//! the offer). Request `i` is sent at `i / RATE` seconds whatever came back before, on an idle
//! keep-alive connection or a new one; a client that waits longer than TIMEOUT_MS gives up and
//! closes its connection, as a caller with a deadline does.
//!
//! `open_loop URL RATE SECONDS TIMEOUT_MS [WARMUP_SECONDS]` prints
//! `RESULT goodput_rps p50_ms p99_ms ok refused timeouts errors`: over the requests sent after
//! the warm-up (default 3 s), goodput is the 2xx answers within the deadline per second, and
//! the latencies are those of the admitted requests (every one not refused with 503): those
//! that timed out count at the deadline, so a p99 at TIMEOUT_MS means "at least".

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Sender = SendRequest<Empty<Bytes>>;

#[derive(Debug)]
enum Outcome {
    Ok(Duration),
    Refused,
    Timeout,
    Error,
}

async fn connect(authority: &str) -> Option<Sender> {
    let stream = TcpStream::connect(authority).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    Some(sender)
}

async fn one(authority: Arc<str>, pool: Arc<Mutex<Vec<Sender>>>, timeout: Duration) -> Outcome {
    let started = Instant::now();
    let attempt = async {
        let idle = pool.lock().unwrap().pop();
        let mut sender = match idle {
            Some(sender) => sender,
            None => connect(&authority).await?,
        };
        sender.ready().await.ok()?;
        let request = Request::get("/work")
            .header("host", &*authority)
            .body(Empty::new())
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        let status = response.status();
        response.into_body().collect().await.ok()?;
        Some((status, sender))
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => Outcome::Timeout,
        Ok(None) => Outcome::Error,
        Ok(Some((status, sender))) => {
            pool.lock().unwrap().push(sender);
            match status {
                s if s.is_success() => Outcome::Ok(started.elapsed()),
                StatusCode::SERVICE_UNAVAILABLE => Outcome::Refused,
                _ => Outcome::Error,
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: open_loop URL RATE SECONDS TIMEOUT_MS [WARMUP_SECONDS]");
        std::process::exit(2);
    }
    let authority: Arc<str> = args[0]
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .into();
    let rate: f64 = args[1].parse().expect("RATE");
    let seconds: f64 = args[2].parse().expect("SECONDS");
    let timeout = Duration::from_millis(args[3].parse().expect("TIMEOUT_MS"));
    let warmup: f64 = args
        .get(4)
        .map_or(3.0, |w| w.parse().expect("WARMUP_SECONDS"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let outcomes = runtime.block_on(async move {
        let pool = Arc::new(Mutex::new(Vec::new()));
        let start = tokio::time::Instant::now();
        let total = (rate * seconds) as u64;
        let mut tasks = Vec::with_capacity(total as usize);
        for i in 0..total {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due).await;
            let measured = i as f64 / rate >= warmup;
            let (authority, pool) = (authority.clone(), pool.clone());
            tasks.push(tokio::spawn(async move {
                (measured, one(authority, pool, timeout).await)
            }));
        }
        let mut outcomes = Vec::with_capacity(tasks.len());
        for task in tasks {
            if let Ok((true, outcome)) = task.await {
                outcomes.push(outcome);
            }
        }
        outcomes
    });
    let measured_seconds = seconds - warmup;
    let mut admitted: Vec<Duration> = Vec::new();
    let (mut ok, mut refused, mut timeouts, mut errors) = (0u64, 0u64, 0u64, 0u64);
    for outcome in outcomes {
        match outcome {
            Outcome::Ok(latency) => {
                ok += 1;
                admitted.push(latency);
            }
            Outcome::Refused => refused += 1,
            Outcome::Timeout => {
                timeouts += 1;
                admitted.push(timeout);
            }
            Outcome::Error => errors += 1,
        }
    }
    admitted.sort();
    let quantile = |q: f64| {
        admitted
            .get(((admitted.len() as f64 * q) as usize).min(admitted.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "RESULT {:.1} {:.2} {:.2} {ok} {refused} {timeouts} {errors}",
        ok as f64 / measured_seconds,
        quantile(0.5),
        quantile(0.99)
    );
}
