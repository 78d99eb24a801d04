//! The Lua scripts against a real redis-server: exactness under concurrency (S5), window
//! boundaries (W6), a lost script cache (W5), retry-after (W4) and memory per logged request.

mod common;

use std::sync::Arc;
use std::time::Duration;

use spillway_core::algo::{Kind, Rate};
use spillway_core::decision::{NEVER, Verdict};
use spillway_redis::{BucketKey, ExactAlgo, RedisLimiter};
use spillway_testkit::RedisServer;

use common::{command_calls, limiter, raw, server_micros};

const CLIENTS: usize = 8;
const REQUESTS_PER_CLIENT: usize = 60;

fn per_hour(n: u64) -> Rate {
    Rate::new(n, Duration::from_secs(3600)).unwrap()
}

/// 8 clients, each on its own connection, send requests of cost 1, 2, 3, 1, 2, 3, ... at one
/// bucket at once. Returns the admitted cost.
async fn admitted_by_eight_clients(url: &str, key: &BucketKey, algo: ExactAlgo) -> u64 {
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let limiter = limiter(url);
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for i in 0..REQUESTS_PER_CLIENT {
                let cost = (i % 3 + 1) as u64;
                if limiter.decide(&key, &algo, cost).await.unwrap().is_allow() {
                    admitted += cost;
                }
            }
            admitted
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total
}

/// Asserts that `algo`, whose refill over the test is well under one unit, admits at most
/// `limit` and leaves less than the largest cost (3) unused.
async fn assert_exact_under_concurrency(algo: ExactAlgo, limit: u64) {
    let server = RedisServer::start().expect("private redis-server");
    let key = BucketKey::new("user", "alice", "/search");
    let admitted = admitted_by_eight_clients(&server.url(), &key, algo).await;
    let offered = (CLIENTS * REQUESTS_PER_CLIENT * 2) as u64;
    assert!(
        offered > 4 * limit,
        "the test must offer far more than the limit"
    );
    assert!(admitted <= limit, "admitted {admitted} > limit {limit}");
    assert!(
        admitted + 3 > limit,
        "admitted {admitted}, far under {limit}"
    );
}

#[tokio::test]
async fn token_bucket_is_exact_under_eight_concurrent_clients() {
    assert_exact_under_concurrency(ExactAlgo::token_bucket(per_hour(1), 100), 100).await;
}

#[tokio::test]
async fn leaky_bucket_is_exact_under_eight_concurrent_clients() {
    // A backlog of 99 intervals admits 100 units of cost 1; a weighted request is admitted
    // whenever the backlog is within the tolerance, so up to 99 + 3 units can be queued.
    let server = RedisServer::start().expect("private redis-server");
    let key = BucketKey::new("org", "acme", "/pay");
    let algo = ExactAlgo::LeakyBucket {
        rate: per_hour(1),
        burst: 99,
    };
    let admitted = admitted_by_eight_clients(&server.url(), &key, algo).await;
    assert!(admitted <= 102, "admitted {admitted} > 99 + largest cost");
    assert!(admitted >= 100, "admitted {admitted} < 100");
}

#[tokio::test]
async fn fixed_window_is_exact_under_eight_concurrent_clients() {
    // A day-long window, so the test never straddles a boundary unless run at midnight UTC;
    // then the second window's share would make `admitted` exceed 100 and the test says so.
    let rate = Rate::new(100, Duration::from_secs(86_400)).unwrap();
    assert_exact_under_concurrency(ExactAlgo::FixedWindow { rate }, 100).await;
}

#[tokio::test]
async fn sliding_window_log_is_exact_under_eight_concurrent_clients() {
    assert_exact_under_concurrency(
        ExactAlgo::SlidingWindowLog {
            rate: per_hour(100),
        },
        100,
    )
    .await;
}

#[tokio::test]
async fn sliding_window_counter_is_exact_under_eight_concurrent_clients() {
    // A day-long window, as for the fixed window: within one window the counter is exact.
    let rate = Rate::new(100, Duration::from_secs(86_400)).unwrap();
    assert_exact_under_concurrency(ExactAlgo::SlidingWindowCounter { rate }, 100).await;
}

#[tokio::test]
async fn gcra_is_exact_under_eight_concurrent_clients() {
    let algo = ExactAlgo::new(Kind::Gcra, per_hour(1), Some(100)).unwrap();
    assert_exact_under_concurrency(algo, 100).await;
}

