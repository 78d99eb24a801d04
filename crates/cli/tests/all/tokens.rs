//! A global token budget held by the control plane, through the real binary: a controller, a
//! zone aggregator and linked proxies on loopback in front of a fake OpenAI-style upstream that
//! answers each request with a known number of tokens in its JSON `usage`, half of the answers
//! streamed (SSE with a final usage event). The proxies are offered about three times the
//! budget; the tokens the upstream served over a window of steady load stay near the budget.
//!
//! The small run is a test; the size (four sidecars, 10,000 tokens/s, 4x, answers of
//! 100-2,000 tokens over 60 s) is the ignored test below, run by hand:
//! `cargo nextest run -p spillway-cli -E 'test(tokens::)' --run-ignored only --no-capture`.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::support::fleet::{
    Proc, admin_get, aggregator, controller, linked_proxy, metric, request_with, wait_for,
};
use crate::support::free_port;

/// The fake upstream's answers so far: requests and tokens served.
#[derive(Default)]
struct Served {
    answers: AtomicU64,
    tokens: AtomicU64,
}

/// An OpenAI-style upstream on keep-alive connections: each answer costs a pseudo-random
/// number of tokens in `min..=max` (the same sequence every run), every second one streamed as
/// server-sent events whose last data event carries the usage, 5 ms after the first.
fn llm_upstream(min: u64, max: u64) -> (u16, Arc<Served>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    let served = Arc::new(Served::default());
    let seq = Arc::new(AtomicU64::new(0));
    let out = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (served, seq) = (served.clone(), seq.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut stream = stream;
                loop {
                    let mut line = String::new();
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let n = seq.fetch_add(1, Ordering::Relaxed);
                    // splitmix64 of the answer's number: sizes spread evenly over the range.
                    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^= z >> 31;
                    let tokens = min + z % (max - min + 1);
                    let ok = if n % 2 == 0 {
                        let body = format!(
                            "{{\"id\":\"c{n}\",\"choices\":[{{\"message\":{{\"content\":\"hi\"}}}}],\"usage\":{{\"prompt_tokens\":0,\"completion_tokens\":{tokens},\"total_tokens\":{tokens}}}}}"
                        );
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
                        stream.write_all(format!("{head}{body}").as_bytes()).is_ok()
                    } else {
                        let first = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
                        let last = format!(
                            "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":0,\"completion_tokens\":{tokens},\"total_tokens\":{tokens}}}}}\n\ndata: [DONE]\n\n"
                        );
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
                            first.len() + last.len()
                        );
                        stream
                            .write_all(format!("{head}{first}").as_bytes())
                            .is_ok()
                            && {
                                let _ = stream.flush();
                                std::thread::sleep(Duration::from_millis(5));
                                stream.write_all(last.as_bytes()).is_ok()
                            }
                    };
                    if !ok {
                        return;
                    }
                    served.answers.fetch_add(1, Ordering::Relaxed);
                    served.tokens.fetch_add(tokens, Ordering::Relaxed);
                }
            });
        }
    });
    (port, out)
}

