//! Traffic history in the rules store's database (the configurator's `builtin:` source): each
//! controller with a database writes its region's closed slots ([`HistoryBatch`]) here, off its
//! control loop, and the configurator reads them back per minute, regions summed.
//!
//! Writing a slot adds to what is stored (a late report's slot arrives on its own), so nothing is
//! counted twice and nothing late is lost. History is not a rules modification: it bumps no
//! version, spends no budget and is announced to nobody.

use std::time::Duration;

use std::time::{SystemTime, UNIX_EPOCH};

use spillway_core::history::HistoryBatch;
use sqlx::{AnyPool, Row};
use tokio::sync::mpsc;

use crate::DbError;

/// How long history is kept unless the controller says otherwise: the configurator's default
/// lookback of 28 days and a week more.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(35 * 86_400);

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How often the writer deletes what is older than its retention.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// One minute of one bucket in one region: the counts of its slots that start in the minute.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteCounts {
    pub region: String,
    /// The minute, as Unix minutes (its start in seconds over 60).
    pub minute: i64,
    pub offered: u64,
    pub admitted: u64,
    pub shadow_dropped: u64,
    pub candidate_dropped: u64,
}

/// One bucket's counts over a span, summed over regions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HistoryTotals {
    pub offered: u64,
    pub admitted: u64,
    pub shadow_dropped: u64,
    /// What the bucket's candidate limit would have dropped.
    pub candidate_dropped: u64,
}

