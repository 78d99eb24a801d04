//! The controllers' traffic history in the rules store (the configurator's `builtin:` source), on a real
//! SQLite file and a private PostgreSQL: slots written, added to when written again, read back
//! per minute and region, summed for a validation window, and pruned past their retention; and
//! the writer task, which keeps going when the store fails.

use std::time::Duration;

use crate::common::Db;
use spillway_core::history::{HistoryBatch, HistoryRow};
use spillway_rules::Store;
use spillway_rules::store::history::{HistoryTotals, write_history_from};

/// A row whose candidate would have dropped a tenth of what was offered.
fn row(bucket: &str, offered: u64, admitted: u64, shadow: u64) -> HistoryRow {
    HistoryRow {
        service: "api".into(),
        bucket: bucket.into(),
        offered,
        admitted,
        shadow_dropped: shadow,
        candidate_dropped: offered / 10,
    }
}

fn batch(start_ms: u64, rows: Vec<HistoryRow>) -> HistoryBatch {
    HistoryBatch {
        start_ms,
        seconds: 1.0,
        rows,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn slots_are_stored_added_to_read_per_minute_and_pruned(db: Db) {
    runtime().block_on(async {
        let store = Store::connect(&db.url()).await.unwrap();
        // Minute 1000 (60,000,000 ms): two seconds in region a, one in region b.
        let minute = 60_000_000;
        store
            .write_history(
                "a",
                &batch(minute, vec![row("all", 100, 90, 10), row("b", 3, 3, 0)]),
            )
            .await
            .unwrap();
        store
            .write_history("a", &batch(minute + 1000, vec![row("all", 50, 50, 0)]))
            .await
            .unwrap();
        store
            .write_history("b", &batch(minute, vec![row("all", 7, 7, 0)]))
            .await
            .unwrap();
        // A late report's slot comes again: added, not replaced.
        store
            .write_history("a", &batch(minute, vec![row("all", 20, 10, 10)]))
            .await
            .unwrap();
        // The next minute, region a only.
        store
            .write_history("a", &batch(minute + 60_000, vec![row("all", 60, 60, 0)]))
            .await
            .unwrap();

        let end = minute as i64 + 120_000;
        let series = store.history_series(0, end).await.unwrap();
        assert_eq!(
            series,
            vec![("api".into(), "all".into()), ("api".into(), "b".into())]
        );
        let coverage = store.history_coverage(0, end).await.unwrap();
        assert_eq!(
            coverage,
            vec![
                ("a".into(), 1000, 2.0),
                ("b".into(), 1000, 1.0),
                ("a".into(), 1001, 1.0)
            ]
        );
        let minutes = store.history_minutes("api", "all", 0, end).await.unwrap();
        let got: Vec<_> = minutes
            .iter()
            .map(|m| {
                (
                    m.region.as_str(),
                    m.minute,
                    m.offered,
                    m.admitted,
                    m.shadow_dropped,
                    m.candidate_dropped,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", 1000, 170, 150, 20, 17),
                ("b", 1000, 7, 7, 0, 0),
                ("a", 1001, 60, 60, 0, 6)
            ]
        );
        let totals = store
            .history_totals("api", "all", minute as i64, end)
            .await
            .unwrap();
        assert_eq!(
            totals,
            HistoryTotals {
                offered: 237,
                admitted: 217,
                shadow_dropped: 20,
                candidate_dropped: 23,
            }
        );
        let none = store
            .history_totals("api", "nothing", 0, end)
            .await
            .unwrap();
        assert_eq!(none, HistoryTotals::default());

        // Region b is furthest behind: its latest slot ends a second into the first minute.
        assert_eq!(
            store.history_written_until().await.unwrap(),
            Some(minute as i64 + 1000)
        );

        let deleted = store.prune_history(minute as i64 + 60_000).await.unwrap();
        assert_eq!(deleted, 4, "the first minute's rows");
        let series = store.history_series(0, end).await.unwrap();
        assert_eq!(series, vec![("api".into(), "all".into())]);
        assert_eq!(store.history_coverage(0, end).await.unwrap().len(), 1);
        assert_eq!(
            store.history_written_until().await.unwrap(),
            Some(minute as i64 + 61_000),
            "region a alone now"
        );
        store.close().await;
    });
}

#[test]
fn sqlite_slots_are_stored_added_to_read_per_minute_and_pruned() {
    slots_are_stored_added_to_read_per_minute_and_pruned(Db::sqlite());
}

#[test]
fn postgres_slots_are_stored_added_to_read_per_minute_and_pruned() {
    slots_are_stored_added_to_read_per_minute_and_pruned(Db::postgres());
}

#[test]
fn the_writer_stores_what_it_is_handed_and_outlives_a_store_that_fails() {
    let db = Db::postgres();
    runtime().block_on(async {
        let store = Store::connect(&db.url()).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let writer = tokio::spawn(write_history_from(
            store.clone(),
            "a".into(),
            rx,
            Duration::from_secs(3600),
        ));
        let now = spillway_rules::time::now_millis() as u64;
        tx.send(batch(now - 5000, vec![row("all", 5, 5, 0)]))
            .await
            .unwrap();
        let read = |store: Store| async move {
            store
                .history_totals("api", "all", 0, i64::MAX)
                .await
                .unwrap()
                .offered
        };
        for _ in 0..100 {
            if read(store.clone()).await == 5 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(read(store.clone()).await, 5);
        // A store whose pool is closed fails every write: the writer logs, loses the slot and
        // takes the next one.
        let closed = Store::connect(&db.url()).await.unwrap();
        let (tx2, rx2) = tokio::sync::mpsc::channel(4);
        closed.close().await;
        let failing = tokio::spawn(write_history_from(
            closed,
            "a".into(),
            rx2,
            Duration::from_secs(3600),
        ));
        tx2.send(batch(now - 4000, vec![row("all", 1, 1, 0)]))
            .await
            .unwrap();
        tx2.send(batch(now - 3000, vec![row("all", 1, 1, 0)]))
            .await
            .unwrap();
        drop(tx2);
        tokio::time::timeout(Duration::from_secs(10), failing)
            .await
            .expect("the failing writer ends when its channel does")
            .unwrap();
        tx.send(batch(now - 2000, vec![row("all", 2, 2, 0)]))
            .await
            .unwrap();
        drop(tx);
        writer.await.unwrap();
        assert_eq!(
            read(store.clone()).await,
            7,
            "the failing writer stored nothing"
        );
        store.close().await;
    });
}
