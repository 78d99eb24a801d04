//! Bearer tokens: a user holds any number, each with an id, an optional expiry and a revoked
//! mark. Only an argon2 hash of each secret is stored; a token is shown once, when it is made.

use std::time::Duration;

use serde_json::{Value, json};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::{AccessError, Role, Store, StoreError, User};
use crate::time::{format_millis, now_millis};
use crate::token_hash;

/// What `GET /v1/tokens` says of a token: everything but its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: String,
    pub user: User,
    pub created_at: i64,
    /// When the current secret was issued: `created_at`, or the last rotation.
    pub issued_at: i64,
    pub expires_at: Option<i64>,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

impl TokenInfo {
    /// `active`, `expired` or `revoked` at `now`.
    pub fn state(&self, now: i64) -> &'static str {
        if self.revoked_at.is_some() {
            "revoked"
        } else if self.expires_at.is_some_and(|at| at <= now) {
            "expired"
        } else {
            "active"
        }
    }

    pub fn to_json(&self, now: i64) -> Value {
        let time = |t: Option<i64>| t.map(format_millis);
        json!({
            "id": self.id,
            "user": self.user.name,
            "role": self.user.role,
            "state": self.state(now),
            "created_at": format_millis(self.created_at),
            "issued_at": format_millis(self.issued_at),
            "expires_at": time(self.expires_at),
            "last_used_at": time(self.last_used_at),
            "revoked_at": time(self.revoked_at),
        })
    }
}

/// What authentication reads of a token: one primary-key row joined to its user's.
#[derive(Debug, Clone)]
pub(crate) struct TokenRecord {
    pub user: User,
    pub secret_hash: String,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

const TOKEN_COLUMNS: &str = "t.id, t.created_at, t.issued_at, t.expires_at, t.last_used_at, \
     t.revoked_at, u.id AS user_id, u.name AS user_name, u.role AS user_role";

/// A fresh secret (256 random bits as hex) and its argon2 hash.
fn new_secret() -> Result<(String, String), StoreError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| StoreError::Hash(e.to_string()))?;
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let hash = token_hash::hash_secret(&secret).map_err(StoreError::Hash)?;
    Ok((secret, hash))
}

fn expiry(now: i64, expires: Option<Duration>) -> Option<i64> {
    expires.map(|d| now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
}

/// Gives `user` a new token; returns what is stored of it and the token itself.
pub(super) async fn insert_token(
    tx: &mut Transaction<'static, Any>,
    user: &User,
    expires: Option<Duration>,
    now: i64,
) -> Result<(TokenInfo, String), StoreError> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (secret, hash) = new_secret()?;
    let expires_at = expiry(now, expires);
    sqlx::query(
        "INSERT INTO tokens (id, user_id, secret_hash, created_at, issued_at, expires_at) \
         VALUES ($1, $2, $3, $4, $4, $5)",
    )
    .bind(&id)
    .bind(&user.id)
    .bind(hash)
    .bind(now)
    .bind(expires_at)
    .execute(&mut **tx)
    .await?;
    let token = format!("{}{id}_{secret}", token_hash::TOKEN_PREFIX);
    let info = TokenInfo {
        id,
        user: user.clone(),
        created_at: now,
        issued_at: now,
        expires_at,
        last_used_at: None,
        revoked_at: None,
    };
    Ok((info, token))
}

fn info_from_row(row: &AnyRow) -> Result<TokenInfo, StoreError> {
    let role: String = row.try_get("user_role")?;
    Ok(TokenInfo {
        id: row.try_get("id")?,
        user: User {
            id: row.try_get("user_id")?,
            name: row.try_get("user_name")?,
            role: role.parse::<Role>()?,
        },
        created_at: row.try_get("created_at")?,
        issued_at: row.try_get("issued_at")?,
        expires_at: row.try_get("expires_at")?,
        last_used_at: row.try_get("last_used_at")?,
        revoked_at: row.try_get("revoked_at")?,
    })
}

async fn token_in(tx: &mut Transaction<'static, Any>, id: &str) -> Result<TokenInfo, AccessError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {TOKEN_COLUMNS} FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.id = $1"
    )))
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?
    .ok_or_else(|| AccessError::NotFound(format!("no token with id {id:?}")))?;
    Ok(info_from_row(&row)?)
}

impl Store {
    /// A new token for user `name`, expiring after `expires` when given.
    pub async fn create_token(
        &self,
        name: &str,
        expires: Option<Duration>,
    ) -> Result<(TokenInfo, String), AccessError> {
        let user = self
            .user_named(name)
            .await?
            .ok_or_else(|| AccessError::NotFound(format!("no user named {name:?}")))?;
        let mut tx = self.pool.begin().await?;
        let made = insert_token(&mut tx, &user, expires, now_millis()).await?;
        tx.commit().await?;
        Ok(made)
    }

