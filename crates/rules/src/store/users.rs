//! Users and their roles: who may read, who may write, and the token each one holds.

use std::str::FromStr;

use serde::Serialize;
use sqlx::Row;

use super::{Store, StoreError};
use crate::auth;
use crate::time::now_millis;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads and writes, within the admin budget (S3).
    Admin,
    /// Reads only.
    Viewer,
    /// Automation (the configurator): writes within its own budget.
    Service,
}

impl Role {
    /// Every role, in the order `spillway rules admin create --role` lists them.
    pub const ALL: [Role; 3] = [Role::Admin, Role::Viewer, Role::Service];

    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Viewer => "viewer",
            Role::Service => "service",
        }
    }

    pub fn can_write(self) -> bool {
        self != Role::Viewer
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = StoreError;
    fn from_str(text: &str) -> Result<Self, StoreError> {
        match text {
            "admin" => Ok(Role::Admin),
            "viewer" => Ok(Role::Viewer),
            "service" => Ok(Role::Service),
            other => Err(StoreError::Corrupt(format!("unknown role {other:?}"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: String,
    pub name: String,
    pub role: Role,
}

impl Store {
    /// Creates a user and returns its token, which is stored only as an argon2 hash.
    pub async fn create_user(&self, name: &str, role: Role) -> Result<(User, String), StoreError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| StoreError::Hash(e.to_string()))?;
        let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let token = format!("{}{id}_{secret}", auth::TOKEN_PREFIX);
        let hash = auth::hash_secret(&secret).map_err(StoreError::Hash)?;
        sqlx::query(
            "INSERT INTO users (id, name, role, token_hash, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&id)
        .bind(name)
        .bind(role.name())
        .bind(hash)
        .bind(now_millis())
        .execute(&self.pool)
        .await?;
        let user = User {
            id,
            name: name.to_owned(),
            role,
        };
        Ok((user, token))
    }

    /// The user with this id and its token hash.
    pub async fn user(&self, id: &str) -> Result<Option<(User, String)>, StoreError> {
        let row = sqlx::query("SELECT id, name, role, token_hash FROM users WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            let role: String = row.try_get("role")?;
            Ok((
                User {
                    id: row.try_get("id")?,
                    name: row.try_get("name")?,
                    role: role.parse()?,
                },
                row.try_get("token_hash")?,
            ))
        })
        .transpose()
    }
}
