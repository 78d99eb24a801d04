//! The rules store's database, without the rules service: opening it on PostgreSQL or SQLite
//! through `sqlx::Any` ([`open`]: the URL forms, the pools, the schema brought up to this
//! build's), and the controllers' traffic history in it ([`history`]). The rules service builds
//! its store on [`open`]; a controller with `--database` writes history and the configurator's
//! `builtin:` source reads it through this crate alone, with none of the service's HTTP server,
//! authentication or API.
#![forbid(unsafe_code)]

pub mod history;
pub mod lease;
mod migrations;

use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Executor};

pub use history::HistoryTables;

/// How long a PostgreSQL call waits for a pooled connection before it fails. Writers hold their
/// connection while they queue on the writers' lock, so a burst of them (fifty at once, each
/// checking its token first) keeps the rest waiting for several seconds on a busy machine; with
/// one second, some of that burst got 503 for a database that was up. A database that is down
/// does not make anyone wait this long: the rules service's liveness probe finds it within a
/// probe's period and timeout and every waiting request is answered 503 then.
pub const POSTGRES_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// The same for SQLite, where a wait is for the file's write lock, which writers queue on (as
/// its busy timeout makes them), never for a server that is gone.
const SQLITE_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the database could not be opened or answered.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// Which engine a URL names, and the URL to open: SQLite files are created when missing. A
/// `postgres://` URL is refused with [`DbError::NoPostgres`] in a build without the driver.
pub fn normalize(url: &str) -> Result<(Backend, String), DbError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        if !cfg!(feature = "postgres") {
            return Err(DbError::NoPostgres(url.to_owned()));
        }
        Ok((Backend::Postgres, url.to_owned()))
    } else if let Some(path) = url.strip_prefix("sqlite:") {
        if path.is_empty() || path.contains(":memory:") || path.contains("mode=memory") {
            // Every pooled connection would see a database of its own.
            return Err(DbError::Url(url.to_owned()));
        }
        let url = if url.contains('?') {
            url.to_owned()
        } else {
            format!("{url}?mode=rwc")
        };
        Ok((Backend::Sqlite, url))
    } else {
        Err(DbError::Url(url.to_owned()))
    }
}

/// Opens (creating when needed) and migrates the database at `url` (`sqlite://PATH` or
/// `postgres://...`); returns the pool, its engine and the URL it opened (a SQLite file's with
/// `mode=rwc`).
pub async fn open(url: &str) -> Result<(AnyPool, Backend, String), DbError> {
    open_with(url, None).await
}

/// [`open`], with every wait for a pooled connection (and so for a server that is down) bounded
/// by `acquire` instead of the engine's default.
pub(crate) async fn open_with(
    url: &str,
    acquire: Option<Duration>,
) -> Result<(AnyPool, Backend, String), DbError> {
    sqlx::any::install_default_drivers();
    let (backend, url) = normalize(url)?;
    let options = AnyPoolOptions::new();
    let pool = match backend {
        Backend::Postgres => {
            options
                .max_connections(8)
                .acquire_timeout(acquire.unwrap_or(POSTGRES_ACQUIRE_TIMEOUT))
                .connect(&url)
                .await?
        }
        // Writers queue on SQLite's write lock; a long busy timeout makes them wait for it
        // instead of failing, as PostgreSQL's row lock does.
        Backend::Sqlite => {
            options
                .max_connections(4)
                .acquire_timeout(acquire.unwrap_or(SQLITE_ACQUIRE_TIMEOUT))
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
    migrations::run(&pool).await?;
    Ok((pool, backend, url))
}
