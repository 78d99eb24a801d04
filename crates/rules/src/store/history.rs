//! Traffic history in the rules store (the configurator's `builtin:` source): kept by
//! spillway-db, which the configurator reads it through without this service; the store hands
//! out the same tables on its own pool.

use std::time::Duration;

use spillway_core::history::HistoryBatch;
use spillway_db::HistoryTables;
pub use spillway_db::history::{DEFAULT_RETENTION, HistoryTotals, MinuteCounts};
use tokio::sync::mpsc;

use super::{Store, StoreError};

impl Store {
    /// The history tables of this store's database.
    pub fn history(&self) -> HistoryTables {
        HistoryTables::new(self.pool.clone())
    }

    /// Stores one closed slot of `region`, adding to what an earlier write of the same slot
    /// stored; in one transaction.
    pub async fn write_history(
        &self,
        region: &str,
        batch: &HistoryBatch,
    ) -> Result<(), StoreError> {
        Ok(self.history().write_history(region, batch).await?)
    }

    /// Deletes the history of slots that started before `before_ms`; returns the rows deleted.
    pub async fn prune_history(&self, before_ms: i64) -> Result<u64, StoreError> {
        Ok(self.history().prune_history(before_ms).await?)
    }

    /// See [`HistoryTables::history_series`].
    pub async fn history_series(
        &self,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        Ok(self.history().history_series(from_ms, until_ms).await?)
    }

    /// See [`HistoryTables::history_coverage`].
    pub async fn history_coverage(
        &self,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<(String, i64, f64)>, StoreError> {
        Ok(self.history().history_coverage(from_ms, until_ms).await?)
    }

    /// See [`HistoryTables::history_minutes`].
    pub async fn history_minutes(
        &self,
        service: &str,
        bucket: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Vec<MinuteCounts>, StoreError> {
        Ok(self
            .history()
            .history_minutes(service, bucket, from_ms, until_ms)
            .await?)
    }

    /// See [`HistoryTables::history_written_until`].
    pub async fn history_written_until(&self) -> Result<Option<i64>, StoreError> {
        Ok(self.history().history_written_until().await?)
    }

    /// See [`HistoryTables::history_totals`].
    pub async fn history_totals(
        &self,
        service: &str,
        bucket: &str,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<HistoryTotals, StoreError> {
        Ok(self
            .history()
            .history_totals(service, bucket, from_ms, until_ms)
            .await?)
    }
}

/// Writes every slot `batches` hands over for `region` into the store's history until the
/// channel closes (see [`spillway_db::history::write_history_from`]).
pub async fn write_history_from(
    store: Store,
    region: String,
    batches: mpsc::Receiver<HistoryBatch>,
    retention: Duration,
) {
    spillway_db::history::write_history_from(store.history(), region, batches, retention).await;
}