/// Sends `n` requests of cost 1 and counts the admitted ones.
async fn burst(limiter: &RedisLimiter, key: &BucketKey, algo: &ExactAlgo, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(limiter.decide(key, algo, 1).await.unwrap().is_allow());
    }
    admitted
}

#[tokio::test]
async fn fixed_window_admits_twice_its_limit_across_a_boundary_and_the_sliding_log_does_not() {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let rate = Rate::per_second(10).unwrap();
    let fixed = ExactAlgo::FixedWindow { rate };
    let sliding = ExactAlgo::SlidingWindowLog { rate };
    let counter = ExactAlgo::SlidingWindowCounter { rate };
    let (fixed_key, sliding_key) = (BucketKey::named("fixed"), BucketKey::named("sliding"));
    let counter_key = BucketKey::named("counter");

    // Both bursts fall within 0.4 s: 300 ms before a second boundary and 100 ms after it.
    let now = server_micros(&mut con).await;
    let boundary = (now / 1_000_000 + 2) * 1_000_000;
    tokio::time::sleep(Duration::from_micros(boundary - 300_000 - now)).await;
    let before = (
        burst(&limiter, &fixed_key, &fixed, 10).await,
        burst(&limiter, &sliding_key, &sliding, 10).await,
        burst(&limiter, &counter_key, &counter, 10).await,
    );
    let now = server_micros(&mut con).await;
    assert!(now < boundary, "the first bursts took more than 300 ms");
    tokio::time::sleep(Duration::from_micros(boundary + 100_000 - now)).await;
    let after = (
        burst(&limiter, &fixed_key, &fixed, 10).await,
        burst(&limiter, &sliding_key, &sliding, 10).await,
        burst(&limiter, &counter_key, &counter, 10).await,
    );

    assert_eq!(before, (10, 10, 10));
    assert_eq!(after.0, 10, "the fixed window starts afresh: 20 in 0.4 s");
    assert_eq!(
        after.1, 0,
        "the sliding log still holds the 10 of 0.4 s ago"
    );
    // The counter weighs the previous window by the share of it still inside the sliding
    // window: about 0.9 of 10 a tenth of a second in, so it admits one or two, never ten.
    assert!(
        after.2 <= 5,
        "the sliding counter admitted {} just after the boundary",
        after.2
    );
}

#[tokio::test]
async fn decisions_go_on_after_script_flush_through_eval() {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let rate = per_hour(3);
    let algos = [
        ExactAlgo::token_bucket(rate, 3),
        ExactAlgo::LeakyBucket { rate, burst: 2 },
        ExactAlgo::FixedWindow {
            rate: Rate::new(3, Duration::from_secs(86_400)).unwrap(),
        },
        ExactAlgo::SlidingWindowLog { rate },
        ExactAlgo::SlidingWindowCounter {
            rate: Rate::new(3, Duration::from_secs(86_400)).unwrap(),
        },
        ExactAlgo::new(Kind::Gcra, rate, Some(3)).unwrap(),
    ];
    for (i, algo) in algos.iter().enumerate() {
        let key = BucketKey::named(&format!("flushed-{i}"));
        let mut verdicts = Vec::new();
        for _ in 0..4 {
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async::<()>(&mut con)
                .await
                .unwrap();
            verdicts.push(limiter.decide(&key, algo, 1).await.unwrap().is_allow());
        }
        assert_eq!(verdicts, [true, true, true, false], "{:?}", algo.kind());
    }
    assert_eq!(
        command_calls(&mut con, "eval").await,
        4 * algos.len() as u64,
        "every call after a flush fell back to EVAL"
    );
    assert_eq!(command_calls(&mut con, "script|load").await, 0);
}

#[tokio::test]
async fn evalsha_alone_serves_a_warm_cache() {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::token_bucket(per_hour(1), 100);
    let key = BucketKey::named("warm");
    for _ in 0..20 {
        limiter.decide(&key, &algo, 1).await.unwrap();
    }
    // The first call finds no script and loads it with EVAL; the rest hit the cache.
    assert_eq!(command_calls(&mut con, "eval").await, 1);
    assert_eq!(command_calls(&mut con, "evalsha").await, 20);
}

