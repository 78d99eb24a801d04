//! Every answer the proxy gives on its own account, in one place: a drop becomes a 429
//! problem document with the RateLimit headers, or a trailers-only gRPC `RESOURCE_EXHAUSTED`; a
//! request over the concurrency limit a 503; an unreachable upstream becomes a 502; an identity that cannot be read a 400. The proxy never turns
//! its own fault into a drop.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::Full;
use spillway_client::{BadIdentity, CompiledBucket};
use spillway_core::concurrency::Rejected;

/// `content-type` of RFC 9457 problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// gRPC's status code for a quota exhausted.
pub const GRPC_RESOURCE_EXHAUSTED: u32 = 8;
/// gRPC's status code for a backend that cannot be reached.
pub const GRPC_UNAVAILABLE: u32 = 14;
/// gRPC's status code for a call that could not complete in time.
pub const GRPC_DEADLINE_EXCEEDED: u32 = 4;
/// gRPC's status code for a request the client got wrong.
pub const GRPC_INVALID_ARGUMENT: u32 = 3;

/// Whether a request speaks gRPC (`application/grpc`, `application/grpc+proto`, ...), which
/// needs its errors as gRPC statuses rather than HTTP ones.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.strip_prefix("application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['+', ';']))
        })
}

/// Whole seconds for `retry-after`, rounded up and at least 1, since a client told "0" retries at
/// once and is dropped again. A cost that can never fit ([`spillway_core::decision::NEVER`]) is
/// told the bucket's window.
pub fn retry_after_secs(retry_after: Duration, window: Duration) -> u64 {
    let wait = if retry_after > window.saturating_mul(1000) {
        window
    } else {
        retry_after
    };
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// The quota and window of the IETF `RateLimit-Policy` field: `q` units per `w` whole seconds.
/// Sub-second periods are scaled to one second (`1 per 100ms` is `q=10;w=1`).
fn policy(bucket: &CompiledBucket) -> (u64, u64) {
    let limit = bucket.limit();
    if limit.period < Duration::from_secs(1) {
        (limit.per_second().round().max(1.0) as u64, 1)
    } else {
        let w = limit.period.as_secs() + u64::from(limit.period.subsec_nanos() > 0);
        (limit.count.get(), w)
    }
}

fn header(text: &str) -> HeaderValue {
    // Bucket and service names are validated to `[A-Za-z0-9._-]`, so every value built here is
    // a valid header value; the fallback is unreachable but keeps the proxy from panicking.
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// The token-budget headers of a forwarded response: `x-ratelimit-remaining-tokens` (the least
/// any budget the request was admitted against still holds, the request's estimate taken) and
/// the IETF `ratelimit-policy` and `ratelimit` fields of that budget. The upstream's own fields
/// of those names are replaced.
pub fn budget_headers(headers: &mut HeaderMap, charges: &spillway_client::BudgetCharges) {
    let Some(charge) = charges.iter().min_by_key(|c| c.quota().remaining) else {
        return;
    };
    let quota = charge.quota();
    let cost = charge.cost();
    let limit = cost.limit();
    let (q, w) = if limit.period < Duration::from_secs(1) {
        (limit.per_second().round().max(1.0) as u64, 1)
    } else {
        let w = limit.period.as_secs() + u64::from(limit.period.subsec_nanos() > 0);
        (limit.count.get(), w)
    };
    let name = cost.bucket();
    headers.insert(
        "x-ratelimit-remaining-tokens",
        HeaderValue::from(quota.remaining),
    );
    headers.insert(
        "ratelimit-policy",
        header(&format!("\"{name}\";q={q};w={w}")),
    );
    headers.insert(
        "ratelimit",
        header(&format!(
            "\"{name}\";r={};t={}",
            quota.remaining,
            spillway_client::budget::reset_secs(quota)
        )),
    );
}

/// The answer to a request that `bucket` dropped.
pub fn dropped(
    bucket: &CompiledBucket,
    retry_after: Duration,
    grpc: bool,
) -> Response<Full<Bytes>> {
    let (quota, window) = policy(bucket);
    let secs = retry_after_secs(retry_after, bucket.limit().period);
    let name = bucket.name();
    let detail = format!(
        "bucket {name} of service {} admits {} per {window}s ({}); retry after {secs}s",
        bucket.service(),
        quota,
        bucket.algorithm().name(),
    );
    let mut response = if grpc {
        grpc_status(GRPC_RESOURCE_EXHAUSTED, &detail)
    } else {
        let body = serde_json::json!({
            "type": "urn:spillway:problem:rate-limited",
            "title": "Too Many Requests",
            "status": 429,
            "detail": detail,
            "service": bucket.service(),
            "bucket": name,
            "retry_after": secs,
        });
        problem(StatusCode::TOO_MANY_REQUESTS, &body)
    };
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(
        "ratelimit-policy",
        header(&format!("\"{name}\";q={quota};w={window}")),
    );
    headers.insert("ratelimit", header(&format!("\"{name}\";r=0;t={secs}")));
    headers.insert("x-spillway-bucket", header(name));
    if grpc {
        // gRPC clients with retry policies honour this pushback instead of their own backoff.
        let millis = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        headers.insert(
            "grpc-retry-pushback-ms",
            HeaderValue::from(millis.min(secs * 1000)),
        );
    }
    response
}

/// The answer to a request the concurrency limit refused: the upstream has as many
/// requests in flight as it is let have. `503` with `retry-after: 1` and a problem document of
/// type `urn:spillway:problem:overloaded`, or a trailers-only gRPC `RESOURCE_EXHAUSTED`. Never
/// forwarded, so it costs the upstream nothing.
pub fn overloaded(rejected: &Rejected, grpc: bool) -> Response<Full<Bytes>> {
    let detail = format!(
        "the upstream has {} requests in flight, the most its concurrency limit lets {} requests have; retry after 1s",
        rejected.tier_limit, rejected.criticality
    );
    let mut response = if grpc {
        let mut response = grpc_status(GRPC_RESOURCE_EXHAUSTED, &detail);
        response
            .headers_mut()
            .insert("grpc-retry-pushback-ms", HeaderValue::from(1000u32));
        response
    } else {
        let body = serde_json::json!({
            "type": "urn:spillway:problem:overloaded",
            "title": "Service Unavailable",
            "status": 503,
            "detail": detail,
            "limit": rejected.limit,
            "criticality": rejected.criticality.name(),
            "retry_after": 1,
        });
        problem(StatusCode::SERVICE_UNAVAILABLE, &body)
    };
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(1u32));
    response
}

/// The answer to a request whose identity cannot be read: an identity header sent
/// twice or with bytes that are not visible ASCII. `400` with a problem document naming the
/// header (never its value, which may be a secret such as an API key), or a trailers-only gRPC
/// `INVALID_ARGUMENT`.
pub fn bad_identity(bad: &BadIdentity, grpc: bool) -> Response<Full<Bytes>> {
    let detail = bad.to_string();
    if grpc {
        return grpc_status(GRPC_INVALID_ARGUMENT, &detail);
    }
    let body = serde_json::json!({
        "type": "urn:spillway:problem:bad-identity",
        "title": "Bad Request",
        "status": 400,
        "detail": detail,
        "header": bad.header.as_str(),
        "attribute": bad.attribute,
    });
    problem(StatusCode::BAD_REQUEST, &body)
}

/// The answer to an HTTP/1.1 request with no `Host`, or to any request with two: 400
/// with a problem document, before the request is identified or forwarded.
pub fn bad_host(detail: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "type": "urn:spillway:problem:bad-host",
        "title": "Bad Request",
        "status": 400,
        "detail": detail,
    });
    problem(StatusCode::BAD_REQUEST, &body)
}

