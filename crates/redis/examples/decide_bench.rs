//! Decisions per second against one Redis, for `bench/redis/run.sh`.
//!
//! `cargo run --release -p spillway-redis --example decide_bench -- URL [TASKS] [SECONDS] [ALGO] [LIMIT]`
//! runs TASKS concurrent decision loops (default 50, like redis-benchmark's default clients)
//! over one multiplexed connection, each on its own bucket, and prints `decisions_per_sec=N`
//! and `denied_share=F`, the fraction of those decisions that were denials.
//!
//! ALGO is `token-bucket` (the default: 10,000 tokens refilled at 1,000/s, large enough that every decision is an
//! admission with a write) or any other configuration name, at LIMIT units per second (default
//! 1,000,000, so every decision is admitted). `sliding-window-log` at the default limit keeps
//! about a second of each loop's requests in its log, so every decision also expires the oldest
//! entries: the log's steady state. A LIMIT below the loop's rate measures mostly denials, each
//! computing its retry-after; `denied_share` says how many.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use spillway_core::algo::{Kind, Rate};
use spillway_redis::{ExactAlgo, RedisEndpoint, RedisKey, RedisLimiter, StoreOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let tasks: usize = args.next().map_or(50, |a| a.parse().expect("TASKS"));
    let seconds: u64 = args.next().map_or(5, |a| a.parse().expect("SECONDS"));
    let kind = args.next().map_or(Kind::TokenBucket, |a| {
        Kind::from_name(&a).expect("ALGO: a configuration name such as sliding-window-log")
    });
    let limit: u64 = args.next().map_or(1_000_000, |a| a.parse().expect("LIMIT"));

    let limiter = Arc::new(
        RedisLimiter::new(
            RedisEndpoint::single(url),
            StoreOptions {
                timeout: Duration::from_secs(1),
            },
        )
        .expect("a valid URL"),
    );
    let algo = match kind {
        // A bucket of 10,000 tokens refilled at 1,000/s, large enough that every decision is an admission with a write.
        Kind::TokenBucket => {
            ExactAlgo::token_bucket(Rate::per_second(limit).expect("LIMIT > 0"), 10 * limit)
        }
        kind => ExactAlgo::new(kind, Rate::per_second(limit).expect("LIMIT > 0"), None)
            .expect("ALGO: an algorithm Redis decides"),
    };
    let done = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (limiter, done, denied, stop) =
            (limiter.clone(), done.clone(), denied.clone(), stop.clone());
        handles.push(tokio::spawn(async move {
            let key = RedisKey::new("user", &format!("u{t}"), "/search");
            while !stop.load(Ordering::Relaxed) {
                let verdict = limiter.decide(&key, &algo, 1).await.expect("a decision");
                if !verdict.is_allow() {
                    denied.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let count = done.load(Ordering::Relaxed);
    for h in handles {
        h.await.expect("a decision loop");
    }
    // Read after every loop has ended, so both counts cover the same decisions.
    let (all, refused) = (done.load(Ordering::Relaxed), denied.load(Ordering::Relaxed));
    println!("decisions_per_sec={:.0}", count as f64 / elapsed);
    println!("denied_share={:.4}", refused as f64 / all.max(1) as f64);
}
