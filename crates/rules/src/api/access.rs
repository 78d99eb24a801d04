//! Users and tokens over REST, for admins only: `/v1/users` and `/v1/tokens`, behind
//! `spillway rules user ...` and `spillway rules token ...`.
//!
//! A change here reaches every instance of the service within
//! [`REVALIDATE_AFTER`](crate::auth::REVALIDATE_AFTER): each one checks a remembered token
//! against the store again once it is that old.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use spillway_core::limit::parse_duration;
use utoipa::{IntoParams, ToSchema};

use crate::api::{AppState, Body, Params};
use crate::problem::ApiError;
use crate::store::{Role, User};
use crate::time::now_millis;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/users", get(list_users).post(create_user))
        .route("/v1/users/{name}", patch(update_user).delete(delete_user))
        .route("/v1/tokens", get(list_tokens).post(create_token))
        .route("/v1/tokens/{id}/revoke", post(revoke_token))
        .route("/v1/tokens/{id}/rotate", post(rotate_token))
}

/// A JSON body of type `T`; an empty body is `T`'s default when `empty_ok`.
fn body<T: DeserializeOwned + Default>(bytes: &Bytes, empty_ok: bool) -> Result<T, ApiError> {
    let text = bytes.trim_ascii_start();
    if empty_ok && text.is_empty() {
        return Ok(T::default());
    }
    // serde would also read a struct from an array of its fields in order: `[null, null]`.
    if !text.starts_with(b"{") {
        return Err(ApiError::BadRequest(
            "the body: a JSON object is expected".to_owned(),
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::BadRequest(format!("the body: {e}")))
}

fn role(text: &str) -> Result<Role, ApiError> {
    Role::named(text).ok_or_else(|| {
        let names: Vec<&str> = Role::ALL.iter().map(|r| r.name()).collect();
        ApiError::Unprocessable(format!(
            "`role` {text:?} is no role; use one of {}",
            names.join(", ")
        ))
    })
}

fn expires(text: Option<&str>) -> Result<Option<Duration>, ApiError> {
    text.map(|text| {
        parse_duration(text).map_err(|e| {
            ApiError::Unprocessable(format!("`expires`: {e}; for example 30d, 12h or 15m"))
        })
    })
    .transpose()
}

/// A user's name: what `spillway rules user ...` and audit rows call it.
fn check_name(name: &str) -> Result<(), ApiError> {
    let fine = (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b));
    if fine {
        Ok(())
    } else {
        Err(ApiError::Unprocessable(format!(
            "`name` {name:?}: a user's name is 1 to 64 letters, digits, `.`, `_`, `@` or `-`, \
             starting with a letter or a digit"
        )))
    }
}

/// A name to look up: one with a NUL names nobody (PostgreSQL cannot even compare it).
fn known_name(name: &str) -> Result<&str, ApiError> {
    if name.contains('\0') {
        return Err(ApiError::NotFound(format!("no user named {name:?}")));
    }
    Ok(name)
}

fn token_id(id: &str) -> Result<&str, ApiError> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(id)
    } else {
        Err(ApiError::NotFound(format!(
            "no token with id {id:?}: a token id is the 32 hex digits after `spw_`"
        )))
    }
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewUserBody {
    /// 1 to 64 letters, digits, `.`, `_`, `@` or `-`.
    #[schema(pattern = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")]
    name: String,
    /// admin, viewer or service (default viewer).
    #[schema(nullable = false)]
    role: Option<String>,
    /// The first token's lifetime, like `30d` or `12h`; without it the token does not expire.
    #[schema(nullable = false)]
    expires: Option<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RoleBody {
    /// admin, viewer or service.
    role: String,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewTokenBody {
    /// Whose token (default: the caller's own).
    #[schema(nullable = false)]
    user: Option<String>,
    /// Its lifetime, like `30d` or `12h`; without it the token does not expire.
    #[schema(nullable = false)]
    expires: Option<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateBody {
    /// The new secret's lifetime, like `30d`; without it, as long as the old one was given.
    #[schema(nullable = false)]
    expires: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TokensQuery {
    /// Only this user's tokens.
    user: Option<String>,
}

/// A user, with how many of its tokens work now.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct UserAnswer {
    id: String,
    name: String,
    /// admin, viewer or service.
    role: String,
    created_at: String,
    active_tokens: i64,
}

/// A token, never its secret.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct TokenAnswer {
    /// The 32 hex digits after `spw_`.
    id: String,
    user: String,
    role: String,
    /// active, expired or revoked.
    state: String,
    created_at: String,
    /// When the current secret was issued: created_at, or the last rotation.
    issued_at: String,
    expires_at: Option<String>,
    /// To the minute: it is written at most once a minute.
    last_used_at: Option<String>,
    revoked_at: Option<String>,
}

/// A token just made or rotated: its answer plus the token itself, shown this once.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct NewTokenAnswer {
    id: String,
    user: String,
    role: String,
    /// active.
    state: String,
    created_at: String,
    issued_at: String,
    expires_at: Option<String>,
    last_used_at: Option<String>,
    revoked_at: Option<String>,
    /// `spw_<id>_<secret>`: send it as `authorization: Bearer ...`.
    token: String,
}

/// A user just made, and its first token, shown this once.
#[derive(ToSchema)]
#[allow(dead_code)]
pub(crate) struct NewUserAnswer {
    user: UserAnswer,
    token: NewTokenAnswer,
}

fn with_token(mut info: Value, token: String) -> Value {
    info["token"] = json!(token);
    info
}

async fn user_answer(state: &AppState, user: &User) -> Result<Value, ApiError> {
    let users = state.store.list_users().await?;
    Ok(users.iter().find(|u| u.user.id == user.id).map_or_else(
        || json!({"id": user.id, "name": user.name, "role": user.role}),
        |u| u.to_json(),
    ))
}

#[utoipa::path(get, path = "/v1/users", security(("bearer" = [])), responses(
    (status = 200, description = "Every user, by name", body = Vec<UserAnswer>),
    (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 403, description = "Only an admin manages users", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn list_users(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    state.admin(&headers).await?;
    let users = state.store.list_users().await?;
    Ok(Json(Value::Array(
        users.iter().map(|u| u.to_json()).collect(),
    )))
}

#[utoipa::path(post, path = "/v1/users", security(("bearer" = [])), request_body = NewUserBody, responses(
    (status = 201, description = "Created, with its first token (shown once)", body = NewUserAnswer),
    (status = 400, description = "The body is not such JSON", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 403, description = "Only an admin manages users", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 409, description = "The name is taken", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 422, description = "A bad name, role or expiry", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn create_user(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(bytes): Body,
) -> Result<Response, ApiError> {
    let admin = state.admin(&headers).await?;
    let body: NewUserBody = body(&bytes, false)?;
    check_name(&body.name)?;
    let role = role(body.role.as_deref().unwrap_or("viewer"))?;
    let expires = expires(body.expires.as_deref())?;
    let (user, info, token) = state
        .store
        .create_user_with(&body.name, role, expires)
        .await?;
    tracing::info!(admin = %admin.name, user = %user.name, %role, "user created");
    let answer = json!({
        "user": user_answer(&state, &user).await?,
        "token": with_token(info.to_json(now_millis()), token),
    });
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

#[utoipa::path(patch, path = "/v1/users/{name}", security(("bearer" = [])), request_body = RoleBody,
    params(("name" = String, Path, description = "The user's name")),
    responses(
        (status = 200, description = "The user with its new role; every instance applies it within 500 ms", body = UserAnswer),
        (status = 400, description = "The body is not such JSON", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Only an admin manages users", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 409, description = "It would leave no admin", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 422, description = "No such role", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn update_user(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Body(bytes): Body,
) -> Result<Json<Value>, ApiError> {
    let admin = state.admin(&headers).await?;
    let body: RoleBody = body(&bytes, false)?;
    let role = role(&body.role)?;
    let user = state.store.set_role(known_name(&name)?, role).await?;
    // This instance at once; the others within REVALIDATE_AFTER.
    state.auth.forget_user(&user.id);
    tracing::info!(admin = %admin.name, user = %user.name, %role, "role changed");
    Ok(Json(user_answer(&state, &user).await?))
}

#[utoipa::path(delete, path = "/v1/users/{name}", security(("bearer" = [])),
    params(("name" = String, Path, description = "The user's name")),
    responses(
        (status = 204, description = "Deleted with its tokens; every instance refuses them within 500 ms"),
        (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Only an admin manages users", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such user", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 409, description = "It is the last admin", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn delete_user(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let admin = state.admin(&headers).await?;
    let user = state.store.delete_user(known_name(&name)?).await?;
    state.auth.forget_user(&user.id);
    tracing::info!(admin = %admin.name, user = %user.name, "user deleted");
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/tokens", security(("bearer" = [])), params(TokensQuery), responses(
    (status = 200, description = "Tokens by user, revoked and expired ones included; never a secret", body = Vec<TokenAnswer>),
    (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 403, description = "Only an admin manages tokens", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 404, description = "No such user", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn list_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    Params(query): Params<TokensQuery>,
) -> Result<Json<Value>, ApiError> {
    state.admin(&headers).await?;
    let user = query.user.as_deref().map(known_name).transpose()?;
    let tokens = state.store.list_tokens(user).await?;
    let now = now_millis();
    Ok(Json(Value::Array(
        tokens.iter().map(|t| t.to_json(now)).collect(),
    )))
}

#[utoipa::path(post, path = "/v1/tokens", security(("bearer" = [])), request_body = NewTokenBody, responses(
    (status = 201, description = "Created; the token is shown once", body = NewTokenAnswer),
    (status = 400, description = "The body is not such JSON", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 403, description = "Only an admin manages tokens", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 404, description = "No such user", body = crate::api::Problem, content_type = "application/problem+json"),
    (status = 422, description = "A bad expiry", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn create_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(bytes): Body,
) -> Result<Response, ApiError> {
    let admin = state.admin(&headers).await?;
    let body: NewTokenBody = body(&bytes, true)?;
    let expires = expires(body.expires.as_deref())?;
    let name = body.user.unwrap_or_else(|| admin.name.clone());
    let (info, token) = state
        .store
        .create_token(known_name(&name)?, expires)
        .await?;
    tracing::info!(admin = %admin.name, user = %name, token = %info.id, "token created");
    Ok((
        StatusCode::CREATED,
        Json(with_token(info.to_json(now_millis()), token)),
    )
        .into_response())
}

#[utoipa::path(post, path = "/v1/tokens/{id}/revoke", security(("bearer" = [])),
    params(("id" = String, Path, description = "The token's id: the 32 hex digits after `spw_`")),
    responses(
        (status = 200, description = "Revoked (or already so); every instance refuses it within 500 ms", body = TokenAnswer),
        (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Only an admin manages tokens", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn revoke_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let admin = state.admin(&headers).await?;
    let info = state.store.revoke_token(token_id(&id)?).await?;
    state.auth.forget(&info.id);
    tracing::info!(admin = %admin.name, user = %info.user.name, token = %info.id, "token revoked");
    Ok(Json(info.to_json(now_millis())))
}

#[utoipa::path(post, path = "/v1/tokens/{id}/rotate", security(("bearer" = [])), request_body = RotateBody,
    params(("id" = String, Path, description = "The token's id: the 32 hex digits after `spw_`")),
    responses(
        (status = 200, description = "A new secret under the same id, shown once; every instance refuses the old one within 500 ms", body = NewTokenAnswer),
        (status = 400, description = "The body is not such JSON", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 401, description = "No valid token", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 403, description = "Only an admin manages tokens", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such token", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 409, description = "The token is revoked", body = crate::api::Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad expiry", body = crate::api::Problem, content_type = "application/problem+json"),
))]
pub(crate) async fn rotate_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(bytes): Body,
) -> Result<Json<Value>, ApiError> {
    let admin = state.admin(&headers).await?;
    let body: RotateBody = body(&bytes, true)?;
    let expires = expires(body.expires.as_deref())?;
    let (info, token) = state.store.rotate_token(token_id(&id)?, expires).await?;
    state.auth.forget(&info.id);
    tracing::info!(admin = %admin.name, user = %info.user.name, token = %info.id, "token rotated");
    Ok(Json(with_token(info.to_json(now_millis()), token)))
}
