//! Users and their roles: who may read and who may write. Their tokens are in `tokens`.

use std::str::FromStr;

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::Row;

use super::{AccessError, Store, StoreError};
use crate::time::{format_millis, now_millis};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads and writes, within the admin budget.
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

    /// The role named `text`, if any.
    pub fn named(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.name() == text)
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
        Role::named(text).ok_or_else(|| StoreError::Corrupt(format!("unknown role {text:?}")))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: String,
    pub name: String,
    pub role: Role,
}

/// A user as `GET /v1/users` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub user: User,
    pub created_at: i64,
    /// Tokens that work now: neither revoked nor expired.
    pub active_tokens: i64,
}

impl UserInfo {
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.user.id,
            "name": self.user.name,
            "role": self.user.role,
            "created_at": format_millis(self.created_at),
            "active_tokens": self.active_tokens,
        })
    }
}

impl Store {
    /// Every user, by name.
    pub async fn list_users(&self) -> Result<Vec<UserInfo>, StoreError> {
        let rows = sqlx::query(
            "SELECT u.id, u.name, u.role, u.created_at, \
             (SELECT COUNT(*) FROM tokens t WHERE t.user_id = u.id AND t.revoked_at IS NULL \
              AND (t.expires_at IS NULL OR t.expires_at > $1)) AS active_tokens \
             FROM users u ORDER BY u.name",
        )
        .bind(now_millis())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let role: String = row.try_get("role")?;
                Ok(UserInfo {
                    user: User {
                        id: row.try_get("id")?,
                        name: row.try_get("name")?,
                        role: role.parse()?,
                    },
                    created_at: row.try_get("created_at")?,
                    active_tokens: row.try_get("active_tokens")?,
                })
            })
            .collect()
    }

    /// The user called `name`.
    pub async fn user_named(&self, name: &str) -> Result<Option<User>, StoreError> {
        let row = sqlx::query("SELECT id, name, role FROM users WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            let role: String = row.try_get("role")?;
            Ok(User {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
                role: role.parse()?,
            })
        })
        .transpose()
    }

    /// Gives user `name` another role. Every instance of the service sees it within
    /// [`REVALIDATE_AFTER`](crate::auth::REVALIDATE_AFTER): a demoted admin writes no more.
    pub async fn set_role(&self, name: &str, role: Role) -> Result<User, AccessError> {
        let mut tx = self.begin_exclusive().await?;
        let user = user_in(&mut tx, name).await?;
        if user.role == Role::Admin && role != Role::Admin {
            last_admin_guard(&mut tx, &user, "demote").await?;
        }
        sqlx::query("UPDATE users SET role = $1 WHERE id = $2")
            .bind(role.name())
            .bind(&user.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(User { role, ..user })
    }

    /// Deletes user `name` and every token it holds. Its modifications stay in the audit log,
    /// under its name.
    pub async fn delete_user(&self, name: &str) -> Result<User, AccessError> {
        let mut tx = self.begin_exclusive().await?;
        let user = user_in(&mut tx, name).await?;
        if user.role == Role::Admin {
            last_admin_guard(&mut tx, &user, "delete").await?;
        }
        sqlx::query("DELETE FROM tokens WHERE user_id = $1")
            .bind(&user.id)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM users WHERE id = $1")
            .bind(&user.id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(user)
    }
}

/// User `name` as the transaction sees it.
async fn user_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    name: &str,
) -> Result<User, AccessError> {
    let row = sqlx::query("SELECT id, name, role FROM users WHERE name = $1")
        .bind(name)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or_else(|| AccessError::NotFound(format!("no user named {name:?}")))?;
    let role: String = row.try_get("role")?;
    Ok(User {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        role: role.parse()?,
    })
}

/// Refuses to take away the last admin: nobody could manage users and tokens through the API
/// any more (`spillway rules admin create --database` would still bootstrap one).
async fn last_admin_guard(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    user: &User,
    what: &str,
) -> Result<(), AccessError> {
    let others: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE role = 'admin' AND id <> $1")
            .bind(&user.id)
            .fetch_one(&mut **tx)
            .await?;
    if others == 0 {
        return Err(AccessError::Conflict(format!(
            "{} is the last admin; make another user admin before you {what} it",
            user.name
        )));
    }
    Ok(())
}
