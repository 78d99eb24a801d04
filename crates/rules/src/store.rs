//! The rules store on PostgreSQL or SQLite through `sqlx::Any`: migrations, users, rules, the
//! audit log and the one global rules version, with every modification in one transaction.
//!
//! A modification starts by bumping the single `rules_version` row. That row lock (PostgreSQL)
//! or the write lock of `BEGIN IMMEDIATE` (SQLite) serializes every writer, so the daily budget
//! counted next sees every modification committed before it: fifty concurrent writers cannot
//! slip past it, and a refused one rolls back its bump and stores nothing.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Any, AnyPool, Executor, Row, SqlSafeStr, Transaction};

use crate::auth;
use crate::rule::{Rule, RuleInput};
use crate::time::{day_start, format_millis, now_millis, seconds_to_next_day};
use crate::watch;

/// The PostgreSQL channel every commit is announced on, with the new version as payload (S4).
pub const CHANNEL: &str = "spillway_rules";

const MIGRATIONS: [(i64, &str, &str); 1] =
    [(1, "rules", include_str!("../migrations/0001_rules.sql"))];

/// Why the store failed, as opposed to refusing a change.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL \"{0}\"; use sqlite://PATH or postgres://USER@HOST/DB")]
    Url(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrating the rules store: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data this build cannot read: {0}")]
    Corrupt(String),
    #[error("hashing a token: {0}")]
    Hash(String),
}

/// Why a modification was refused; nothing of it was stored.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no rule with id {0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("the rule is at version {current}, not {expected}; fetch it again and retry")]
    VersionMoved { expected: i64, current: i64 },
    #[error(
        "{role} {name} has made its {limit} modifications of today (UTC); the budget renews at midnight UTC"
    )]
    Budget {
        name: String,
        role: Role,
        limit: u32,
        retry_after: u64,
    },
}

impl From<sqlx::Error> for ChangeError {
    fn from(err: sqlx::Error) -> Self {
        ChangeError::Store(StoreError::Database(err))
    }
}

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

/// Modifications a user may make per UTC day, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    pub admin: u32,
    pub service: u32,
}

impl Default for Budgets {
    /// Ten a day for an admin (S3); automation gets more, since it applies whole files.
    fn default() -> Self {
        Budgets {
            admin: 10,
            service: 1000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// One row of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// The rules version this modification produced.
    pub version: i64,
    /// The version it started from.
    pub from_version: i64,
    pub at: String,
    pub actor: String,
    pub action: String,
    pub rule_id: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub reason: Option<String>,
}

/// What `apply` changed, or would change on a dry run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ApplyDiff {
    /// The rules version after the apply (unchanged on a dry run or when nothing differs).
    pub version: i64,
    pub dry_run: bool,
    pub created: Vec<Value>,
    pub updated: Vec<UpdatedRule>,
    pub deleted: Vec<Value>,
    pub unchanged: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpdatedRule {
    pub before: Value,
    pub after: Value,
}

impl ApplyDiff {
    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.updated.is_empty() && self.deleted.is_empty()
    }
}

/// The rules store.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    key: String,
    budgets: Budgets,
}

const RULE_COLUMNS: &str = "rule_id, service, bucket_json, expires_at, reason, version, created_by, created_at, updated_at";

struct Audit<'a> {
    actor: &'a str,
    actor_id: Option<&'a str>,
    action: &'a str,
    rule_id: Option<&'a str>,
    before: Option<Value>,
    after: Option<Value>,
    reason: Option<&'a str>,
}