/// Paced requests on one proxy from `threads` threads, `rps` a second in all, until `stop` or
/// `limit`: answers and 429s counted.
struct Load {
    answered: Arc<AtomicU64>,
    limited: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(port: u16, rps: f64, threads: usize, limit: Duration) -> Load {
        let answered = Arc::new(AtomicU64::new(0));
        let limited = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|t| {
                let (answered, limited, stop) = (answered.clone(), limited.clone(), stop.clone());
                let period = Duration::from_secs_f64(threads as f64 / rps);
                std::thread::spawn(move || {
                    // Threads start a fraction of a period apart, so the load is even.
                    let start = Instant::now() + period.mul_f64(t as f64 / threads as f64);
                    let mut conn: Option<BufReader<TcpStream>> = None;
                    let mut n = 0u32;
                    while !stop.load(Ordering::Relaxed) && start.elapsed() < limit {
                        let due = start + period * n;
                        n += 1;
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let mut reader = match conn.take() {
                            Some(r) => r,
                            None => match TcpStream::connect(("127.0.0.1", port)) {
                                Ok(s) => BufReader::new(s),
                                Err(_) => continue,
                            },
                        };
                        if let Ok(status) = request_with(&mut reader, "/v1/chat/completions", "") {
                            answered.fetch_add(1, Ordering::Relaxed);
                            if status == 429 {
                                limited.fetch_add(1, Ordering::Relaxed);
                            }
                            conn = Some(reader);
                        }
                    }
                })
            })
            .collect();
        Load {
            answered,
            limited,
            stop,
            threads,
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One global token budget of `limit` tokens a second, held by the control plane.
fn rules(limit: u64) -> String {
    format!(
        "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\nservices:\n  llm:\n    buckets:\n      - name: tokens\n        limit: {limit}/s\n        scope: global\n        algorithm: drop-ratio\n        store: control-plane\n        cost: {{ response: \"json:usage.total_tokens\" }}\n"
    )
}

struct Run {
    proxies: usize,
    budget: u64,
    /// Tokens of one answer, evenly spread.
    min: u64,
    max: u64,
    /// Offered load as a multiple of the budget.
    offered: f64,
    warm_up: Duration,
    window: Duration,
}

/// What a run measured over its window.
struct Measured {
    /// Tokens served a second over the window, as a share of the budget.
    admitted: f64,
    tokens_per_sec: f64,
    requests: u64,
    refused: u64,
}

fn run(run: &Run) -> Measured {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rules(run.budget)).unwrap();
    let controller_port = free_port();
    let _controller = controller(controller_port, &dir.path().join("rules.yaml"), &[]);
    let aggregator_port = free_port();
    let _aggregator = aggregator(aggregator_port, "z1", controller_port, &[]);
    let (upstream, served) = llm_upstream(run.min, run.max);
    let proxies: Vec<(Proc, u16, u16)> = (1..=run.proxies)
        .map(|n| {
            let host = format!("p{n}");
            // A budget nobody reaches: only the controller's rules make a proxy drop.
            let file = dir.path().join(format!("{host}.yaml"));
            std::fs::write(&file, rules(1_000_000_000)).unwrap();
            linked_proxy(dir.path(), &file, upstream, aggregator_port, "z1", &host)
        })
        .collect();
    let limit = run.budget as f64;
    wait_for(
        Duration::from_secs(40),
        "the proxies linked and running the controller's rules",
        || {
            proxies.iter().all(|p| {
                let m = admin_get(p.2, "/metrics");
                metric(&m, "spillway_control_plane_connected", "") == Some(1.0)
                    && metric(&m, "spillway_bucket_limit_rps", "bucket=\"tokens\"") == Some(limit)
            })
        },
    );
    let mean = (run.min + run.max) as f64 / 2.0;
    let rps = run.offered * limit / mean / run.proxies as f64;
    let total = run.warm_up + run.window + Duration::from_secs(5);
    let loads: Vec<Load> = proxies
        .iter()
        .map(|p| Load::start(p.1, rps, 4, total))
        .collect();
    std::thread::sleep(run.warm_up);
    let read = || {
        let answered: u64 = loads
            .iter()
            .map(|l| l.answered.load(Ordering::Relaxed))
            .sum();
        let limited: u64 = loads
            .iter()
            .map(|l| l.limited.load(Ordering::Relaxed))
            .sum();
        (
            Instant::now(),
            served.tokens.load(Ordering::Relaxed),
            answered,
            limited,
        )
    };
    let before = read();
    std::thread::sleep(run.window);
    let after = read();
    drop(loads);
    let secs = after.0.duration_since(before.0).as_secs_f64();
    let tokens_per_sec = (after.1 - before.1) as f64 / secs;
    Measured {
        admitted: tokens_per_sec / limit,
        tokens_per_sec,
        requests: after.2 - before.2,
        refused: after.3 - before.3,
    }
}

fn report(run: &Run, m: &Measured) {
    eprintln!(
        "tokens: {} proxies, budget {}/s, answers {}-{} tokens, offered {}x: {:.0} tokens/s admitted over {:?} = {:.3} of the budget ({} requests, {} refused)",
        run.proxies,
        run.budget,
        run.min,
        run.max,
        run.offered,
        m.tokens_per_sec,
        run.window,
        m.admitted,
        m.requests,
        m.refused
    );
}

#[test]
fn two_proxies_offered_three_times_a_global_token_budget_admit_about_the_budget() {
    // 5,000 tokens/s of answers of 10-200 tokens: about 48 admitted requests a second, 143
    // offered across the two proxies.
    let spec = Run {
        proxies: 2,
        budget: 5_000,
        min: 10,
        max: 200,
        offered: 3.0,
        warm_up: Duration::from_secs(5),
        window: Duration::from_secs(10),
    };
    let m = run(&spec);
    report(&spec, &m);
    assert!(
        m.refused * 2 > m.requests,
        "offered 3x, most requests are refused: {} of {}",
        m.refused,
        m.requests
    );
    // Measured 1.007-1.008 (docs/token-budgets.md); the bound leaves room for a starved run.
    assert!(
        (0.85..=1.15).contains(&m.admitted),
        "{:.0} tokens/s admitted against a budget of 5,000/s",
        m.tokens_per_sec
    );
}

#[test]
#[ignore = "a benchmark of 80 s: four proxies, 10,000 tokens/s, offered 4x (run by hand)"]
fn four_proxies_offered_four_times_ten_thousand_tokens_a_second_over_a_minute() {
    let spec = Run {
        proxies: 4,
        budget: 10_000,
        min: 100,
        max: 2_000,
        offered: 4.0,
        warm_up: Duration::from_secs(10),
        window: Duration::from_secs(60),
    };
    let m = run(&spec);
    report(&spec, &m);
    assert!(
        (0.8..=1.2).contains(&m.admitted),
        "{:.0} tokens/s admitted against a budget of 10,000/s",
        m.tokens_per_sec
    );
}

#[test]
fn two_proxies_offered_half_a_global_token_budget_refuse_nothing() {
    let spec = Run {
        proxies: 2,
        budget: 5_000,
        min: 10,
        max: 200,
        offered: 0.5,
        warm_up: Duration::from_secs(3),
        window: Duration::from_secs(8),
    };
    let m = run(&spec);
    report(&spec, &m);
    assert!(
        m.requests >= 100,
        "too little load: {} requests",
        m.requests
    );
    // Under the budget the controller drops nothing; a refusal here is the surge guard taking
    // the spread of answer sizes for a surge. Measured 0 in every run (docs/token-budgets.md).
    assert!(
        m.refused * 100 <= m.requests,
        "{} of {} requests refused while the budget had room",
        m.refused,
        m.requests
    );
}
