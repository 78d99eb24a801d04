//! A tower [`Layer`] so any Rust HTTP service (axum, tonic, hyper) decides its requests with a
//! [`Client`] in-process, without the sidecar.
//!
//! A dropped request never reaches the inner service: the layer answers `Err(Limited)` (boxed), so
//! the application maps it to its own 429 or `RESOURCE_EXHAUSTED` (with axum, in a
//! `HandleErrorLayer`). The peer address is not known at this layer, so `identity` sources of
//! `peer` find nothing; read the client address from a header (`ip: header:x-forwarded-for`,
//! counted from the right past `xff_trusted_hops` as if the unknown peer had been appended). A
//! request whose identity cannot be read (an identity header sent twice or not in ASCII)
//! never reaches the inner service either: the layer answers `Err(BadIdentity)` (boxed), which
//! the application maps to its 400 or `INVALID_ARGUMENT`.
//!
//! A request that matches only in-memory buckets is decided in `call` and costs no allocation;
//! one that matches a `store: redis` bucket waits for Redis in the response future, then calls
//! the inner service (which is why the service must be `Clone`, as tower's own buffering layers
//! ask).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use spillway_core::decision::Decision;
use tower_layer::Layer;
use tower_service::Service;

use crate::client::Client;
use crate::identity::{BadIdentity, PathBuffer};
use crate::rules::{Rules, Step};

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
    S: Service<http::Request<B>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, http::Request<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let rules = self.client.rules();
        let mut buffer = PathBuffer::new();
        let attrs =
            match rules
                .identity()
                .attrs(request.uri().path(), request.headers(), None, &mut buffer)
            {
                Ok(attrs) => attrs,
                Err(bad) => {
                    return ResponseFuture::BadIdentity { bad: Some(bad) };
                }
            };
        match rules.begin(self.client.now(), &attrs, request.headers()) {
            Step::Done(decision) => match limited(&rules, decision) {
                Some(limited) => ResponseFuture::Limited {
                    limited: Some(limited),
                },
                None => ResponseFuture::Inner {
                    future: self.inner.call(request),
                },
            },
            Step::Redis(pending) => {
                // The service polled ready is the one to call; a clone takes its place here.
                let clone = self.inner.clone();
                let service = std::mem::replace(&mut self.inner, clone);
                ResponseFuture::Checking {
                    check: Box::pin(async move {
                        let decision = rules.finish(pending).await;
                        limited(&rules, decision)
                    }),
                    call: Some((service, request)),
                }
            }
        }
    }
}

/// The [`Limited`] error of a decision that drops.
fn limited(rules: &Rules, decision: Decision) -> Option<Limited> {
    let Decision::Drop {
        bucket,
        retry_after,
    } = decision
    else {
        return None;
    };
    let (service, bucket) = rules
        .bucket(bucket)
        .map(|b| (b.service().to_owned(), b.name().to_owned()))
        .unwrap_or_default();
    Some(Limited {
        service,
        bucket,
        retry_after,
    })
}

/// A pending Redis check: the only state that is boxed, so only requests that match a
/// `store: redis` bucket allocate.
type Check = Pin<Box<dyn Future<Output = Option<Limited>> + Send>>;

pin_project! {
    /// The future of [`RateLimit`]: the inner service's, an immediate [`Limited`] or
    /// [`BadIdentity`], or a Redis check that ends in the inner service's or a [`Limited`].
    #[project = Projection]
    pub enum ResponseFuture<S, R>
    where
        S: Service<R>,
    {
        Inner { #[pin] future: S::Future },
        Limited { limited: Option<Limited> },
        BadIdentity { bad: Option<BadIdentity> },
        Checking { check: Check, call: Option<(S, R)> },
    }
}

impl<S, R> Future for ResponseFuture<S, R>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                Projection::Inner { future } => return future.poll(cx).map_err(Into::into),
                Projection::Limited { limited } => {
                    return Poll::Ready(Err(Box::new(
                        limited.take().expect("polled after completion"),
                    )));
                }
                Projection::BadIdentity { bad } => {
                    return Poll::Ready(Err(Box::new(
                        bad.take().expect("polled after completion"),
                    )));
                }
                Projection::Checking { check, call } => {
                    let outcome = std::task::ready!(check.as_mut().poll(cx));
                    let next = match outcome {
                        Some(limited) => ResponseFuture::Limited {
                            limited: Some(limited),
                        },
                        None => {
                            let (mut service, request) =
                                call.take().expect("polled after completion");
                            ResponseFuture::Inner {
                                future: service.call(request),
                            }
                        }
                    };
                    self.set(next);
                }
            }
        }
    }
}