/// The answer when the upstream cannot be reached or fails mid-request: 502, or gRPC
/// `UNAVAILABLE` (which gRPC clients also derive from a 502) for gRPC requests.
pub fn upstream_failed(error: &dyn std::error::Error, grpc: bool) -> Response<Full<Bytes>> {
    let detail = format!("the upstream could not be reached: {}", chain(error));
    upstream_problem(
        StatusCode::BAD_GATEWAY,
        "upstream-unreachable",
        &detail,
        grpc,
    )
}

/// The answer when the upstream kept a whole request unanswered past the upstream timeout: 504,
/// or gRPC `UNAVAILABLE` (gRPC's mapping of a 504) for gRPC requests.
pub fn upstream_timed_out(error: &dyn std::error::Error, grpc: bool) -> Response<Full<Bytes>> {
    upstream_problem(
        StatusCode::GATEWAY_TIMEOUT,
        "upstream-timeout",
        &chain(error),
        grpc,
    )
}

/// The answer to a request still waiting on the upstream when the drain deadline passes: `503`
/// with `connection: close` and a problem document, or gRPC `UNAVAILABLE`, so the client retries
/// elsewhere.
pub fn draining(grpc: bool) -> Response<Full<Bytes>> {
    let mut response = upstream_problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "draining",
        "the proxy is shutting down and its drain timeout passed before the upstream answered",
        grpc,
    );
    if !grpc {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The answer to a request whose body made no progress for the body timeout before any answer
/// began: `408` with a problem document, and `connection: close` when `close` (an
/// HTTP/1.1 body left unread ends its connection), or a trailers-only gRPC `DEADLINE_EXCEEDED`.
pub fn body_timed_out(after: Duration, grpc: bool, close: bool) -> Response<Full<Bytes>> {
    let detail = format!(
        "the request body made no progress for {after:?} (the proxy's body timeout); the request was not completed"
    );
    let mut response = if grpc {
        grpc_status(GRPC_DEADLINE_EXCEEDED, &detail)
    } else {
        let body = serde_json::json!({
            "type": "urn:spillway:problem:body-timeout",
            "title": "Request Timeout",
            "status": 408,
            "detail": detail,
        });
        problem(StatusCode::REQUEST_TIMEOUT, &body)
    };
    if close {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The answer to a request whose body could not be read: a malformed chunked body,
/// a body shorter than its `content-length`, a reset HTTP/2 stream. The client's fault, not the
/// upstream's: `400` with a problem document and `connection: close` when `close` (what is left
/// of an HTTP/1.1 body cannot be framed), or a trailers-only gRPC `INVALID_ARGUMENT`.
pub fn bad_body(error: &dyn std::error::Error, grpc: bool, close: bool) -> Response<Full<Bytes>> {
    let detail = format!("the request body could not be read: {}", chain(error));
    let mut response = if grpc {
        grpc_status(GRPC_INVALID_ARGUMENT, &detail)
    } else {
        let body = serde_json::json!({
            "type": "urn:spillway:problem:bad-body",
            "title": "Bad Request",
            "status": 400,
            "detail": detail,
        });
        problem(StatusCode::BAD_REQUEST, &body)
    };
    if close {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The answer to an HTTP/1.1 request whose body has a transfer coding other than `chunked`
/// alone (`gzip, chunked`): the proxy does not apply codings, and would otherwise pass the body
/// on decoded of its chunks but still gzipped, with no field saying so. `501` (RFC 9112 §6.1) with
/// a problem document; the connection closes, its body unread.
pub fn unsupported_coding(coding: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "type": "urn:spillway:problem:unsupported-transfer-coding",
        "title": "Not Implemented",
        "status": 501,
        "detail": format!(
            "the request's transfer-encoding is {coding:?}; only chunked alone is forwarded (send other codings as content-encoding)"
        ),
    });
    let mut response = problem(StatusCode::NOT_IMPLEMENTED, &body);
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

/// Why the proxy answered a request itself for a fault of the client's, before or instead of the
/// upstream (`spillway_requests_refused_total{reason}`). None of these is an upstream error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Two `Host` fields, or none on HTTP/1.1: `400`.
    BadHost,
    /// An identity header twice or not visible ASCII: `400`.
    BadIdentity,
    /// A body that could not be read: `400`.
    BadBody,
    /// A body that made no progress for the body timeout: `408`.
    BodyTimeout,
    /// A transfer coding other than `chunked`: `501`.
    UnsupportedCoding,
}

impl Refusal {
    pub(crate) const ALL: [Refusal; 5] = [
        Refusal::BadHost,
        Refusal::BadIdentity,
        Refusal::BadBody,
        Refusal::BodyTimeout,
        Refusal::UnsupportedCoding,
    ];

    /// The metric's `reason` label.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::BadHost => "bad_host",
            Refusal::BadIdentity => "bad_identity",
            Refusal::BadBody => "bad_body",
            Refusal::BodyTimeout => "body_timeout",
            Refusal::UnsupportedCoding => "unsupported_transfer_coding",
        }
    }
}

/// How many requests were refused, per [`Refusal`].
#[derive(Debug, Default)]
pub(crate) struct Refusals([std::sync::atomic::AtomicU64; Refusal::ALL.len()]);

impl Refusals {
    pub(crate) fn count(&self, refusal: Refusal) {
        self.0[refusal as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn get(&self, refusal: Refusal) -> u64 {
        self.0[refusal as usize].load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The whole HTTP/1.1 answer to a request head longer than `max_head` bytes: `431` with a problem
/// document, closing the connection. It is sent in place of the HTTP library's own bodiless
/// `431`, which is written before any request exists, so it is bytes rather than a response.
pub fn head_too_large(max_head: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "type": "urn:spillway:problem:head-too-large",
        "title": "Request Header Fields Too Large",
        "status": 431,
        "detail": format!(
            "the request line and header fields exceed the proxy's limit of {max_head} bytes (or 100 fields)"
        ),
        "limit": max_head,
    })
    .to_string();
    format!(
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: {PROBLEM_JSON}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// An upstream fault as `status` with a problem document of type `kind`, or for gRPC as a
/// trailers-only `UNAVAILABLE` carrying the same HTTP status.
fn upstream_problem(
    status: StatusCode,
    kind: &str,
    detail: &str,
    grpc: bool,
) -> Response<Full<Bytes>> {
    if grpc {
        let mut response = grpc_status(GRPC_UNAVAILABLE, detail);
        *response.status_mut() = status;
        return response;
    }
    let body = serde_json::json!({
        "type": format!("urn:spillway:problem:{kind}"),
        "title": status.canonical_reason().unwrap_or("Upstream Error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    problem(status, &body)
}

/// An error and its sources, as one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn problem(status: StatusCode, body: &serde_json::Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

/// A trailers-only gRPC response: HTTP 200 whose only headers frame carries the status and ends
/// the stream.
fn grpc_status(code: u32, message: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from(code));
    headers.insert("grpc-message", header(&percent_encode(message)));
    response
}

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_at_least_one() {
        let window = Duration::from_secs(60);
        assert_eq!(retry_after_secs(Duration::ZERO, window), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1), window), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001), window), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(7), window), 7);
        assert_eq!(retry_after_secs(Duration::MAX, window), 60);
    }

    #[test]
    fn grpc_content_types_are_recognised() {
        let mut headers = HeaderMap::new();
        for (ct, grpc) in [
            ("application/grpc", true),
            ("application/grpc+proto", true),
            ("application/grpc;charset=utf-8", true),
            ("application/grpc-web", false),
            ("application/json", false),
        ] {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
            assert_eq!(is_grpc(&headers), grpc, "{ct}");
        }
    }

    #[test]
    fn an_upstream_timeout_is_504_and_grpc_unavailable() {
        let err = std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 60s");
        let plain = upstream_timed_out(&err, false);
        assert_eq!(plain.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(plain.headers()[CONTENT_TYPE], PROBLEM_JSON);
        let grpc = upstream_timed_out(&err, true);
        assert_eq!(grpc.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(grpc.headers()["grpc-status"], "14");
        assert_eq!(grpc.headers()["grpc-message"], "no answer within 60s");
    }

    #[test]
    fn a_head_too_large_is_a_whole_431_answer_with_its_length() {
        let answer = String::from_utf8(head_too_large(65536)).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["status"], 431);
        assert_eq!(body["limit"], 65536);
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("50% off — now"), "50%25 off %E2%80%94 now");
    }
}