impl Store {
    /// Opens (creating when needed) and migrates the store at `url`: `sqlite://PATH` or
    /// `postgres://...`.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Self::connect_with(url, Budgets::default()).await
    }

    pub async fn connect_with(url: &str, budgets: Budgets) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let (backend, url) = normalize(url)?;
        let options = AnyPoolOptions::new().acquire_timeout(Duration::from_secs(30));
        let pool = match backend {
            Backend::Postgres => options.max_connections(8).connect(&url).await?,
            // Writers queue on SQLite's write lock; a long busy timeout makes them wait for it
            // instead of failing, as PostgreSQL's row lock does.
            Backend::Sqlite => {
                options
                    .max_connections(4)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute("PRAGMA busy_timeout = 30000").await?;
                            Ok(())
                        })
                    })
                    .connect(&url)
                    .await?
            }
        };
        if backend == Backend::Sqlite {
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        let migrations = MIGRATIONS
            .iter()
            .map(|(version, name, sql)| {
                Migration::new(
                    *version,
                    Cow::Borrowed(*name),
                    MigrationType::Simple,
                    (*sql).into_sql_str(),
                    false,
                )
            })
            .collect();
        Migrator::with_migrations(migrations).run(&pool).await?;
        Ok(Store {
            pool,
            backend,
            key: watch::local_key(&url),
            budgets,
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub(crate) fn local_key(&self) -> &str {
        &self.key
    }

    pub fn budgets(&self) -> Budgets {
        self.budgets
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    // ---- users ----

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

    // ---- reading rules ----

    pub async fn version(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT version FROM rules_version WHERE id = 1")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// Live rules (overrides that have expired are left out), by service and name.
    pub async fn list_rules(&self, service: Option<&str>) -> Result<Vec<Rule>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM rules WHERE (expires_at IS NULL OR expires_at > $1) \
             AND ($2 IS NULL OR service = $2) ORDER BY service, name"
        )))
        .bind(now_millis())
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(rule_from_row).collect()
    }

    pub async fn get_rule(&self, id: &str) -> Result<Option<Rule>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM rules WHERE rule_id = $1 \
             AND (expires_at IS NULL OR expires_at > $2)"
        )))
        .bind(id)
        .bind(now_millis())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(rule_from_row).transpose()
    }

    /// The version and every stored rule (expired overrides included, with their expiry), read
    /// in one snapshot so they agree.
    pub async fn snapshot(&self) -> Result<(i64, Vec<Rule>), StoreError> {
        let mut tx = match self.backend {
            Backend::Postgres => {
                self.pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?
            }
            Backend::Sqlite => self.pool.begin().await?,
        };
        let version: i64 = sqlx::query_scalar("SELECT version FROM rules_version WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM rules ORDER BY service, name"
        )))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let rules = rows.iter().map(rule_from_row).collect::<Result<_, _>>()?;
        Ok((version, rules))
    }

    pub async fn audit(&self, limit: i64) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT version, actor, at, action, rule_id, before_json, after_json, reason \
             FROM audit_log ORDER BY version DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let version: i64 = row.try_get("version")?;
                let json = |column: &str| -> Result<Option<Value>, StoreError> {
                    let text: Option<String> = row.try_get(column)?;
                    text.map(|t| {
                        serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string()))
                    })
                    .transpose()
                };
                Ok(AuditEntry {
                    version,
                    from_version: version - 1,
                    at: format_millis(row.try_get("at")?),
                    actor: row.try_get("actor")?,
                    action: row.try_get("action")?,
                    rule_id: row.try_get("rule_id")?,
                    before: json("before_json")?,
                    after: json("after_json")?,
                    reason: row.try_get("reason")?,
                })
            })
            .collect()
    }

    // ---- modifications ----

    /// Opens a modification: takes the writers' lock by bumping the version, then checks the
    /// actor's budget for today under that lock.
    async fn begin_change(
        &self,
        actor: Option<&User>,
    ) -> Result<(Transaction<'static, Any>, i64, i64), ChangeError> {
        let mut tx = match self.backend {
            Backend::Postgres => self.pool.begin().await?,
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
        };
        let version: i64 = sqlx::query_scalar(
            "UPDATE rules_version SET version = version + 1 WHERE id = 1 RETURNING version",
        )
        .fetch_one(&mut *tx)
        .await?;
        let now = now_millis();
        if let Some(user) = actor {
            let limit = match user.role {
                Role::Admin => self.budgets.admin,
                Role::Service => self.budgets.service,
                Role::Viewer => 0,
            };
            let spent: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM audit_log WHERE actor_id = $1 AND at >= $2",
            )
            .bind(&user.id)
            .bind(day_start(now))
            .fetch_one(&mut *tx)
            .await?;
            if spent >= i64::from(limit) {
                // Dropping the transaction rolls the version back too.
                return Err(ChangeError::Budget {
                    name: user.name.clone(),
                    role: user.role,
                    limit,
                    retry_after: seconds_to_next_day(now),
                });
            }
        }
        Ok((tx, version, now))
    }

    async fn finish_change(
        &self,
        mut tx: Transaction<'static, Any>,
        version: i64,
        now: i64,
        audit: Audit<'_>,
    ) -> Result<(), ChangeError> {
        let text = |v: Option<Value>| v.map(|v| v.to_string());
        sqlx::query(
            "INSERT INTO audit_log (version, actor, actor_id, at, action, rule_id, before_json, after_json, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(version)
        .bind(audit.actor)
        .bind(audit.actor_id)
        .bind(now)
        .bind(audit.action)
        .bind(audit.rule_id)
        .bind(text(audit.before))
        .bind(text(audit.after))
        .bind(audit.reason)
        .execute(&mut *tx)
        .await?;
        if self.backend == Backend::Postgres {
            // Delivered at commit, and only if the commit succeeds.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(version.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if self.backend == Backend::Sqlite {
            watch::notify_local(&self.key, version);
        }
        Ok(())
    }

    /// Refuses a rule whose (service, subject, subject value, api) or (service, name) another
    /// rule already holds (S2), naming that rule.
    async fn check_conflict(
        tx: &mut Transaction<'static, Any>,
        input: &RuleInput,
        except: Option<&str>,
    ) -> Result<(), ChangeError> {
        let row = sqlx::query(
            "SELECT rule_id, name FROM rules WHERE service = $1 AND rule_id <> $2 AND \
             ((subject_scope = $3 AND subject_value = $4 AND api = $5) OR name = $6)",
        )
        .bind(&input.service)
        .bind(except.unwrap_or(""))
        .bind(input.key.subject_scope)
        .bind(&input.key.subject_value)
        .bind(&input.key.api)
        .bind(&input.bucket.name)
        .fetch_optional(&mut **tx)
        .await?;
        if let Some(row) = row {
            let id: String = row.try_get("rule_id")?;
            let name: String = row.try_get("name")?;
            let why = if name == input.bucket.name {
                format!(
                    "the name \"{name}\" is taken in service \"{}\"",
                    input.service
                )
            } else {
                format!(
                    "it limits the same (subject {} \"{}\", api \"{}\") in service \"{}\" (S2)",
                    input.key.subject_scope, input.key.subject_value, input.key.api, input.service
                )
            };
            return Err(ChangeError::Conflict(format!(
                "rule {id} (\"{name}\") conflicts: {why}; change that rule instead, or make this one narrower"
            )));
        }
        Ok(())
    }

    async fn insert_rule(
        tx: &mut Transaction<'static, Any>,
        id: &str,
        input: &RuleInput,
        version: i64,
        created_by: &str,
        created_at: i64,
        now: i64,
    ) -> Result<Rule, ChangeError> {
        let bucket_json =
            serde_json::to_string(&input.bucket).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let match_json = serde_json::to_string(&input.bucket.match_)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let cost_json = serde_json::to_string(&input.bucket.cost)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let expires_at = input
            .ttl
            .map(|ttl| now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)));
        let reason = input.ttl.and(input.reason.as_deref());
        let k = &input.key;
        sqlx::query(
            "INSERT INTO rules (rule_id, service, name, subject_scope, subject_value, api, algorithm, \
             max_requests, window_seconds, burst_size, match_json, scope, mode, store, cost_json, \
             on_store_failure, bucket_json, expires_at, reason, version, created_by, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)",
        )
        .bind(id)
        .bind(&input.service)
        .bind(&input.bucket.name)
        .bind(k.subject_scope)
        .bind(&k.subject_value)
        .bind(&k.api)
        .bind(k.algorithm)
        .bind(k.max_requests)
        .bind(k.window_seconds)
        .bind(k.burst_size)
        .bind(match_json)
        .bind(k.scope)
        .bind(k.mode)
        .bind(k.store)
        .bind(cost_json)
        .bind(k.on_store_failure)
        .bind(bucket_json)
        .bind(expires_at)
        .bind(reason)
        .bind(version)
        .bind(created_by)
        .bind(created_at)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(unique_to_conflict)?;
        Ok(Rule {
            id: id.to_owned(),
            service: input.service.clone(),
            bucket: input.bucket.clone(),
            expires_at,
            reason: reason.map(str::to_owned),
            version,
            created_by: created_by.to_owned(),
            created_at,
            updated_at: now,
        })
    }

    async fn rule_in(
        tx: &mut Transaction<'static, Any>,
        id: &str,
    ) -> Result<Option<Rule>, ChangeError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM rules WHERE rule_id = $1"
        )))
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
        Ok(row.as_ref().map(rule_from_row).transpose()?)
    }

    async fn delete_in(tx: &mut Transaction<'static, Any>, id: &str) -> Result<(), ChangeError> {
        sqlx::query("DELETE FROM rules WHERE rule_id = $1")
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// `POST /v1/rules`: one modification.
    pub async fn create_rule(&self, actor: &User, input: RuleInput) -> Result<Rule, ChangeError> {
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        Self::check_conflict(&mut tx, &input, None).await?;
        let id = uuid::Uuid::new_v4().to_string();
        let rule = Self::insert_rule(&mut tx, &id, &input, version, &actor.name, now, now).await?;
        let action = if input.ttl.is_some() {
            "override"
        } else {
            "create"
        };
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action,
                rule_id: Some(&id),
                before: None,
                after: Some(rule.to_json()),
                reason: input.reason.as_deref(),
            },
        )
        .await?;
        Ok(rule)
    }

    /// `PUT /v1/rules/{id}`: replaces the rule if it is still at `expected` (when given).
    pub async fn update_rule(
        &self,
        actor: &User,
        id: &str,
        expected: Option<i64>,
        input: RuleInput,
    ) -> Result<Rule, ChangeError> {
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        let before = live(Self::rule_in(&mut tx, id).await?, now)
            .ok_or_else(|| ChangeError::NotFound(id.to_owned()))?;
        if let Some(expected) = expected
            && expected != before.version
        {
            return Err(ChangeError::VersionMoved {
                expected,
                current: before.version,
            });
        }
        Self::check_conflict(&mut tx, &input, Some(id)).await?;
        Self::delete_in(&mut tx, id).await?;
        let rule = Self::insert_rule(
            &mut tx,
            id,
            &input,
            version,
            &before.created_by,
            before.created_at,
            now,
        )
        .await?;
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action: "update",
                rule_id: Some(id),
                before: Some(before.to_json()),
                after: Some(rule.to_json()),
                reason: input.reason.as_deref(),
            },
        )
        .await?;
        Ok(rule)
    }

    /// `DELETE /v1/rules/{id}`.
    pub async fn delete_rule(
        &self,
        actor: &User,
        id: &str,
        expected: Option<i64>,
        reason: Option<&str>,
    ) -> Result<Rule, ChangeError> {
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        let before = live(Self::rule_in(&mut tx, id).await?, now)
            .ok_or_else(|| ChangeError::NotFound(id.to_owned()))?;
        if let Some(expected) = expected
            && expected != before.version
        {
            return Err(ChangeError::VersionMoved {
                expected,
                current: before.version,
            });
        }
        Self::delete_in(&mut tx, id).await?;
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action: "delete",
                rule_id: Some(id),
                before: Some(before.to_json()),
                after: None,
                reason,
            },
        )
        .await?;
        Ok(before)
    }

    /// `POST /v1/rules:apply`: makes the permanent rules exactly those of a configuration, as
    /// one modification (none when nothing differs). Incident overrides are left alone: they
    /// end by themselves.
    pub async fn apply(
        &self,
        actor: &User,
        wanted: Vec<RuleInput>,
        dry_run: bool,
        reason: Option<&str>,
    ) -> Result<ApplyDiff, ChangeError> {
        if dry_run {
            let (version, rules) = self.snapshot().await?;
            let mut diff = plan(&rules, &wanted).0;
            diff.version = version;
            diff.dry_run = true;
            return Ok(diff);
        }
        // An apply that changes nothing is not a modification and spends no budget.
        let (_, rules) = self.snapshot().await?;
        if plan(&rules, &wanted).0.is_empty() {
            let mut diff = plan(&rules, &wanted).0;
            diff.version = self.version().await?;
            return Ok(diff);
        }
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM rules ORDER BY service, name"
        )))
        .fetch_all(&mut *tx)
        .await?;
        let rules: Vec<Rule> = rows.iter().map(rule_from_row).collect::<Result<_, _>>()?;
        let (mut diff, steps) = plan(&rules, &wanted);
        diff.version = version;
        diff.created.clear();
        diff.updated.clear();
        let mut before = Vec::new();
        let mut after = Vec::new();
        for step in &steps {
            if let Step::Delete(old) | Step::Update(old, _) = step {
                Self::delete_in(&mut tx, &old.id).await?;
            }
        }
        for step in steps {
            match step {
                Step::Delete(old) => before.push(old.to_json()),
                Step::Update(old, input) => {
                    let rule = Self::insert_rule(
                        &mut tx,
                        &old.id,
                        input,
                        version,
                        &old.created_by,
                        old.created_at,
                        now,
                    )
                    .await?;
                    before.push(old.to_json());
                    after.push(rule.to_json());
                    diff.updated.push(UpdatedRule {
                        before: old.to_json(),
                        after: rule.to_json(),
                    });
                }
                Step::Create(input) => {
                    Self::check_conflict(&mut tx, input, None).await?;
                    let id = uuid::Uuid::new_v4().to_string();
                    let rule =
                        Self::insert_rule(&mut tx, &id, input, version, &actor.name, now, now)
                            .await?;
                    after.push(rule.to_json());
                    diff.created.push(rule.to_json());
                }
            }
        }
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action: "apply",
                rule_id: None,
                before: Some(Value::Array(before)),
                after: Some(Value::Array(after)),
                reason,
            },
        )
        .await?;
        Ok(diff)
    }

    /// Deletes incident overrides whose time is up, each as a modification of its own by
    /// `system`, which spends nobody's budget. Returns how many ended.
    pub async fn expire_overrides(&self) -> Result<usize, ChangeError> {
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT rule_id FROM rules WHERE expires_at IS NOT NULL AND expires_at <= $1",
        )
        .bind(now_millis())
        .fetch_all(&self.pool)
        .await?;
        let mut ended = 0;
        for id in due {
            let (mut tx, version, now) = self.begin_change(None).await?;
            let Some(before) = Self::rule_in(&mut tx, &id).await? else {
                continue;
            };
            Self::delete_in(&mut tx, &id).await?;
            self.finish_change(
                tx,
                version,
                now,
                Audit {
                    actor: "system",
                    actor_id: None,
                    action: "expire",
                    rule_id: Some(&id),
                    before: Some(before.to_json()),
                    after: None,
                    reason: before.reason.as_deref(),
                },
            )
            .await?;
            ended += 1;
        }
        Ok(ended)
    }
}

