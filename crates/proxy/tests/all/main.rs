//! The proxy's integration tests, one binary: one test crate to compile and link instead of one
//! per file, each of which built the proxy, hyper's client and server and the test upstreams anew.

#[path = "support/recording.rs"]
mod recording;
mod support;

mod bounds;
mod concurrency;
mod forwarded;
mod framing;
mod grpc;
mod identity;
mod identity_values;
mod proxy;
mod redis;
mod request_id;
mod tokens;
mod upgrades;
mod upstream_answers;
mod websocket;
