//! A tower [`Layer`] so any Rust HTTP service (axum, tonic, hyper) decides its requests with a
//! [`Client`] in-process, without the sidecar.
//!
//! A dropped request never reaches the inner service: the layer answers `Err(Limited)` (boxed), so
//! the application maps it to its own 429 or `RESOURCE_EXHAUSTED` (with axum, in a
//! `HandleErrorLayer`). The peer address is not known at this layer, so `identity` sources of
//! `peer` find nothing; read the client address from a header (`ip: header:x-forwarded-for`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use spillway_core::decision::Decision;
use tower_layer::Layer;
use tower_service::Service;

use crate::client::Client;

/// The error type of [`RateLimit`]: the inner service's errors and [`Limited`], boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request dropped by a bucket: the error the layer returns instead of calling the service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rate limited by bucket {bucket} of service {service}; retry after {retry_after:?}")]
pub struct Limited {
    pub service: String,
    pub bucket: String,
    pub retry_after: Duration,
}

/// Wraps services in [`RateLimit`].
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    client: Arc<Client>,
}

impl RateLimitLayer {
    pub fn new(client: Arc<Client>) -> Self {
        Self { client }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            client: self.client.clone(),
        }
    }
}

/// A service that decides each request before passing it on.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    client: Arc<Client>,
}

impl<S, B> Service<http::Request<B>> for RateLimit<S>
where
    S: Service<http::Request<B>>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let rules = self.client.rules();
        let attrs = rules
            .identity()
            .attrs(request.uri().path(), request.headers(), None);
        match rules.decide(self.client.now(), &attrs, request.headers()) {
            Decision::Drop {
                bucket,
                retry_after,
            } => {
                let (service, bucket) = rules
                    .bucket(bucket)
                    .map(|b| (b.service().to_owned(), b.name().to_owned()))
                    .unwrap_or_default();
                ResponseFuture::Limited(Some(Limited {
                    service,
                    bucket,
                    retry_after,
                }))
            }
            Decision::Allow | Decision::ShadowDrop { .. } => {
                ResponseFuture::Inner(Box::pin(self.inner.call(request)))
            }
        }
    }
}

/// The future of [`RateLimit`]: the inner service's, or an immediate [`Limited`].
pub enum ResponseFuture<F> {
    // Boxed so the future can be polled without pin projection (and without unsafe).
    Inner(Pin<Box<F>>),
    Limited(Option<Limited>),
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both variants are Unpin (a box, an option), so the enum is too.
        match self.get_mut() {
            ResponseFuture::Inner(future) => future.as_mut().poll(cx).map_err(Into::into),
            ResponseFuture::Limited(limited) => Poll::Ready(Err(Box::new(
                limited.take().expect("polled after completion"),
            ))),
        }
    }
}
