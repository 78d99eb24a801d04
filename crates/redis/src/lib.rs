//! Exact limits in Redis: one atomic Lua call per decision, behind a circuit breaker.
//!
//! Buckets with `store: redis` (S5, W1) are decided here instead of in the proxy's memory, so a
//! per-user quota holds exactly across every proxy. [`RedisLimiter`] runs one Lua script per
//! algorithm ([`ExactAlgo`]: token bucket, leaky bucket, fixed window, sliding-window log,
//! sliding-window counter and GCRA, every algorithm the configuration allows with
//! `store: redis`) against a single node, a Sentinel-managed primary or a Redis Cluster
//! ([`Target`]), with time from Redis `TIME` (W2), weighted costs (W3) and our own
//! `EVALSHA`-then-`EVAL` path (W5). A bucket's keys share one hash tag ([`BucketKey`]), so on a
//! cluster each decision is one call to the node that owns the bucket's slot. [`GuardedLimiter`] puts a [`CircuitBreaker`] in front of it and applies the bucket's
//! `on_store_failure` when Redis cannot answer in time (S8).
//!
//! # Memory of the sliding-window log (W6)
//!
//! W6 asks for about 100 bytes per logged request, so that a 10,000-unit daily quota takes about
//! 1 MB. A log of more than 128 entries is a skiplist-encoded sorted set, and on Redis 7.0 with
//! its jemalloc (measured with `MEMORY USAGE`, see `sliding_log_memory_per_logged_request`) each
//! entry costs:
//!
//! | part | bytes |
//! | --- | --- |
//! | skiplist node: 24 + 16 per level, levels geometric with p = 1/4, allocated as 40, 56, 80, 96, ... | 45.8 on average |
//! | hash-table entry (member to score) | 24 |
//! | the member, an sds string | 8 |
//! | hash-table buckets: 8 bytes each, a power of two at least the entry count | 8 to 16 |
//! | while the table grows, the old buckets too, until incremental rehashing has moved them | up to 8 more |
//!
//! That is 86 bytes fixed plus 8 to 24 for the table: 94 to 110, depending only on where the
//! table stands in its growth. At 10,000 entries the table has just doubled to 16,384 buckets
//! and still holds the old 8,192 (105 bytes each); once rehashing ends it is 98.6, at 16,000
//! entries 93.6. So the log is at about 100 bytes, but not always under it, and no member
//! encoding changes that: a member is a base-62 sequence number of at most 4 characters
//! (`:cost` is appended only for a weighted request), and every member of up to 6 characters is
//! already the smallest allocation, 8 bytes (measured: 4, 5 and 6 characters cost the same, 7
//! cost 8 bytes more); packing the sequence number into 2 or 4 binary bytes saves nothing. The remaining 86 bytes are the sorted set's own structure, which exactness
//! needs (one entry per request, W1). What would go well below 100 is a different layout: the
//! log split into chunks of at most 128 entries, each a sorted set small enough to stay in
//! Redis's compact listpack encoding (about 14 bytes per entry measured), at the price of a
//! script that walks several keys of the bucket's slot.
//!
//! ```no_run
//! # async fn example() -> Result<(), spillway_redis::StoreError> {
//! use spillway_core::algo::Rate;
//! use spillway_redis::{BucketKey, ExactAlgo, RedisLimiter, StoreOptions, Target};
//!
//! let limiter = RedisLimiter::new(Target::single("redis://127.0.0.1:6379"), StoreOptions::default())?;
//! let key = BucketKey::new("user", "alice", "/search");
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
mod script;

pub use algo::{ExactAlgo, UnsupportedAlgorithm};
pub use batch::{BatchConfig, Batcher, BatchingLimiter};
pub use breaker::{BreakerConfig, BreakerStats, CircuitBreaker, CircuitState, Outcome, Permit};
pub use endpoint::Target;
pub use guarded::{Fallback, Guarded, GuardedLimiter};
pub use key::BucketKey;
pub use limiter::{Answer, RedisLimiter, StoreError, StoreOptions};
pub use script::ScriptKind;
