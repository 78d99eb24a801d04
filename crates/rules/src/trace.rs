//! A span for every request of the rules service, named and attributed as OpenTelemetry's
//! HTTP server conventions say: `otel.name` is `METHOD /route` (the route as registered, never
//! the path with its ids), with `http.request.method`, `http.route`, `url.path`,
//! `http.response.status_code`, `enduser.id` once the token names a user, and `request_id`.
//!
//! Spans cost nothing to a process that exports none (the subscriber is not interested in them);
//! `spillway --otlp-endpoint URL` sends them to a collector. With the `otlp` feature, a request's
//! W3C `traceparent` makes its span a child of the caller's, so a rules change made by a tool
//! that traces appears inside that tool's trace.

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use spillway_core::request_id;
use tracing::Instrument;

/// The header a request id comes in and goes back in.
pub const REQUEST_ID: HeaderName = HeaderName::from_static(request_id::HEADER);

/// Wraps a request in its span and answers with its request id: the caller's, when it sent a
/// usable one, or a new one.
pub async fn request_span(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_owned();
    let method = request.method().as_str().to_owned();
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .filter(|v| request_id::usable(v.as_bytes()))
        .cloned()
        .unwrap_or_else(new_request_id);
    let span = tracing::info_span!(
        "rules.request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %method,
        http.route = %route,
        url.path = %request.uri().path(),
        http.response.status_code = tracing::field::Empty,
        enduser.id = tracing::field::Empty,
        request_id = id.to_str().unwrap_or_default(),
    );
    #[cfg(feature = "otlp")]
    otlp::adopt_parent(&span, request.headers());
    let mut response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", status.as_u16());
    // OpenTelemetry's HTTP server rule: a 5xx is the server's error, a 4xx is the caller's.
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response.headers_mut().insert(REQUEST_ID, id);
    response
}

/// Names the user a token belongs to on the request's span.
pub fn record_user(name: &str) {
    tracing::Span::current().record("enduser.id", name);
}

/// A new request id: 32 hex digits of randomness, as a trace id is.
fn new_request_id() -> HeaderValue {
    let id = uuid::Uuid::new_v4().simple().to_string();
    HeaderValue::try_from(id).expect("hex digits are a header value")
}

#[cfg(feature = "otlp")]
mod otlp {
    use axum::http::HeaderMap;
    use opentelemetry::propagation::Extractor;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Headers<'a>(&'a HeaderMap);

    impl Extractor for Headers<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }

        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }

    /// Makes `span` a child of the trace the request's `traceparent` names, through the
    /// propagator the process installed (W3C trace context); without one, nothing changes.
    pub fn adopt_parent(span: &tracing::Span, headers: &HeaderMap) {
        let parent =
            opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
        let _ = span.set_parent(parent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_32_hex_digits_and_differ() {
        let a = new_request_id();
        let b = new_request_id();
        assert_eq!(a.len(), 32);
        assert!(a.as_bytes().iter().all(u8::is_ascii_hexdigit));
        assert_ne!(a, b);
    }
}
