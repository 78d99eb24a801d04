//! The Lua scripts against a real redis-server: exactness under concurrency, window
//! boundaries, a lost script cache, retry-after and memory per logged request.

use std::sync::Arc;
use std::time::Duration;

use spillway_core::algo::{Kind, Rate};
use spillway_core::decision::{NEVER, Verdict};
use spillway_redis::{ExactAlgo, RedisKey, RedisLimiter};
use spillway_testkit::RedisServer;

use crate::common::{admitted_concurrently, command_calls, limiter, raw, server_micros};

const CLIENTS: usize = 8;
const REQUESTS_PER_CLIENT: usize = 60;

fn per_hour(n: u64) -> Rate {
    Rate::new(n, Duration::from_secs(3600)).unwrap()
}

/// 8 clients, each on its own connection, send requests of cost 1, 2, 3, 1, 2, 3, ... at one
/// bucket at once. Returns the admitted cost.
async fn admitted_by_eight_clients(url: &str, key: &RedisKey, algo: ExactAlgo) -> u64 {
    let limiters = (0..CLIENTS).map(|_| limiter(url)).collect();
    admitted_concurrently(limiters, key, algo, REQUESTS_PER_CLIENT as u64).await
}

/// Asserts that `algo`, whose refill over the test is well under one unit, admits at most
/// `limit` and leaves less than the largest cost (3) unused.
async fn assert_exact_under_concurrency(algo: ExactAlgo, limit: u64) {
    let server = RedisServer::start().expect("private redis-server");
    let key = RedisKey::new("user", "alice", "/search");
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
    let key = RedisKey::new("org", "acme", "/pay");
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
async fn burst(limiter: &RedisLimiter, key: &RedisKey, algo: &ExactAlgo, n: u64) -> u64 {
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
    let (fixed_key, sliding_key) = (RedisKey::named("fixed"), RedisKey::named("sliding"));
    let counter_key = RedisKey::named("counter");

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
        let key = RedisKey::named(&format!("flushed-{i}"));
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
    let key = RedisKey::named("warm");
    for _ in 0..20 {
        limiter.decide(&key, &algo, 1).await.unwrap();
    }
    // The first call finds no script and loads it with EVAL; the rest hit the cache.
    assert_eq!(command_calls(&mut con, "eval").await, 1);
    assert_eq!(command_calls(&mut con, "evalsha").await, 20);
}

/// Asserts that `retry_after` is exact for `algo` at `key` after the bucket has been filled by `fill` requests: the
/// denial's retry-after is honest in both directions.
async fn assert_retry_after_is_correct(algo: ExactAlgo, fill: u64, cost: u64) {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let key = RedisKey::named("retry");
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
    let key = RedisKey::named("paced");
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
    let key = RedisKey::named("weighted");
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
        let key = RedisKey::named(algo.kind().name());
        assert_eq!(
            limiter.decide(&key, &algo, 11).await.unwrap(),
            Verdict::Deny { retry_after: NEVER }
        );
        assert!(limiter.decide(&key, &algo, 10).await.unwrap().is_allow());
    }
}

/// Every key of the bucket at `key`: its sliding log's chunks and meta hash, found by `SCAN`.
async fn keys_of(con: &mut redis::aio::MultiplexedConnection, key: &RedisKey) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    // A private server holds a few hundred keys at most: a bounded number of pages.
    for _ in 0..10_000 {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{key}*"))
            .arg("COUNT")
            .arg(1_000)
            .query_async(con)
            .await
            .unwrap();
        keys.extend(page);
        cursor = next;
        if cursor == 0 {
            keys.sort();
            keys.dedup();
            return keys;
        }
    }
    panic!("SCAN did not finish");
}

/// The sorted-set chunks of the sliding log at `key`, by chunk number: (number, entries).
async fn chunks_of(con: &mut redis::aio::MultiplexedConnection, key: &RedisKey) -> Vec<(u64, u64)> {
    let prefix = format!("{key}:");
    let mut chunks = Vec::new();
    for k in keys_of(con, key).await {
        let Some(number) = k.strip_prefix(&prefix).and_then(|n| n.parse().ok()) else {
            continue;
        };
        let entries: u64 = redis::cmd("ZCARD").arg(&k).query_async(con).await.unwrap();
        chunks.push((number, entries));
    }
    chunks.sort();
    chunks
}