enum Step<'a> {
    Create(&'a RuleInput),
    Update(&'a Rule, &'a RuleInput),
    Delete(&'a Rule),
}

/// Compares the permanent rules with a configuration, by (service, name).
fn plan<'a>(rules: &'a [Rule], wanted: &'a [RuleInput]) -> (ApplyDiff, Vec<Step<'a>>) {
    let mut current: BTreeMap<(&str, &str), &Rule> = rules
        .iter()
        .filter(|r| r.expires_at.is_none())
        .map(|r| ((r.service.as_str(), r.bucket.name.as_str()), r))
        .collect();
    let mut diff = ApplyDiff::default();
    let mut steps = Vec::new();
    for input in wanted {
        match current.remove(&(input.service.as_str(), input.bucket.name.as_str())) {
            Some(old) if old.bucket == input.bucket => diff.unchanged += 1,
            Some(old) => {
                diff.updated.push(UpdatedRule {
                    before: old.to_json(),
                    after: proposed(input),
                });
                steps.push(Step::Update(old, input));
            }
            None => {
                diff.created.push(proposed(input));
                steps.push(Step::Create(input));
            }
        }
    }
    for old in current.into_values() {
        diff.deleted.push(old.to_json());
        steps.push(Step::Delete(old));
    }
    (diff, steps)
}

