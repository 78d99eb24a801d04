//! Test support: private Redis, Sentinel, Cluster and PostgreSQL instances on free loopback ports,
//! an allocator that counts one thread's allocations ([`alloc`]), and the programs a test needs on
//! `PATH` ([`tools`]).
//!
//! Every instance lives in its own temporary folder, listens on `127.0.0.1` on a port picked
//! free, and is killed and its folder removed when the value is dropped, so a test may crash or
//! restart its servers without touching anyone else's. Starting fails with an [`Error`] that
//! says what went wrong, with the last lines of the server's log: a test that needs a server
//! calls `.expect()` and fails, it never skips.
//!
//! ```no_run
//! let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
//! println!("connect to {}", redis.url());
//! ```
// Unsafe only in `alloc`, which must implement `GlobalAlloc`; everything else forbids it.
#![deny(unsafe_code)]

pub mod alloc;
mod cluster;
mod error;
mod postgres;
mod process;
mod redis;
mod resp;
mod sentinel;
pub mod tools;

pub use cluster::{CLUSTER_SLOTS, RedisCluster};
pub use error::{Error, Result};
pub use postgres::{Postgres, PostgresOptions};
pub use process::STARTUP_TIMEOUT;
pub use redis::{RedisOptions, RedisServer};
pub use sentinel::{MASTER_NAME, RedisSentinelSet};
