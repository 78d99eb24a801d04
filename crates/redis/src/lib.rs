//! Exact limits in Redis: one atomic Lua call per decision, behind a circuit breaker.
//!
//! Buckets with `store: redis` are decided here instead of in the proxy's memory, so a
//! per-user quota holds exactly across every proxy. [`RedisLimiter`] runs one Lua script per
//! algorithm ([`ExactAlgo`]: token bucket, leaky bucket, fixed window, sliding-window log,
//! sliding-window counter and GCRA, every algorithm the configuration allows with
//! `store: redis`) against a single node, a Sentinel-managed primary or a Redis Cluster
//! ([`RedisEndpoint`]), with time from Redis `TIME`, weighted costs and our own
//! `EVALSHA`-then-`EVAL` path. A bucket's keys share one hash tag ([`RedisKey`]), so on a
//! cluster each decision is one call to the node that owns the bucket's slot.
//! [`GuardedLimiter`] puts a [`CircuitBreaker`] in front of it and applies the bucket's
//! `on_store_failure` when Redis cannot answer in time.
//!
//! # When Redis fails
//!
//! Five consecutive failed calls open the endpoint's breaker: requests are then decided by their
//! bucket's `on_store_failure` at once, without waiting on Redis. Recovery is driven by time,
//! not by traffic: a prober task that the [`GuardedLimiter`] runs pings Redis every 250 ms while
//! the circuit is open, and after the first `PONG` ramps requests back through 10%, 25%, 50% and
//! 75% over one second, each stage going on only while at least 80% of its calls succeed. A
//! healthy Redis is trusted again within about 1.25 s of answering at any request rate, idle
//! included. Every transition is one log line, failed calls are summarised every 10 s, and the
//! state and counters are [`BreakerStats`]; [`CircuitBreaker`] has the details, the log lines
//! and the metrics.
//!
//! # The sliding-window log in Redis
//!
//! The sliding log aims at about 100 bytes per logged request, so that a 10,000-unit daily quota takes about
//! 1 MB. One large sorted set does not get there reliably: past 128 entries Redis keeps it as a
//! skiplist plus a hash table, and on Redis 7.0 an entry then costs a skiplist node (45.8 bytes
//! on average), a hash-table entry (24), the member's string (8) and 8 to 24 bytes of
//! hash-table buckets, depending on where the table is in its growth: 94 to 110 bytes, 105 at
//! 10,000 entries. So the log is kept in chunks instead, each a sorted set of at most 128
//! entries, the `zset-max-listpack-entries` default, below which Redis keeps a sorted set in its
//! compact listpack encoding:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `<bucket key>:<k>` for k = 0, 1, 2, ... | sorted set, listpack | entries k x 128 to k x 128 + 127: member the index in the chunk (`:cost` appended when the cost is not 1), score the time in microseconds |
//! | `<bucket key>:meta` | hash | entries logged, units in the log, the newest entry's time, the head chunk, the units and newest time of the head, the tail and every chunk between |
//!
//! All share the bucket's hash tag, so on a Cluster they live in one slot and one script call
//! decides. The script names the chunks itself, beyond the two keys it declares: a server
//! that allows only declared keys refuses it, and while a Cluster migrates the slot a call
//! that reaches a chunk already moved fails (a store error). A call expires entries from the head chunk only, and
//! drops whole chunks from the head by the units and newest time the meta knows, without
//! reading them; it adds to the tail chunk only: O(1) chunks per call, amortized. A denial's
//! retry-after skips chunks whose known units are not enough and reads only the first
//! entries of the chunk where enough have left. Time comes from `TIME`, clamped to the
//! newest logged time, so the log stays time-ordered if Redis's clock steps back (decisions
//! then wait for the clock to catch up). The keys expire with `PEXPIRE` once the newest entry
//! has left the window, the meta last.
//!
//! Memory, measured with `MEMORY USAGE key SAMPLES 0` summed over all of a bucket's keys on
//! Redis 7.0.15 (jemalloc 5.3.0) after 10,000 requests of cost 1 in a day-long window
//! (`cargo nextest run -p spillway-redis -E 'test(sliding_log_memory_per_logged_request)'
//! --no-capture`): **147,824 bytes in 80 keys, 14.8 bytes per logged request**, against 105
//! for one sorted set. A full chunk is 1,864 bytes: a listpack of 128 entries of 12 bytes (a
//! 64-bit integer score, 10 bytes, and an integer member, 2) in jemalloc's 1,792-byte class,
//! plus the key's object, name and dictionary entry; the meta adds about 25 bytes per chunk. A
//! weighted entry's member is text (`5:100`, 7 bytes), so it costs a few bytes more, but holds
//! many units. Above about 65,000 entries the meta has more than `hash-max-listpack-entries`
//! (512) fields and becomes a hash table of about 80 bytes per chunk: 15.3 bytes per request
//! measured at 70,000 entries.
//!
//! The chunks cost some time per decision, measured on the shared 2-core development machine
//! (busy with other builds, so client-side rates vary by a third from run to run) with
//! `decide_bench -- URL 50 5 sliding-window-log LIMIT` (`crates/redis/examples`: 50 loops, each
//! on its own bucket, 5 s) against a private Redis, reading `usec_per_call` of `EVALSHA` from
//! `INFO commandstats`, three runs each, one large sorted set against chunks:
//!
//! | | one sorted set | chunks |
//! | --- | --- | --- |
//! | admissions (LIMIT 1,000,000 a second: about 1 s of requests in each log, so most calls also expire the oldest) | 10.6 to 11.4 us in Redis, 38,000 to 50,000 decisions/s | 13.0 to 14.7 us, 39,000 to 54,000 decisions/s |
//! | denials (LIMIT 100: nearly every call computes a retry-after) | 27 to 30 us, 19,000 to 32,000 decisions/s | 8.1 to 9.3 us, 59,000 to 82,000 decisions/s |
//!
//! An admission costs Redis about 3 us more (a listpack insert scans its chunk, the meta has
//! more fields to read and write, the script more to do); a denial costs 3 times less, as it
//! reads only the entries it needs rather than a page of 64.
//!
//! This needs Redis's defaults `zset-max-listpack-entries 128` (or more) and
//! `zset-max-listpack-value 64`: with a lower entry limit each chunk becomes a skiplist again,
//! about 100 bytes per entry, and decisions stay exact.
//!
//! ## Lost keys
//!
//! Run the Redis that holds limits with `maxmemory-policy noeviction`: it then answers writes
//! with an error when full (the circuit breaker and the bucket's `on_store_failure` take over,
//! the circuit breaker) instead of evicting counters. With noeviction a bucket's keys leave only by their TTL,
//! and the meta, refreshed on every logged request, outlives every chunk. If keys are evicted
//! or deleted anyway:
//!
//! - an evicted **chunk** still counts: its units stay in the meta until its newest entry would
//!   have left the window, so the log never admits more than the limit, it only refuses what
//!   the lost entries would have allowed a little earlier;
//! - an evicted **meta** cannot be rebuilt: without it the chunks cannot be found (a key scan
//!   is not something a script on a shared Redis should do), so the next call starts a new
//!   log, and up to one limit more is admitted in the window that the old entries still
//!   cover. The new log clears each old chunk before reusing its name, and old chunks expire by
//!   their TTL. (One large sorted set could rebuild its sum from itself; the chunked log trades
//!   that for 7 times less memory.) Under an LRU policy the meta, used by every call, is the
//!   least likely of the bucket's keys to be evicted.
//!
//! ```no_run
//! # async fn example() -> Result<(), spillway_redis::ExactError> {
//! use spillway_core::algo::Rate;
//! use spillway_redis::{ExactAlgo, RedisEndpoint, RedisKey, RedisLimiter, StoreOptions};
//!
//! let limiter = RedisLimiter::new(RedisEndpoint::single("redis://127.0.0.1:6379"), StoreOptions::default())?;
//! let key = RedisKey::new("user", "alice", "/search");
//! let algo = ExactAlgo::token_bucket(Rate::per_second(1_000).unwrap(), 10_000);
//! let verdict = limiter.decide(&key, &algo, 1).await?;
//! # let _ = verdict; Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod algo;
mod batch;
mod breaker;
mod endpoint;
mod guarded;
mod key;
mod limiter;
mod password;
mod script;

pub use algo::{ExactAlgo, UnsupportedAlgorithm};
pub use batch::{BatchConfig, Batcher, BatchingLimiter};
pub use breaker::{
    BreakerConfig, BreakerPermit, BreakerStats, BreakerStep, CallOutcome, CircuitBreaker,
    CircuitState, Probe,
};
pub use endpoint::RedisEndpoint;
pub use guarded::{Fallback, Guarded, GuardedLimiter};
pub use key::RedisKey;
pub use limiter::{Debit, ExactError, RedisLimiter, ScriptAnswer, StoreOptions};
pub use password::{PASSWORD_ENV, Password, PasswordError};
pub use script::ScriptKind;
