//! Spillway's data-plane engine: decides every request in-process, embeddable in any Rust
//! service, and the heart of the `spillway proxy` sidecar.
//!
//! A [`Client`] holds the compiled [`Rules`] (the configuration, its matcher and one limiter per
//! bucket) behind `arc-swap`, so a reload is one pointer swap and a decision never takes a lock
//! for buckets that are not per-subject. Drop-ratio buckets follow the instructions the control
//! plane sends ([`Client::set_drop_ratio`]); with no instruction, or an expired one, they admit
//! everything (fail-open).
//!
//! ```
//! use spillway_client::{Client, NoHeaders};
//! use spillway_core::pattern::RequestAttrs;
//!
//! let config = spillway_core::config::load_str(
//!     "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 2/min, algorithm: token-bucket }\n",
//!     "inline.yaml",
//! ).unwrap();
//! let client = Client::new(config).unwrap();
//! let request = RequestAttrs { procedure: Some("/search"), ..RequestAttrs::default() };
//! assert!(client.decide(&request, &NoHeaders).forwards());
//! assert!(client.decide(&request, &NoHeaders).forwards());
//! assert!(!client.decide(&request, &NoHeaders).forwards()); // the third in a minute is dropped
//! ```
//!
//! # Features
//!
//! - `redis` (off by default): `store: redis` buckets, counted exactly in a shared Redis
//!   ([`Rules::finish`], [`Client::decide_async`]), and the Redis store's circuit breaker
//!   (`Client::store_stats`, `BreakerStats`, `CircuitState`). Without it the client builds
//!   neither `spillway-redis` nor the `redis` crate, and a configuration with a `redis` section
//!   or a `store: redis` bucket fails to load with [`ClientError::RedisNotBuilt`] or
//!   [`ClientError::RedisSectionNotBuilt`]. The rest of the API is the same in both builds:
//!   [`Step::Redis`] and the Redis variants of [`ClientError`] exist, and are never produced.
//!
//! # Memory per subject
//!
//! A per-subject bucket (`user: "*"`) keeps one limiter per subject value. A value longer than
//! [`SUBJECT_VALUE_MAX`] (256) bytes keys it by its SHA-256 in hex instead ([`subject_key`]),
//! in memory and in Redis alike, so every proxy computes the same Redis key and no header length
//! makes a subject dearer than a 256-byte one. For every algorithm but sliding-window-log (which
//! adds 16 bytes per request in its window) a subject holds at most [`SUBJECT_BYTES_MAX`] (512)
//! bytes of heap, allocator overhead and table slack included, and at most
//! [`SUBJECT_BYTES_BOUND`] (256) when its key is at most 64 bytes (hashed values included); a
//! bucket holds at most [`DEFAULT_MAX_SUBJECTS`] subjects. `tests/all/subjects_long.rs` measures one
//! million subjects of 256 bytes (about 425 bytes each) and of 1 KiB (about 235). A subject is
//! evicted only when idle long enough that its limiter is as good as new (twice the limit's
//! period, or its burst's refill time if longer), so eviction never changes a decision.
#![forbid(unsafe_code)]

mod acquire;
pub mod budget;
mod client;
pub mod control;
mod descriptors;
mod error;
mod identity;
mod layer;
mod redis_bucket;
mod rules;
mod state;
// `store: redis` buckets. Without the `redis` feature, a stand-in with the same items, none of
// which can exist: the rest of the crate compiles the same either way, and a configuration that
// asks for Redis is refused when it loads.
#[cfg(feature = "redis")]
mod store;
#[cfg(not(feature = "redis"))]
#[path = "store_off.rs"]
mod store;
mod subjects;
mod watch;

pub use acquire::AcquireError;
pub use budget::{BudgetCharge, BudgetCharges, ResponseCost, Settled};
pub use client::{BucketStats, Client};
pub use descriptors::{DescriptorCheck, DescriptorStatus, DescriptorStep, UNLIMITED_REMAINING};
pub use error::{ClientError, InstructionError};
pub use identity::{
    BadIdentity, Fault, Field, Headers, IdentityExtractor, NoHeaders, PathBuffer, path,
};
pub use layer::{BoxError, Limited, RateLimit, RateLimitLayer, ResponseFuture};
pub use rules::{CompiledBucket, RedisChecks, Rules, Step};
#[cfg(feature = "redis")]
pub use spillway_redis::{BreakerStats, CircuitState};
pub use subjects::{
    DEFAULT_MAX_SUBJECTS, SUBJECT_BYTES_BOUND, SUBJECT_BYTES_MAX, SUBJECT_VALUE_MAX, subject_key,
};
pub use watch::{DEFAULT_POLL, watch_file};
