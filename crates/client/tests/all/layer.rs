//! The tower layer: admitted requests reach the inner service, dropped ones come back as
//! `Limited` and ones whose identity cannot be read as `BadIdentity`, without reaching it.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use spillway_client::{BadIdentity, Client, Fault, Limited, RateLimitLayer};
use spillway_core::config::load_str;
use tower_layer::Layer;
use tower_service::Service;

#[tokio::test]
async fn the_layer_passes_admitted_requests_and_refuses_dropped_ones() {
    let config = load_str(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: per-user, match: { user: \"*\" }, limit: 2/h, algorithm: token-bucket }\n",
        "test.yaml",
    )
    .unwrap();
    let client = Arc::new(Client::new(config).unwrap());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service = RateLimitLayer::new(client).layer(Counting(calls.clone()));
    let request = |user: &str| {
        http::Request::get("/search")
            .header("x-user-id", user)
            .body(())
            .unwrap()
    };
    assert_eq!(service.call(request("alice")).await.unwrap(), "handled");
    assert_eq!(service.call(request("alice")).await.unwrap(), "handled");
    let err = service.call(request("alice")).await.unwrap_err();
    let limited = err.downcast_ref::<Limited>().expect("a Limited error");
    assert_eq!(limited.bucket, "per-user");
    assert_eq!(service.call(request("bob")).await.unwrap(), "handled");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_layer_refuses_an_identity_header_sent_twice_and_matches_the_normalised_path() {
    let config = load_str(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: per-user, match: { user: \"*\" }, limit: 2/h, algorithm: token-bucket }\n      - { name: ip, match: { procedure: \"/ip*\" }, limit: 1/h, algorithm: token-bucket }\n",
        "test.yaml",
    )
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let mut service =
        RateLimitLayer::new(Arc::new(Client::new(config).unwrap())).layer(Counting(calls.clone()));
    let twice = http::Request::get("/search")
        .header("x-user-id", "zz1")
        .header("x-user-id", "alice")
        .body(())
        .unwrap();
    let err = service.call(twice).await.unwrap_err();
    let bad = err
        .downcast_ref::<BadIdentity>()
        .expect("a BadIdentity error");
    assert_eq!(
        (bad.header.as_str(), bad.fault),
        ("x-user-id", Fault::Repeated)
    );
    let get = |path: &str| http::Request::get(path).body(()).unwrap();
    assert_eq!(service.call(get("/ip/search")).await.unwrap(), "handled");
    let err = service.call(get("/%69p/search")).await.unwrap_err();
    assert_eq!(err.downcast_ref::<Limited>().unwrap().bucket, "ip");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn the_layer_waits_for_redis_on_store_redis_buckets() {
    let redis = spillway_testkit::RedisServer::start().expect("private redis-server");
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = RateLimitLayer::new(Arc::new(Client::new(per_user_in(&redis.url())).unwrap()));
    let mut service = layer.layer(Counting(calls.clone()));
    let request = |user: &str| {
        http::Request::get("/search")
            .header("x-user-id", user)
            .body(())
            .unwrap()
    };
    assert_eq!(service.call(request("alice")).await.unwrap(), "handled");
    assert_eq!(service.call(request("alice")).await.unwrap(), "handled");
    let err = service.call(request("alice")).await.unwrap_err();
    assert_eq!(err.downcast_ref::<Limited>().unwrap().bucket, "per-user");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // A second client on the same Redis sees the same count: alice is out of quota there too.
    let other = RateLimitLayer::new(Arc::new(Client::new(per_user_in(&redis.url())).unwrap()));
    let mut second = other.layer(Counting(calls.clone()));
    assert!(second.call(request("alice")).await.is_err());
    assert_eq!(second.call(request("bob")).await.unwrap(), "handled");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Two requests an hour per user, counted in the Redis at `url`.
#[cfg(feature = "redis")]
fn per_user_in(url: &str) -> spillway_core::config::Config {
    load_str(
        &format!(
            "version: 1\nredis: {{ url: \"{url}\", timeout: 1s }}\nservices:\n  api:\n    buckets:\n      - {{ name: per-user, match: {{ user: \"*\" }}, limit: 2/h, algorithm: token-bucket, store: redis }}\n"
        ),
        "test.yaml",
    )
    .unwrap()
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