    /// The tokens of user `name`, or of everybody; revoked and expired ones included.
    pub async fn list_tokens(&self, name: Option<&str>) -> Result<Vec<TokenInfo>, AccessError> {
        if let Some(name) = name
            && self.user_named(name).await?.is_none()
        {
            return Err(AccessError::NotFound(format!("no user named {name:?}")));
        }
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens t JOIN users u ON u.id = t.user_id \
             WHERE ($1 IS NULL OR u.name = $1) ORDER BY u.name, t.created_at, t.id"
        )))
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(info_from_row).collect::<Result<_, _>>()?)
    }

    /// Revokes token `id` for good. Revoking a revoked token changes nothing.
    pub async fn revoke_token(&self, id: &str) -> Result<TokenInfo, AccessError> {
        let now = now_millis();
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let info = token_in(&mut tx, id).await?;
        tx.commit().await?;
        Ok(info)
    }

    /// Gives token `id` a new secret; the old one stops working. The token keeps its id and
    /// lives `expires` from now, or, without it, as long as its previous secret was meant to.
    /// A revoked token stays revoked: make a new one instead.
    pub async fn rotate_token(
        &self,
        id: &str,
        expires: Option<Duration>,
    ) -> Result<(TokenInfo, String), AccessError> {
        let now = now_millis();
        let mut tx = self.pool.begin().await?;
        let old = token_in(&mut tx, id).await?;
        if old.revoked_at.is_some() {
            return Err(AccessError::Conflict(format!(
                "token {id} is revoked; create a new one with `spillway rules token create --user {}`",
                old.user.name
            )));
        }
        let lifetime = old.expires_at.map(|at| at.saturating_sub(old.issued_at));
        let expires_at = match expires {
            Some(_) => expiry(now, expires),
            None => lifetime.map(|millis| now.saturating_add(millis)),
        };
        let (secret, hash) = new_secret()?;
        sqlx::query(
            "UPDATE tokens SET secret_hash = $1, issued_at = $2, expires_at = $3 WHERE id = $4",
        )
        .bind(hash)
        .bind(now)
        .bind(expires_at)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let token = format!("{}{id}_{secret}", token_hash::TOKEN_PREFIX);
        Ok((
            TokenInfo {
                issued_at: now,
                expires_at,
                ..old
            },
            token,
        ))
    }

    /// What authenticating token `id` needs to know, in one indexed read.
    pub(crate) async fn token_record(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT t.secret_hash, t.expires_at, t.revoked_at, t.last_used_at, \
             u.id AS user_id, u.name AS user_name, u.role AS user_role \
             FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            let role: String = row.try_get("user_role")?;
            Ok(TokenRecord {
                user: User {
                    id: row.try_get("user_id")?,
                    name: row.try_get("user_name")?,
                    role: role.parse()?,
                },
                secret_hash: row.try_get("secret_hash")?,
                expires_at: row.try_get("expires_at")?,
                revoked_at: row.try_get("revoked_at")?,
                last_used_at: row.try_get("last_used_at")?,
            })
        })
        .transpose()
    }

    /// Notes that token `id` was used at `now`.
    pub(crate) async fn touch_token(&self, id: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE tokens SET last_used_at = $1 WHERE id = $2")
            .bind(now)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// A user is made with its first token, in one transaction.
impl Store {
    /// Creates a user with one token that never expires, and returns that token; it is stored
    /// only as an argon2 hash.
    pub async fn create_user(&self, name: &str, role: Role) -> Result<(User, String), StoreError> {
        self.insert_user(name, role, None)
            .await
            .map(|(user, _, token)| (user, token))
    }

    /// Creates a user and its first token, which expires after `expires` when given; a name
    /// that is taken is a conflict.
    pub async fn create_user_with(
        &self,
        name: &str,
        role: Role,
        expires: Option<Duration>,
    ) -> Result<(User, TokenInfo, String), AccessError> {
        self.insert_user(name, role, expires)
            .await
            .map_err(|err| match err {
                StoreError::Database(sqlx::Error::Database(db))
                    if db.kind() == sqlx::error::ErrorKind::UniqueViolation =>
                {
                    AccessError::Conflict(format!("a user named {name:?} exists already"))
                }
                other => AccessError::Store(other),
            })
    }

    async fn insert_user(
        &self,
        name: &str,
        role: Role,
        expires: Option<Duration>,
    ) -> Result<(User, TokenInfo, String), StoreError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let now = now_millis();
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO users (id, name, role, created_at) VALUES ($1, $2, $3, $4)")
            .bind(&id)
            .bind(name)
            .bind(role.name())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let user = User {
            id,
            name: name.to_owned(),
            role,
        };
        let (info, token) = insert_token(&mut tx, &user, expires, now).await?;
        tx.commit().await?;
        Ok((user, info, token))
    }
}