/// A rule that does not exist yet, for a diff.
fn proposed(input: &RuleInput) -> Value {
    let mut value = serde_json::to_value(&input.bucket).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut value {
        map.insert("service".into(), json!(input.service));
    }
    value
}

fn live(rule: Option<Rule>, now: i64) -> Option<Rule> {
    rule.filter(|r| r.expires_at.is_none_or(|at| at > now))
}

fn unique_to_conflict(err: sqlx::Error) -> ChangeError {
    match &err {
        sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::UniqueViolation => {
            ChangeError::Conflict(format!(
                "another rule already limits the same (subject, subject value, api) or has the same name in this service (S2): {}",
                db.message()
            ))
        }
        _ => ChangeError::from(err),
    }
}

fn rule_from_row(row: &AnyRow) -> Result<Rule, StoreError> {
    let bucket_json: String = row.try_get("bucket_json")?;
    Ok(Rule {
        id: row.try_get("rule_id")?,
        service: row.try_get("service")?,
        bucket: serde_json::from_str(&bucket_json)
            .map_err(|e| StoreError::Corrupt(format!("rule bucket: {e}")))?,
        expires_at: row.try_get("expires_at")?,
        reason: row.try_get("reason")?,
        version: row.try_get("version")?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

/// Which engine a URL names, and the URL to open: SQLite files are created when missing.
pub fn normalize(url: &str) -> Result<(Backend, String), StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok((Backend::Postgres, url.to_owned()))
    } else if let Some(path) = url.strip_prefix("sqlite:") {
        if path.is_empty() || path.contains(":memory:") || path.contains("mode=memory") {
            // Every pooled connection would see a database of its own.
            return Err(StoreError::Url(url.to_owned()));
        }
        let url = if url.contains('?') {
            url.to_owned()
        } else {
            format!("{url}?mode=rwc")
        };
        Ok((Backend::Sqlite, url))
    } else {
        Err(StoreError::Url(url.to_owned()))
    }
}