/// Asserts W4 for `algo` at `key` after the bucket has been filled by `fill` requests: the
/// denial's retry-after is honest in both directions.
async fn assert_retry_after_is_correct(algo: ExactAlgo, fill: u64, cost: u64) {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let key = BucketKey::named("retry");
    for _ in 0..fill {
        assert!(limiter.decide(&key, &algo, 1).await.unwrap().is_allow());
    }
    let Verdict::Deny { retry_after } = limiter.decide(&key, &algo, cost).await.unwrap() else {
        panic!("{:?} admitted beyond its limit", algo.kind());
    };
    let asked = tokio::time::Instant::now();
    assert!(
        retry_after > Duration::from_millis(100) && retry_after < Duration::from_secs(2),
        "{:?}: retry-after {retry_after:?}",
        algo.kind()
    );
    tokio::time::sleep(retry_after / 2).await;
    assert!(
        !limiter.decide(&key, &algo, cost).await.unwrap().is_allow(),
        "{:?}: admitted halfway through its retry-after of {retry_after:?}",
        algo.kind()
    );
    tokio::time::sleep_until(asked + retry_after).await;
    assert_eq!(
        limiter.decide(&key, &algo, cost).await.unwrap(),
        Verdict::Allow,
        "{:?}: refused at its retry-after of {retry_after:?}",
        algo.kind()
    );
}

#[tokio::test]
async fn token_bucket_retry_after_is_correct() {
    // 5 tokens refilled at 2/s: after 5 requests, a cost of 2 waits 1 s.
    let algo = ExactAlgo::token_bucket(Rate::per_second(2).unwrap(), 5);
    assert_retry_after_is_correct(algo, 5, 2).await;
}

#[tokio::test]
async fn leaky_bucket_retry_after_is_correct() {
    let algo = ExactAlgo::LeakyBucket {
        rate: Rate::per_second(4).unwrap(),
        burst: 2,
    };
    assert_retry_after_is_correct(algo, 3, 1).await;
}

#[tokio::test]
async fn fixed_window_retry_after_is_correct() {
    // Windows of 1.5 s: a denial late in the window may wait under 100 ms, so start early in one.
    let server_clock = RedisServer::start().expect("private redis-server");
    let mut con = raw(&server_clock.url()).await;
    let now = server_micros(&mut con).await;
    let window = 1_500_000;
    let next = (now / window + 1) * window;
    tokio::time::sleep(Duration::from_micros(next - now + 10_000)).await;
    let rate = Rate::new(3, Duration::from_micros(window)).unwrap();
    assert_retry_after_is_correct(ExactAlgo::FixedWindow { rate }, 3, 1).await;
}

#[tokio::test]
async fn sliding_window_log_retry_after_is_correct() {
    let rate = Rate::new(3, Duration::from_secs(1)).unwrap();
    assert_retry_after_is_correct(ExactAlgo::SlidingWindowLog { rate }, 3, 1).await;
}

#[tokio::test]
async fn sliding_window_counter_retry_after_is_correct() {
    // Windows of 1 s, started early in one: after 3 units, the 4th waits for the next window and
    // a third of it, until the 3 weigh 2 (about 1.3 s).
    let server_clock = RedisServer::start().expect("private redis-server");
    let mut con = raw(&server_clock.url()).await;
    let now = server_micros(&mut con).await;
    let window = 1_000_000;
    let next = (now / window + 1) * window;
    tokio::time::sleep(Duration::from_micros(next - now + 10_000)).await;
    let rate = Rate::new(3, Duration::from_micros(window)).unwrap();
    assert_retry_after_is_correct(ExactAlgo::SlidingWindowCounter { rate }, 3, 1).await;
}

#[tokio::test]
async fn gcra_retry_after_is_correct() {
    // A burst of 5 at 2/s: after 5 requests, a cost of 2 waits 1 s.
    let algo = ExactAlgo::new(Kind::Gcra, Rate::per_second(2).unwrap(), Some(5)).unwrap();
    assert_retry_after_is_correct(algo, 5, 2).await;
}

