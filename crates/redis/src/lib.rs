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
pub use batch::{BatchConfig, BatchingLimiter};
pub use breaker::{BreakerConfig, BreakerStats, CircuitBreaker, CircuitState, Outcome, Permit};
pub use endpoint::Target;
pub use guarded::{Fallback, Guarded, GuardedLimiter};
pub use key::BucketKey;
pub use limiter::{Answer, RedisLimiter, StoreError, StoreOptions};
pub use script::ScriptKind;
