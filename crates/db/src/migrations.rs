//! The schema: the landed migrations of `crates/db/migrations`, run on every connect.
//!
//! They are compiled in rather than read at run time, so a binary migrates its store wherever it
//! runs. A landed migration is never edited: sqlx refuses a database whose applied migrations'
//! checksums differ, so a change of schema is a new file here.

use std::borrow::Cow;

use sqlx::AnyPool;
use sqlx::SqlSafeStr;
use sqlx::migrate::{MigrateError, Migration, MigrationType, Migrator};

const MIGRATIONS: [(i64, &str, &str); 4] = [
    (1, "rules", include_str!("../migrations/0001_rules.sql")),
    (2, "tokens", include_str!("../migrations/0002_tokens.sql")),
    (3, "history", include_str!("../migrations/0003_history.sql")),
    (
        4,
        "controller_lease",
        include_str!("../migrations/0004_controller_lease.sql"),
    ),
];

/// Brings the schema of the store behind `pool` up to this build's.
pub(crate) async fn run(pool: &AnyPool) -> Result<(), MigrateError> {
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
    Migrator::with_migrations(migrations).run(pool).await
}