#[tokio::test]
async fn gcra_paces_at_its_interval_after_the_burst() {
    // 3 per 3 s (one a second) with a burst of 3: an idle key admits 3 at once, then the next
    // waits about one interval, less the time the burst took.
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let algo = ExactAlgo::new(
        Kind::Gcra,
        Rate::new(3, Duration::from_secs(3)).unwrap(),
        None,
    )
    .unwrap();
    let key = BucketKey::named("paced");
    assert_eq!(burst(&limiter, &key, &algo, 3).await, 3);
    let Verdict::Deny { retry_after } = limiter.decide(&key, &algo, 1).await.unwrap() else {
        panic!("admitted a 4th request within its burst of 3");
    };
    assert!(
        retry_after <= Duration::from_secs(1) && retry_after > Duration::from_millis(500),
        "{retry_after:?}"
    );
    let answer = limiter.decide_detailed(&key, &algo, 4).await.unwrap();
    assert_eq!(answer.verdict, Verdict::Deny { retry_after: NEVER });
}

#[tokio::test]
async fn sliding_log_retry_after_waits_for_enough_weight_to_leave() {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let algo = ExactAlgo::SlidingWindowLog {
        rate: Rate::new(10, Duration::from_secs(1)).unwrap(),
    };
    let key = BucketKey::named("weighted");
    let mut con = raw(&server.url()).await;
    assert!(limiter.decide(&key, &algo, 4).await.unwrap().is_allow());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = server_micros(&mut con).await;
    assert!(limiter.decide(&key, &algo, 6).await.unwrap().is_allow());
    // 5 units need both entries gone: the second leaves one window after it was logged.
    let Verdict::Deny { retry_after } = limiter.decide(&key, &algo, 5).await.unwrap() else {
        panic!("admitted 15 units in a window of 10");
    };
    let after_second = Duration::from_micros(server_micros(&mut con).await - second);
    assert!(retry_after > Duration::from_secs(1) - after_second - Duration::from_millis(50));
    assert!(retry_after <= Duration::from_secs(1));
    // A cost that the oldest entry alone makes room for waits only for that one.
    let Verdict::Deny { retry_after: small } = limiter.decide(&key, &algo, 4).await.unwrap() else {
        panic!("admitted 14 units in a window of 10");
    };
    assert!(small < Duration::from_millis(750), "{small:?}");
}

#[tokio::test]
async fn costs_larger_than_the_limit_are_never_admitted() {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let rate = per_hour(10);
    for algo in [
        ExactAlgo::token_bucket(rate, 10),
        ExactAlgo::FixedWindow { rate },
        ExactAlgo::SlidingWindowLog { rate },
        ExactAlgo::SlidingWindowCounter { rate },
        ExactAlgo::new(Kind::Gcra, rate, Some(10)).unwrap(),
    ] {
        let key = BucketKey::named(algo.kind().name());
        assert_eq!(
            limiter.decide(&key, &algo, 11).await.unwrap(),
            Verdict::Deny { retry_after: NEVER }
        );
        assert!(limiter.decide(&key, &algo, 10).await.unwrap().is_allow());
    }
}

#[tokio::test]
async fn sliding_log_memory_per_logged_request() {
    const ENTRIES: u64 = 10_000;
    let server = RedisServer::start().expect("private redis-server");
    let limiter = Arc::new(limiter(&server.url()));
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::SlidingWindowLog {
        rate: Rate::new(ENTRIES, Duration::from_secs(86_400)).unwrap(),
    };
    let key = BucketKey::new("api_key", "k-8f2c", "/search");
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS as u64 {
        let (limiter, key) = (Arc::clone(&limiter), key.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ENTRIES / CLIENTS as u64 {
                assert!(limiter.decide(&key, &algo, 1).await.unwrap().is_allow());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut bytes = 0;
    for k in [key.as_str().to_owned(), format!("{key}:meta")] {
        let usage: u64 = redis::cmd("MEMORY")
            .arg(&["USAGE", &k, "SAMPLES", "0"])
            .query_async(&mut con)
            .await
            .unwrap();
        bytes += usage;
    }
    let per_request = bytes as f64 / ENTRIES as f64;
    println!("sliding log: {bytes} bytes for {ENTRIES} requests, {per_request:.1} bytes each");
    // W6 aims at about 100 bytes. On Redis 7.0 an entry of a skiplist-encoded sorted set costs
    // 86 bytes of structure (node, hash-table entry, 8-byte member) plus 8 to 24 of hash-table
    // buckets, by where the table is in its growth: 105 here, where 10,000 entries have just
    // doubled the table and the old one is still being rehashed (the crate docs explain it).
    // 110 is that worst case; a longer member (a UUID, say) would cost 40 more, and this bound
    // catches that.
    assert!(
        per_request <= 110.0,
        "{per_request:.1} bytes per logged request"
    );
}