fn count(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn counted(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// The history tables of one database (a clone shares its pool).
#[derive(Clone)]
pub struct HistoryTables {
    pool: AnyPool,
}

impl HistoryTables {
    /// The history of the database behind `pool` (opened with [`crate::open`]).
    pub fn new(pool: AnyPool) -> Self {
        Self { pool }
    }

    /// Opens (creating and migrating when needed) the database at `url`, for its history.
    pub async fn open(url: &str) -> Result<Self, DbError> {
        let (pool, _, _) = crate::open(url).await?;
        Ok(Self { pool })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Stores one closed slot of `region`, adding to what an earlier write of the same slot
    /// stored; in one transaction.
    pub async fn write_history(&self, region: &str, batch: &HistoryBatch) -> Result<(), DbError> {
        let start = count(batch.start_ms);
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO history_slots (region, start_ms, seconds) VALUES ($1, $2, $3) \
             ON CONFLICT (region, start_ms) DO UPDATE SET seconds = CASE \
             WHEN excluded.seconds > history_slots.seconds THEN excluded.seconds \
             ELSE history_slots.seconds END",
        )
        .bind(region)
        .bind(start)
        .bind(batch.seconds)
        .execute(&mut *tx)
        .await?;
        for row in &batch.rows {
            sqlx::query(
                "INSERT INTO bucket_history \
                 (region, service, bucket, start_ms, offered, admitted, shadow_dropped, \
                 candidate_dropped) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (service, bucket, region, start_ms) DO UPDATE SET \
                 offered = bucket_history.offered + excluded.offered, \
                 admitted = bucket_history.admitted + excluded.admitted, \
                 shadow_dropped = bucket_history.shadow_dropped + excluded.shadow_dropped, \
                 candidate_dropped = bucket_history.candidate_dropped + excluded.candidate_dropped",
            )
            .bind(region)
            .bind(&row.service)
            .bind(&row.bucket)
            .bind(start)
            .bind(count(row.offered))
            .bind(count(row.admitted))
            .bind(count(row.shadow_dropped))
            .bind(count(row.candidate_dropped))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Deletes the history of slots that started before `before_ms`; returns the rows deleted.
    pub async fn prune_history(&self, before_ms: i64) -> Result<u64, DbError> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query("DELETE FROM bucket_history WHERE start_ms < $1")
            .bind(before_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM history_slots WHERE start_ms < $1")
            .bind(before_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// The (service, bucket) pairs with history in slots starting in `[from_ms, until_ms)`, in
    /// order.
    pub async fn history_series(
        &self,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(String, String)>, DbError> {
        let rows = sqlx::query(
            "SELECT DISTINCT service, bucket FROM bucket_history \
             WHERE start_ms >= $1 AND start_ms < $2 ORDER BY service, bucket",
        )
        .bind(from_ms)
        .bind(until_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("service")?, row.try_get("bucket")?)))
            .collect()
    }

    /// How many seconds of each minute in `[from_ms, until_ms)` each region was heard from:
    /// `(region, Unix minute, seconds)`, by minute.
    pub async fn history_coverage(
        &self,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(String, i64, f64)>, DbError> {
        let rows = sqlx::query(
            "SELECT region, start_ms / 60000 AS minute, SUM(seconds) AS seconds \
             FROM history_slots WHERE start_ms >= $1 AND start_ms < $2 \
             GROUP BY region, start_ms / 60000 ORDER BY minute, region",
        )
        .bind(from_ms)
        .bind(until_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get("region")?,
                    row.try_get("minute")?,
                    row.try_get("seconds")?,
                ))
            })
            .collect()
    }

    /// One bucket's counts per region and minute over slots starting in `[from_ms, until_ms)`,
    /// by minute.
    pub async fn history_minutes(
        &self,
        service: &str,
        bucket: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<MinuteCounts>, DbError> {
        let rows = sqlx::query(
            "SELECT region, start_ms / 60000 AS minute, \
             CAST(SUM(offered) AS BIGINT) AS offered, CAST(SUM(admitted) AS BIGINT) AS admitted, \
             CAST(SUM(shadow_dropped) AS BIGINT) AS shadow_dropped, \
             CAST(SUM(candidate_dropped) AS BIGINT) AS candidate_dropped \
             FROM bucket_history \
             WHERE service = $1 AND bucket = $2 AND start_ms >= $3 AND start_ms < $4 \
             GROUP BY region, start_ms / 60000 ORDER BY minute, region",
        )
        .bind(service)
        .bind(bucket)
        .bind(from_ms)
        .bind(until_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(MinuteCounts {
                    region: row.try_get("region")?,
                    minute: row.try_get("minute")?,
                    offered: counted(row.try_get("offered")?),
                    admitted: counted(row.try_get("admitted")?),
                    shadow_dropped: counted(row.try_get("shadow_dropped")?),
                    candidate_dropped: counted(row.try_get("candidate_dropped")?),
                })
            })
            .collect()
    }

    /// Up to when the history is written (Unix ms, the end of the latest slot), for the region
    /// furthest behind among those written within ten minutes of the newest; `None` when there
    /// is none. A window that ends after it is not all in the store yet.
    pub async fn history_written_until(&self) -> Result<Option<i64>, DbError> {
        let rows = sqlx::query(
            "SELECT region, MAX(start_ms) AS start_ms FROM history_slots GROUP BY region",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut latest = Vec::with_capacity(rows.len());
        for row in &rows {
            let start: i64 = row.try_get("start_ms")?;
            let seconds: f64 = sqlx::query_scalar(
                "SELECT seconds FROM history_slots WHERE region = $1 AND start_ms = $2",
            )
            .bind(row.try_get::<String, _>("region")?)
            .bind(start)
            .fetch_one(&self.pool)
            .await?;
            latest.push(start + (seconds * 1000.0) as i64);
        }
        let Some(&newest) = latest.iter().max() else {
            return Ok(None);
        };
        Ok(latest.into_iter().filter(|&l| l + 600_000 >= newest).min())
    }

    /// One bucket's counts over slots starting in `[from_ms, until_ms)`, summed over regions:
    /// what a validation window saw.
    pub async fn history_totals(
        &self,
        service: &str,
        bucket: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<HistoryTotals, DbError> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(offered), 0) AS BIGINT) AS offered, \
             CAST(COALESCE(SUM(admitted), 0) AS BIGINT) AS admitted, \
             CAST(COALESCE(SUM(shadow_dropped), 0) AS BIGINT) AS shadow_dropped, \
             CAST(COALESCE(SUM(candidate_dropped), 0) AS BIGINT) AS candidate_dropped \
             FROM bucket_history \
             WHERE service = $1 AND bucket = $2 AND start_ms >= $3 AND start_ms < $4",
        )
        .bind(service)
        .bind(bucket)
        .bind(from_ms)
        .bind(until_ms)
        .fetch_one(&self.pool)
        .await?;
        Ok(HistoryTotals {
            offered: counted(row.try_get("offered")?),
            admitted: counted(row.try_get("admitted")?),
            shadow_dropped: counted(row.try_get("shadow_dropped")?),
            candidate_dropped: counted(row.try_get("candidate_dropped")?),
        })
    }
}

/// Writes every slot `batches` hands over for `region` until the channel closes, and deletes
/// history older than `retention` every ten minutes. A write that fails (the store is down) is
/// logged and its slot lost: the store costs history, never control, since the controller only
/// ever `try_send`s into the channel.
pub async fn write_history_from(
    store: HistoryTables,
    region: String,
    mut batches: mpsc::Receiver<HistoryBatch>,
    retention: Duration,
) {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let mut next_prune = tokio::time::Instant::now();
    let mut failing = false;
    while let Some(batch) = batches.recv().await {
        match store.write_history(&region, &batch).await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("history: writing to the rules store again");
            }
            Ok(()) => {}
            Err(err) if !failing => {
                failing = true;
                tracing::warn!(
                    "history: cannot write to the rules store, slots are lost until it answers: {err}"
                );
            }
            Err(err) => tracing::debug!("history: slot lost: {err}"),
        }
        if tokio::time::Instant::now() >= next_prune {
            next_prune = tokio::time::Instant::now() + PRUNE_EVERY;
            match store
                .prune_history(now_millis().saturating_sub(retention_ms))
                .await
            {
                Ok(0) => {}
                Ok(rows) => tracing::debug!(rows, "history: deleted what is past its retention"),
                Err(err) => tracing::debug!("history: cannot prune: {err}"),
            }
        }
    }
}
