//! The rules store on PostgreSQL or SQLite through `sqlx::Any` (opened, with its schema, by
//! spillway-db): the one global rules version, and the transaction every modification runs in.
//!
//! A modification starts by bumping the single `rules_version` row. That row lock (PostgreSQL)
//! or the write lock of `BEGIN IMMEDIATE` (SQLite) serializes every writer, so the daily budget
//! counted next sees every modification committed before it: fifty concurrent writers cannot
//! slip past it, and a refused one rolls back its bump and stores nothing.
//!
//! By concern: `users` (users and roles), `tokens` (their bearer tokens), `budget` (the daily
//! modification budget), `rules` (reading and changing one rule), `planner` (the pure diff of
//! an apply) and `apply` (carrying it out), `audit` (the audit log); `liveness` (whether the
//! database answers, as a probe in the background last found); `history` (the controllers'
//! traffic history for the configurator, kept by spillway-db).

mod apply;
mod audit;
mod budget;
pub mod history;
pub mod liveness;
pub(crate) mod local;
mod planner;
mod rules;
mod tokens;
mod users;

use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_db::DbError;

use sqlx::{Any, AnyPool, Transaction};

use crate::rule::Rule;
use crate::time::now_millis;

pub use audit::{AuditAction, AuditEntry};
pub use budget::Budgets;
pub use liveness::Liveness;
pub use planner::{ApplyDiff, UpdatedRule};
pub use tokens::TokenInfo;
pub(crate) use tokens::TokenRecord;
pub use users::{Role, User, UserInfo};

use audit::Audit;

/// The PostgreSQL channel every commit is announced on, with the new version as payload.
pub const CHANNEL: &str = "spillway_rules";

pub use spillway_db::{Backend, POSTGRES_ACQUIRE_TIMEOUT, normalize};

/// Why the store failed, as opposed to refusing a change.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL \"{0}\"; use sqlite://PATH or postgres://USER@HOST/DB")]
    Url(String),
    #[error(
        "\"{0}\" needs the PostgreSQL driver, which this build of spillway leaves out (its `postgres` feature); use sqlite://PATH, or build the full binary: cargo build --release -p spillway-cli"
    )]
    NoPostgres(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrating the rules store: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored data this build cannot read: {0}")]
    Corrupt(String),
    #[error("hashing a token: {0}")]
    Hash(String),
    /// The liveness probe finds the database down: refused without waiting on it.
    #[error(
        "the rules store's database has not answered for {:.1}s ({error}); retry in a moment",
        down_for.as_secs_f64()
    )]
    Unavailable { down_for: Duration, error: String },
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
    /// The store holds as many live rules as a configuration may hold buckets.
    #[error(
        "the store holds {limit} live rules, as many as one configuration may hold buckets; \
         delete one before adding another"
    )]
    Full { limit: usize },
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

/// Why a change to users or tokens was refused; nothing of it was stored.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
}

impl From<DbError> for StoreError {
    fn from(err: DbError) -> Self {
        match err {
            DbError::Url(url) => StoreError::Url(url),
            DbError::NoPostgres(url) => StoreError::NoPostgres(url),
            DbError::Database(err) => StoreError::Database(err),
            DbError::Migrate(err) => StoreError::Migrate(err),
        }
    }
}

impl From<sqlx::Error> for AccessError {
    fn from(err: sqlx::Error) -> Self {
        AccessError::Store(StoreError::Database(err))
    }
}

impl From<sqlx::Error> for ChangeError {
    fn from(err: sqlx::Error) -> Self {
        ChangeError::Store(StoreError::Database(err))
    }
}

/// The rules store.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    key: String,
    /// What the liveness probe connects to.
    url: Arc<str>,
    budgets: Budgets,
    liveness: Arc<Liveness>,
}

