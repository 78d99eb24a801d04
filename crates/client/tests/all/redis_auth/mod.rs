//! Shared by the Redis password tests: a private redis-server that requires a password, and a
//! per-user bucket counted in it.
#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use spillway_client::{Client, RateLimitLayer};
use spillway_core::config::{Config, load_str};
use spillway_testkit::RedisServer;
use tower_layer::Layer;
use tower_service::Service;

pub const PASSWORD: &str = "hunter2-c0rrect-h0rse";

/// A private redis-server that answers only clients that authenticate with [`PASSWORD`]. The
/// password is set once it runs (the harness checks readiness with an unauthenticated PING).
pub fn server() -> RedisServer {
    let server = RedisServer::start().expect("private redis-server");
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .query(&mut con)
        .unwrap();
    server
}

/// Two requests an hour per user, counted in the Redis at `url`, with `extra` keys in the
/// `redis` section.
pub fn per_user_in(url: &str, extra: &str) -> Config {
    load_str(
        &format!(
            "version: 1\nredis: {{ url: \"{url}\", timeout: 1s{extra} }}\nservices:\n  api:\n    buckets:\n      - {{ name: per-user, match: {{ user: \"*\" }}, limit: 2/h, algorithm: token-bucket, store: redis }}\n"
        ),
        "test.yaml",
    )
    .unwrap()
}

/// How many of `n` requests of `user` a client lets through, and how many reached the service.
pub async fn admitted(client: Arc<Client>, user: &str, n: usize) -> usize {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimitLayer::new(client).layer(Counting(calls.clone()));
    for _ in 0..n {
        let request = http::Request::get("/search")
            .header("x-user-id", user)
            .body(())
            .unwrap();
        let _ = service.call(request).await;
    }
    calls.load(Ordering::SeqCst)
}

/// The inner service: counts the requests that reach it.
#[derive(Clone)]
struct Counting(Arc<AtomicUsize>);

impl Service<http::Request<()>> for Counting {
    type Response = &'static str;
    type Error = Infallible;
    type Future = std::future::Ready<Result<&'static str, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        self.0.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok("handled"))
    }
}

/// Redis calls of `client` that failed or timed out.
pub fn failures(client: &Client) -> u64 {
    let stats = client.store_stats().expect("a redis store");
    stats.errors + stats.timeouts
}