/// Asserts that every chunk of the log at `key` holds at most 128 entries in a listpack.
async fn assert_chunks_are_small_listpacks(
    con: &mut redis::aio::MultiplexedConnection,
    key: &RedisKey,
) {
    for (k, entries) in chunks_of(con, key).await {
        assert!((1..=128).contains(&entries), "chunk {k}: {entries} entries");
        let encoding: String = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(format!("{key}:{k}"))
            .query_async(con)
            .await
            .unwrap();
        assert_eq!(encoding, "listpack", "chunk {k} of {entries} entries");
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
    let key = RedisKey::new("api_key", "k-8f2c", "/search");
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
    // Everything the bucket keeps: its 79 chunks (10,000 entries in chunks of 128) and the meta.
    let keys = keys_of(&mut con, &key).await;
    assert_eq!(keys.len(), 79 + 1, "{keys:?}");
    let logged: u64 = chunks_of(&mut con, &key).await.iter().map(|c| c.1).sum();
    assert_eq!(logged, ENTRIES);
    assert_chunks_are_small_listpacks(&mut con, &key).await;
    let (mut bytes, mut meta) = (0, 0);
    for k in &keys {
        let usage: u64 = redis::cmd("MEMORY")
            .arg(&["USAGE", k, "SAMPLES", "0"])
            .query_async(&mut con)
            .await
            .unwrap();
        bytes += usage;
        if k.ends_with(":meta") {
            meta = usage;
        }
    }
    let per_request = bytes as f64 / ENTRIES as f64;
    println!(
        "sliding log: {bytes} bytes in {} keys (meta {meta}) for {ENTRIES} requests, \
         {per_request:.1} bytes each",
        keys.len()
    );
    // At most 100 bytes per logged request (one large sorted set took 94 to 110, 105 here).
    assert!(
        per_request <= 100.0,
        "{per_request:.1} bytes per logged request"
    );
}

/// The units the sliding log at `key` holds, from the costs its members record.
async fn logged_units(con: &mut redis::aio::MultiplexedConnection, key: &RedisKey) -> u64 {
    let mut units = 0;
    for (k, _) in chunks_of(con, key).await {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(format!("{key}:{k}"))
            .arg(0)
            .arg(-1)
            .query_async(con)
            .await
            .unwrap();
        for m in members {
            units += m.split_once(':').map_or(1, |(_, c)| c.parse().unwrap());
        }
    }
    units
}

/// Sends requests of `cost` until one is denied (at most `max`); returns how many were admitted.
async fn admit_until_denied(
    limiter: &RedisLimiter,
    key: &RedisKey,
    algo: &ExactAlgo,
    cost: u64,
    max: u64,
) -> u64 {
    for admitted in 0..max {
        if !limiter.decide(key, algo, cost).await.unwrap().is_allow() {
            return admitted;
        }
    }
    max
}

#[tokio::test]
async fn sliding_log_spanning_chunks_is_exact_under_eight_concurrent_clients() {
    // 600 units of costs 1, 2 and 3 make about 300 entries: three chunks of at most 128.
    let server = RedisServer::start().expect("private redis-server");
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::SlidingWindowLog {
        rate: per_hour(600),
    };
    let key = RedisKey::named("chunked");
    let limiters = (0..CLIENTS).map(|_| limiter(&server.url())).collect();
    let admitted = admitted_concurrently(limiters, &key, algo, 150).await;
    assert!(admitted <= 600, "admitted {admitted} > 600");
    assert!(admitted > 597, "admitted {admitted}, far under 600");
    let chunks = chunks_of(&mut con, &key).await;
    assert!(chunks.len() >= 3, "{chunks:?}");
    assert_chunks_are_small_listpacks(&mut con, &key).await;
    assert_eq!(logged_units(&mut con, &key).await, admitted, "{chunks:?}");
    // The remaining units, exactly: a request of one more is denied, of exactly that admitted.
    let left = 600 - admitted;
    let limiter = limiter(&server.url());
    assert!(
        !limiter
            .decide(&key, &algo, left + 1)
            .await
            .unwrap()
            .is_allow()
    );
    if left > 0 {
        assert!(limiter.decide(&key, &algo, left).await.unwrap().is_allow());
    }
}

#[tokio::test]
async fn sliding_log_expires_whole_chunks_from_the_head() {
    // 1,000 per 3 s: 500 requests, a second later 500 more, in chunks 0-7 (chunk 3 holds 116 of
    // the first 500 and 12 of the second). Once the first 500 have left the window exactly 500
    // more fit: chunks 0-2 are dropped whole and 116 entries leave chunk 3.
    const WINDOW_US: u64 = 3_000_000;
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::SlidingWindowLog {
        rate: Rate::new(1_000, Duration::from_micros(WINDOW_US)).unwrap(),
    };
    let key = RedisKey::named("expiring");
    assert_eq!(burst(&limiter, &key, &algo, 500).await, 500);
    let first_end = server_micros(&mut con).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second_start = server_micros(&mut con).await;
    assert_eq!(burst(&limiter, &key, &algo, 500).await, 500);
    assert!(!limiter.decide(&key, &algo, 1).await.unwrap().is_allow());
    let chunks = chunks_of(&mut con, &key).await;
    let numbers: Vec<u64> = chunks.iter().map(|c| c.0).collect();
    assert_eq!(numbers, (0..8).collect::<Vec<_>>());
    assert_eq!(chunks[3].1, 128);

    let now = server_micros(&mut con).await;
    tokio::time::sleep(Duration::from_micros(first_end + WINDOW_US + 20_000 - now)).await;
    let admitted = admit_until_denied(&limiter, &key, &algo, 1, 600).await;
    let done = server_micros(&mut con).await;
    assert!(
        done < second_start + WINDOW_US,
        "too slow: the second 500 began to leave the window before the check ended"
    );
    assert_eq!(admitted, 500, "after the first 500 left the window");
    let chunks = chunks_of(&mut con, &key).await;
    assert_eq!(chunks.first(), Some(&(3, 12)), "{chunks:?}");
    assert_eq!(chunks.iter().map(|c| c.1).sum::<u64>(), 1_000, "{chunks:?}");
    assert_chunks_are_small_listpacks(&mut con, &key).await;
}

#[tokio::test]
async fn sliding_log_retry_after_reaches_into_later_chunks() {
    // 300 per 2 s: 200 requests (chunk 0 and 72 entries of chunk 1), then 100 more 0.6 s later.
    // A request of 150 needs the 128 of chunk 0 (skipped by their known count) and 22 of chunk
    // 1 to leave; one of 250 needs 50 of the later ones too.
    const WINDOW_US: u64 = 2_000_000;
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::SlidingWindowLog {
        rate: Rate::new(300, Duration::from_micros(WINDOW_US)).unwrap(),
    };
    let key = RedisKey::named("retry-chunks");
    let first_start = server_micros(&mut con).await;
    assert_eq!(burst(&limiter, &key, &algo, 200).await, 200);
    let first_end = server_micros(&mut con).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let second_start = server_micros(&mut con).await;
    assert_eq!(burst(&limiter, &key, &algo, 100).await, 100);

    let retry = |verdict: Verdict| match verdict {
        Verdict::Deny { retry_after } => retry_after,
        Verdict::Allow => panic!("admitted beyond 300 in the window"),
    };
    let late = retry(limiter.decide(&key, &algo, 250).await.unwrap());
    let after = server_micros(&mut con).await;
    let late_at = after + late.as_micros() as u64;
    assert!(late_at >= second_start + WINDOW_US, "{late:?}");

    let before_early = server_micros(&mut con).await;
    let early = retry(limiter.decide(&key, &algo, 150).await.unwrap());
    let asked = tokio::time::Instant::now();
    let after_early = server_micros(&mut con).await;
    // The 150th entry was logged during the first burst.
    let early_from = before_early + early.as_micros() as u64;
    let early_to = after_early + early.as_micros() as u64;
    assert!(early_to >= first_start + WINDOW_US, "{early:?}");
    assert!(early_from <= first_end + WINDOW_US, "{early:?}");
    assert!(early < late, "{early:?} {late:?}");

    // An exact `retry_after` in both directions, while chunk 0 is about to expire whole and chunk 1 in part.
    tokio::time::sleep(early / 2).await;
    assert!(
        !limiter.decide(&key, &algo, 150).await.unwrap().is_allow(),
        "admitted halfway through its retry-after of {early:?}"
    );
    tokio::time::sleep_until(asked + early).await;
    assert_eq!(
        limiter.decide(&key, &algo, 150).await.unwrap(),
        Verdict::Allow,
        "refused at its retry-after of {early:?}"
    );
    let chunks = chunks_of(&mut con, &key).await;
    assert!(
        chunks.iter().all(|c| c.0 >= 1),
        "chunk 0 left whole: {chunks:?}"
    );
}

#[tokio::test]
async fn sliding_log_stays_time_ordered_when_the_clock_steps_back() {
    // The meta's newest time is set 3 s ahead of Redis's clock, as if the clock had just stepped
    // back by 3 s: the next entry is logged at that time, not before the newest, the log's
    // clock stays there until Redis's catches up, and the keys live until the entry leaves the
    // window in that time.
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::SlidingWindowLog {
        rate: Rate::new(10, Duration::from_secs(10)).unwrap(),
    };
    let key = RedisKey::named("clock");
    assert!(limiter.decide(&key, &algo, 1).await.unwrap().is_allow());
    let ahead = server_micros(&mut con).await + 3_000_000;
    redis::cmd("HSET")
        .arg(format!("{key}:meta"))
        .arg("t")
        .arg(ahead)
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    assert!(limiter.decide(&key, &algo, 2).await.unwrap().is_allow());
    let entries: Vec<(String, u64)> = redis::cmd("ZRANGE")
        .arg(format!("{key}:0"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert!(entries[0].1 < ahead - 3_000_000, "{entries:?}");
    assert_eq!(entries[1], ("1:2".to_owned(), ahead));
    for k in [format!("{key}:0"), format!("{key}:meta")] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(ttl > 12_900, "{k}: {ttl} ms");
    }
    // A denial waits, in the log's clock, until the oldest entry leaves: 10 s after it, which
    // is 3 s before the log's clock: 7 s.
    assert_eq!(burst(&limiter, &key, &algo, 7).await, 7);
    let Verdict::Deny { retry_after } = limiter.decide(&key, &algo, 1).await.unwrap() else {
        panic!("admitted 11 in a window of 10");
    };
    assert!(
        retry_after <= Duration::from_secs(7) && retry_after > Duration::from_millis(6_500),
        "{retry_after:?}"
    );
}

#[tokio::test]
async fn sliding_log_survives_a_lost_meta_and_an_evicted_chunk() {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::SlidingWindowLog {
        rate: per_hour(300),
    };
    let del = |k: String| redis::cmd("DEL").arg(k).clone();

    // An evicted chunk still counts until its entries would have left the window: no more is
    // admitted than the limit.
    let key = RedisKey::named("evicted");
    assert_eq!(burst(&limiter, &key, &algo, 300).await, 300);
    del(format!("{key}:0"))
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    assert!(!limiter.decide(&key, &algo, 1).await.unwrap().is_allow());

    // A lost meta starts a new log: its chunks cannot be found without it, so the old entries
    // are forgotten (documented), and the new log overwrites none of them by mistake.
    let key = RedisKey::named("lost");
    assert_eq!(burst(&limiter, &key, &algo, 300).await, 300);
    del(format!("{key}:meta"))
        .query_async::<()>(&mut con)
        .await
        .unwrap();
    assert_eq!(admit_until_denied(&limiter, &key, &algo, 1, 400).await, 300);
    let chunks = chunks_of(&mut con, &key).await;
    assert_eq!(chunks, [(0, 128), (1, 128), (2, 44)]);
    assert_eq!(logged_units(&mut con, &key).await, 300);
}

#[tokio::test]
async fn idle_sliding_log_keys_expire() {
    let server = RedisServer::start().expect("private redis-server");
    let limiter = limiter(&server.url());
    let mut con = raw(&server.url()).await;
    let algo = ExactAlgo::SlidingWindowLog {
        rate: Rate::new(1_000, Duration::from_millis(300)).unwrap(),
    };
    let key = RedisKey::named("idle");
    assert_eq!(burst(&limiter, &key, &algo, 200).await, 200);
    assert!(keys_of(&mut con, &key).await.len() >= 3);
    // PEXPIRE is one window and a millisecond after the newest entry; Redis's active expiry
    // samples ten times a second, so give it a bounded while.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    tokio::time::sleep(Duration::from_millis(400)).await;
    loop {
        let keys = keys_of(&mut con, &key).await;
        if keys.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still there: {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Microseconds since the Unix epoch on this machine's clock, the one Redis's `TIME` reads.
fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

#[tokio::test]
async fn sliding_log_never_admits_more_than_its_limit_in_any_window() {
    // 300 units per 400 ms against 4 clients sending random costs (1 to 4) at random short
    // intervals for 1.5 s, several times the limit, so the log slides over many chunks. Each
    // admission happened at some time between the client's send and its reply; any admissions
    // whose intervals all fit within 400 ms were logged within one window, so their costs must
    // add up to at most 300.
    const LIMIT: u64 = 300;
    const WINDOW_US: u64 = 400_000;
    let server = RedisServer::start().expect("private redis-server");
    let algo = ExactAlgo::SlidingWindowLog {
        rate: Rate::new(LIMIT, Duration::from_micros(WINDOW_US)).unwrap(),
    };
    let key = RedisKey::named("random");
    let mut tasks = Vec::new();
    for client in 0..4u64 {
        let (limiter, key) = (limiter(&server.url()), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ client;
            let mut random = move |n: u64| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) % n
            };
            let (mut admitted, mut offered) = (Vec::new(), 0);
            let end = wall_micros() + 1_500_000;
            for _ in 0..20_000 {
                let cost = random(4) + 1;
                let before = wall_micros();
                if before > end {
                    break;
                }
                offered += cost;
                if limiter.decide(&key, &algo, cost).await.unwrap().is_allow() {
                    admitted.push((before, wall_micros(), cost));
                }
                tokio::time::sleep(Duration::from_micros(random(5_000))).await;
            }
            (admitted, offered)
        }));
    }
    let (mut admitted, mut offered) = (Vec::new(), 0);
    for task in tasks {
        let (a, o) = task.await.unwrap();
        admitted.extend(a);
        offered += o;
    }
    admitted.sort();
    let total: u64 = admitted.iter().map(|a| a.2).sum();
    assert!(
        offered > 2 * total,
        "offered {offered}, admitted {total}: not enough pressure"
    );
    assert!(total > 2 * LIMIT, "admitted {total}: the log did not slide");
    let mut fullest = 0;
    for (i, &(start, _, _)) in admitted.iter().enumerate() {
        let within: u64 = admitted[i..]
            .iter()
            .filter(|&&(_, after, _)| after < start + WINDOW_US)
            .map(|a| a.2)
            .sum();
        assert!(
            within <= LIMIT,
            "{within} units admitted within 400 ms from {start}"
        );
        fullest = fullest.max(within);
    }
    // The check has teeth only if some windows were found nearly full.
    assert!(fullest > LIMIT - 20, "fullest window held {fullest}");
}

/// A token budget's debit: taken whatever the bucket holds, from many connections at once
/// without losing one, and answered with the time the debt takes to pay back.
#[tokio::test]
async fn debits_go_into_debt_exactly_under_concurrent_callers() {
    let server = RedisServer::start().expect("private redis-server");
    let key = RedisKey::new("api_key", "k1", "/v1/chat/completions");
    // 1000 an hour held 1000: 3.6 s a token.
    let algo = ExactAlgo::new(Kind::Gcra, per_hour(1000), None).unwrap();
    let first = limiter(&server.url())
        .debit(&key, &algo, 400)
        .await
        .unwrap();
    assert_eq!(first.owed, Duration::ZERO);
    assert_eq!(first.remaining, 600);
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (url, key) = (server.url(), key.clone());
        tasks.push(tokio::spawn(async move {
            let limiter = limiter(&url);
            for _ in 0..10 {
                limiter.debit(&key, &algo, 10).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // 400 + 8 x 10 x 10 = 1200 of 1000: 200 owed, and one token of room is 201 x 3.6 s.
    let last = limiter(&server.url()).debit(&key, &algo, 0).await.unwrap();
    assert_eq!(last.remaining, 0);
    let owed = last.owed.as_secs_f64();
    assert!((723.0..=723.7).contains(&owed), "owed {owed}s");
}