impl Store {
    /// Opens (creating when needed) and migrates the store at `url`: `sqlite://PATH` or
    /// `postgres://...`.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Self::connect_with(url, Budgets::default()).await
    }

    pub async fn connect_with(url: &str, budgets: Budgets) -> Result<Store, StoreError> {
        let (pool, backend, url) = spillway_db::open(url).await?;
        let version = sqlx::query_scalar("SELECT version FROM rules_version WHERE id = 1")
            .fetch_one(&pool)
            .await?;
        Ok(Store {
            pool,
            backend,
            key: local::local_key(&url),
            url: url.into(),
            budgets,
            liveness: Arc::new(Liveness::new(version, Instant::now())),
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

    /// Whether the database answered its last liveness probe, and the version it read: what
    /// `/readyz`, `/metrics` and the API consult instead of waiting on the database.
    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// Probes the database every [`liveness::PROBE_EVERY`] until dropped, keeping
    /// [`Store::liveness`] and logging its changes. Without a probe running the store counts as
    /// up; `serve` runs one for as long as it serves.
    pub async fn probe_liveness(&self) {
        liveness::probe(&self.liveness, &self.url).await;
    }

    /// Whether the database answers, asked now (through the pool).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    pub async fn version(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT version FROM rules_version WHERE id = 1")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    /// The version and every stored rule (expired overrides included, with their expiry), read
    /// in one snapshot so they agree.
    pub async fn snapshot(&self) -> Result<(i64, Vec<Rule>), StoreError> {
        let mut tx = match self.backend {
            Backend::Postgres => {
                self.begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?
            }
            Backend::Sqlite => self.begin("BEGIN").await?,
        };
        let version: i64 = sqlx::query_scalar("SELECT version FROM rules_version WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        let rules = rules::all_in(&mut tx).await?;
        tx.commit().await?;
        Ok((version, rules))
    }

    /// Opens a modification: takes the writers' lock by bumping the version, then checks the
    /// actor's budget for today under that lock. Returns the transaction, the version the
    /// modification will produce and the time it happens at.
    async fn begin_change(
        &self,
        actor: Option<&User>,
    ) -> Result<(Transaction<'static, Any>, i64, i64), ChangeError> {
        let mut tx = match self.backend {
            Backend::Postgres => self.begin("BEGIN").await?,
            Backend::Sqlite => self.begin("BEGIN IMMEDIATE").await?,
        };
        let version: i64 = sqlx::query_scalar(
            "UPDATE rules_version SET version = version + 1 WHERE id = 1 RETURNING version",
        )
        .fetch_one(&mut *tx)
        .await?;
        let now = now_millis();
        if let Some(user) = actor {
            // A refusal drops the transaction, which rolls the version back too.
            self.budgets.check(&mut tx, user, now).await?;
        }
        Ok((tx, version, now))
    }

    /// A transaction that holds the writers' lock without making a modification, for changes to
    /// users that must see every other such change (the last admin stays an admin).
    async fn begin_exclusive(&self) -> Result<Transaction<'static, Any>, StoreError> {
        match self.backend {
            Backend::Postgres => {
                let mut tx = self.begin("BEGIN").await?;
                sqlx::query("SELECT version FROM rules_version WHERE id = 1 FOR UPDATE")
                    .execute(&mut *tx)
                    .await?;
                Ok(tx)
            }
            Backend::Sqlite => Ok(self.begin("BEGIN IMMEDIATE").await?),
        }
    }

    /// Opens a transaction with `statement`. A pooled connection the database closed (it
    /// restarted, or ended idle sessions) fails on its first use; the transaction is then opened
    /// once more, on a connection the pool checks first, which is safe since nothing was done
    /// in it yet. So the first request after a restart does not fail on the old connections.
    async fn begin(
        &self,
        statement: &'static str,
    ) -> Result<Transaction<'static, Any>, sqlx::Error> {
        match self.pool.begin_with(statement).await {
            Err(err) if is_broken_connection(&err) => {
                tracing::debug!(error = %err, "a pooled connection was broken; opening the transaction again");
                self.pool.begin_with(statement).await
            }
            other => other,
        }
    }

    /// Ends a modification: writes its audit row, announces the new version and commits.
    async fn finish_change(
        &self,
        mut tx: Transaction<'static, Any>,
        version: i64,
        now: i64,
        audit: Audit<'_>,
    ) -> Result<(), ChangeError> {
        audit.insert(&mut tx, version, now).await?;
        if self.backend == Backend::Postgres {
            // Delivered at commit, and only if the commit succeeds.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(version.to_string())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.liveness.committed(version);
        if self.backend == Backend::Sqlite {
            local::notify_local(&self.key, version);
        }
        Ok(())
    }
}

/// Whether `err` says the connection is gone rather than the statement refused: a broken
/// socket, or PostgreSQL's notice that it ended the session (class 57P: the server shut down or
/// restarted; class 08: a connection exception).
pub(crate) fn is_broken_connection(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")),
        _ => false,
    }
}
