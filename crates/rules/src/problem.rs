//! The one place that turns errors into answers: RFC 9457 problem documents with the status
//! codes of the rules API (401, 403, 404, 409, 412, 422, 428, 429, and 503 when the store is down),
//! for rules and for its users and tokens alike; and the 429 and 503 of a bearer
//! token that was not checked ([`crate::auth::guard`]).
//!
//! A 503 says `retry-after: 1` and is not logged here: the store's liveness logs each outage
//! once, and the failures of a store that answers its probe in one line per interval
//! ([`store::liveness`](crate::store::liveness)), from the [`StoreFailure`] each such answer
//! carries.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::AuthError;
use crate::rule::RuleError;
use crate::store::liveness::RETRY_AFTER_SECS;
use crate::store::{AccessError, ChangeError, StoreError};

/// Set on an answer that failed on the store: what failed, for the liveness' summary.
#[derive(Debug, Clone)]
pub(crate) struct StoreFailure(pub(crate) String);

/// Everything a request can end in besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(
        "role {role} may read but not change rules; ask an admin for an admin or service token"
    )]
    Forbidden { role: String },
    #[error("role {role} may not manage users and tokens; that takes an admin token")]
    AdminOnly { role: String },
    #[error("{0}")]
    BadRequest(String),
    /// Well-formed, but not a request the service can carry out (a bad role, expiry or name).
    #[error("{0}")]
    Unprocessable(String),
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error(transparent)]
    Rule(#[from] RuleError),
    #[error(transparent)]
    Change(#[from] ChangeError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    NotFound(String),
    #[error(
        "the body is over the limit of {} bytes (8 MiB), the largest configuration accepted",
        spillway_core::config::MAX_CONFIG_BYTES
    )]
    TooLarge,
    #[error(
        "send `if-match: <version>` with the version you read, so that a concurrent change is not overwritten"
    )]
    PreconditionRequired,
}

struct Problem {
    status: StatusCode,
    slug: &'static str,
    title: &'static str,
}

impl ApiError {
    /// Whether the store failed, as opposed to refusing the request.
    fn is_store_failure(&self) -> bool {
        matches!(
            self,
            ApiError::Auth(AuthError::Store(_))
                | ApiError::Store(_)
                | ApiError::Access(AccessError::Store(_))
                | ApiError::Change(ChangeError::Store(_))
        )
    }

    /// When to ask again: after the day's budget renews, or in a moment for a store that failed.
    fn retry_after(&self) -> Option<u64> {
        match self {
            ApiError::Change(ChangeError::Budget { retry_after, .. }) => Some(*retry_after),
            ApiError::Auth(AuthError::Throttled(seconds)) => Some(*seconds),
            ApiError::Auth(AuthError::Busy) => Some(1),
            _ if self.is_store_failure() => Some(RETRY_AFTER_SECS),
            _ => None,
        }
    }

    fn problem(&self) -> Problem {
        let p = |status, slug, title| Problem {
            status,
            slug,
            title,
        };
        match self {
            ApiError::Auth(AuthError::Store(_))
            | ApiError::Store(_)
            | ApiError::Access(AccessError::Store(_))
            | ApiError::Change(ChangeError::Store(_)) => p(
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "The rules store is unavailable",
            ),
            ApiError::Auth(AuthError::Throttled(_)) => p(
                StatusCode::TOO_MANY_REQUESTS,
                "auth-throttled",
                "Too many failed authentications",
            ),
            ApiError::Auth(AuthError::Busy) => p(
                StatusCode::SERVICE_UNAVAILABLE,
                "auth-busy",
                "Too many bearer tokens are being checked",
            ),
            ApiError::Auth(_) => p(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "A valid bearer token is required",
            ),
            ApiError::Forbidden { .. } => p(
                StatusCode::FORBIDDEN,
                "forbidden",
                "This role may not change rules",
            ),
            ApiError::AdminOnly { .. } => p(
                StatusCode::FORBIDDEN,
                "forbidden",
                "Only an admin manages users and tokens",
            ),
            ApiError::BadRequest(_) => p(StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            ApiError::TooLarge => p(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-large",
                "The body is over the limit",
            ),
            ApiError::Unprocessable(_) => p(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-request",
                "The request is invalid",
            ),
            ApiError::Access(AccessError::NotFound(_)) => {
                p(StatusCode::NOT_FOUND, "not-found", "No such user or token")
            }
            ApiError::Access(AccessError::Conflict(_)) => p(
                StatusCode::CONFLICT,
                "access-conflict",
                "The change conflicts with the users and tokens as they are",
            ),
            ApiError::Rule(_) => p(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-rule",
                "The rule or configuration is invalid",
            ),
            ApiError::NotFound(_) | ApiError::Change(ChangeError::NotFound(_)) => {
                p(StatusCode::NOT_FOUND, "not-found", "No such rule")
            }
            ApiError::PreconditionRequired => p(
                StatusCode::PRECONDITION_REQUIRED,
                "precondition-required",
                "If-Match is required",
            ),
            ApiError::Change(ChangeError::Conflict(_)) => p(
                StatusCode::CONFLICT,
                "conflict",
                "Another rule limits the same subject and api",
            ),
            ApiError::Change(ChangeError::Full { .. }) => p(
                StatusCode::UNPROCESSABLE_ENTITY,
                "too-many-rules",
                "The store holds as many rules as a configuration may",
            ),
            ApiError::Change(ChangeError::VersionMoved { .. }) => p(
                StatusCode::PRECONDITION_FAILED,
                "version-moved",
                "The rule changed since it was read",
            ),
            ApiError::Change(ChangeError::Budget { .. }) => p(
                StatusCode::TOO_MANY_REQUESTS,
                "budget-spent",
                "Today's modification budget is spent",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        let mut body = json!({
            "type": format!("urn:spillway:problem:{}", problem.slug),
            "title": problem.title,
            "status": problem.status.as_u16(),
            "detail": self.to_string(),
        });
        if let ApiError::Change(ChangeError::VersionMoved { current, .. }) = &self {
            body["current_version"] = json!(current);
        }
        let mut response = (problem.status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        match &self {
            ApiError::Auth(
                AuthError::Missing
                | AuthError::Invalid
                | AuthError::Revoked(_)
                | AuthError::Expired(_),
            ) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            ApiError::Change(ChangeError::VersionMoved { current, .. }) => {
                if let Ok(etag) = HeaderValue::from_str(&format!("\"{current}\"")) {
                    headers.insert(header::ETAG, etag);
                }
            }
            _ => {}
        }
        if let Some(seconds) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.is_store_failure() {
            response
                .extensions_mut()
                .insert(StoreFailure(self.to_string()));
        }
        response
    }
}
