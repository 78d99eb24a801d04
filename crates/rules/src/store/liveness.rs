//! Whether the database answers, as a probe in the background last found, so that `/readyz`,
//! `/metrics` and the API learn it without waiting on the database themselves.
//!
//! The probe reads the rules version every [`PROBE_EVERY`] on a connection of its own, outside
//! the pool: a pool busy with queued writers (SQLite's wait on its write lock) is not a database
//! that is down. A read that fails or takes longer than [`PROBE_TIMEOUT`] marks the database
//! down; the next one that succeeds marks it up again. PostgreSQL stopped: the next probe, at
//! most 250 ms later, is refused at once, and from then on the API answers 503 without touching
//! the pool. Started again: the first probe after the server accepts connections, at most
//! 250 ms later, marks it up.
//!
//! The log says each change once (down with the error, up with how long it was down and how
//! many requests failed meanwhile); requests that fail on the store while it is up are counted
//! and told in one line per [`SUMMARY_EVERY`], never one line per request.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection, Executor};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use super::StoreError;

/// How often the probe reads the database.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);
/// How long a probe may take, connecting included, before the database counts as down.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Requests that failed on a store that is up are told at most once per this long.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);
/// The `retry-after` (seconds) of an answer that the store is unavailable: by then the probe
/// has looked four times.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The database's liveness, shared by every clone of a [`Store`](super::Store).
pub struct Liveness {
    /// The flag: `true` while the database answers. A watch channel, so that requests waiting
    /// on the database can be released the moment it is found down.
    up: watch::Sender<bool>,
    state: Mutex<State>,
}

struct State {
    /// When `up` last changed, or the store was opened.
    since: Instant,
    /// Why the database is down, while it is.
    error: Option<String>,
    /// The rules version the last successful probe read.
    version: Option<i64>,
    /// Failed requests not yet told: since the last summary while up, since the database went
    /// down while down.
    failed: u64,
    last_failure: Option<String>,
    summarised: Instant,
}

/// A change of the database's liveness, to be logged once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transition {
    Down { error: String },
    Up { down_for: Duration, failed: u64 },
}

/// Requests that failed on a store that is up, over the last [`SUMMARY_EVERY`] or so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) failed: u64,
    pub(crate) last: String,
}

impl Liveness {
    /// A database found up at `now`, at rules version `version`.
    pub(crate) fn new(version: i64, now: Instant) -> Self {
        Liveness {
            up: watch::Sender::new(true),
            state: Mutex::new(State {
                since: now,
                error: None,
                version: Some(version),
                failed: 0,
                last_failure: None,
                summarised: now,
            }),
        }
    }

    /// Whether the last probe found the database answering.
    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// The rules version the last successful probe read.
    pub fn version(&self) -> Option<i64> {
        self.state().version
    }

    /// Why a request cannot be served now, while the database is down.
    pub fn unavailable(&self) -> Option<StoreError> {
        let state = self.state();
        if self.is_up() {
            return None;
        }
        Some(StoreError::Unavailable {
            down_for: state.since.elapsed(),
            error: state.error.clone().unwrap_or_default(),
        })
    }

    /// Resolves once the database is found down (at once if it is), with the reason.
    pub async fn gone_down(&self) -> StoreError {
        let mut up = self.up.subscribe();
        if up.wait_for(|up| !*up).await.is_err() {
            // The sender lives as long as `self`: this cannot happen, but if it did the
            // database would never be found down.
            std::future::pending::<()>().await;
        }
        self.unavailable()
            .unwrap_or_else(|| StoreError::Unavailable {
                down_for: Duration::ZERO,
                error: String::new(),
            })
    }

    /// A modification of this process committed `version`: the gauge need not wait for the
    /// next probe. Commits may report out of order, so only a newer version counts.
    pub(crate) fn committed(&self, version: i64) {
        let mut state = self.state();
        state.version = Some(state.version.map_or(version, |v| v.max(version)));
    }

    /// Counts a request (or background task) that failed on the store, for the next summary.
    pub(crate) fn note_failure(&self, what: &str) {
        let mut state = self.state();
        state.failed += 1;
        state.last_failure = Some(what.to_owned());
    }

    /// What one probe found at `now`: the rules version, or why it got none.
    pub(crate) fn record(&self, found: Result<i64, String>, now: Instant) -> Option<Transition> {
        let mut state = self.state();
        let was_up = self.is_up();
        let transition = match found {
            Ok(version) => {
                state.version = Some(version);
                if was_up {
                    return None;
                }
                let down_for = now.saturating_duration_since(state.since);
                let failed = std::mem::take(&mut state.failed);
                state.error = None;
                state.last_failure = None;
                state.summarised = now;
                Transition::Up { down_for, failed }
            }
            Err(error) => {
                if !was_up {
                    state.error = Some(error);
                    return None;
                }
                // Failures not yet told are the outage's first: the "up" line counts them.
                state.error = Some(error.clone());
                Transition::Down { error }
            }
        };
        state.since = now;
        self.up
            .send_replace(matches!(transition, Transition::Up { .. }));
        Some(transition)
    }

    /// The failures to tell at `now`, if the store is up, some failed, and the last summary is
    /// [`SUMMARY_EVERY`] old.
    pub(crate) fn summary(&self, now: Instant) -> Option<Summary> {
        let mut state = self.state();
        if !self.is_up()
            || state.failed == 0
            || now.saturating_duration_since(state.summarised) < SUMMARY_EVERY
        {
            return None;
        }
        state.summarised = now;
        Some(Summary {
            failed: std::mem::take(&mut state.failed),
            last: state.last_failure.take().unwrap_or_default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a few plain fields, whole after any panic.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Probes the database at `url` every [`PROBE_EVERY`], forever, recording into `liveness` and
/// logging each transition and summary.
pub(super) async fn probe(liveness: &Liveness, url: &str) {
    let mut conn: Option<AnyConnection> = None;
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let read = async {
            match read_version(&mut conn, url).await {
                // The database closed the probe's session: it restarted between two probes,
                // or an administrator ended every session, the one the probe had just opened
                // included. That is no outage, so ask once more on a fresh connection; a
                // database that is down refuses that one too.
                Err(err) if super::is_broken_connection(&err) => {
                    conn = None;
                    read_version(&mut conn, url).await
                }
                other => other,
            }
        };
        let found = match tokio::time::timeout(PROBE_TIMEOUT, read).await {
            Ok(Ok(version)) => Ok(version),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => Err(format!("no answer within {} ms", PROBE_TIMEOUT.as_millis())),
        };
        if found.is_err() {
            // Broken, or left half-way through a read: the next probe connects afresh.
            conn = None;
        }
        let now = Instant::now();
        match liveness.record(found, now) {
            Some(Transition::Down { error }) => tracing::warn!(
                %error,
                "rules store down: the database does not answer; the API answers 503 until it does"
            ),
            Some(Transition::Up { down_for, failed }) => tracing::info!(
                down_for = %format!("{:.1}s", down_for.as_secs_f64()),
                failed_requests = failed,
                "rules store up again"
            ),
            None => {}
        }
        if let Some(Summary { failed, last }) = liveness.summary(now) {
            tracing::warn!(
                failed,
                last_error = %last,
                "rules store errors since the last report, the database answering its probe"
            );
        }
    }
}

async fn read_version(conn: &mut Option<AnyConnection>, url: &str) -> Result<i64, sqlx::Error> {
    let conn = match conn {
        Some(conn) => conn,
        None => {
            let mut fresh = AnyConnection::connect(url).await?;
            if url.starts_with("sqlite:") {
                // A read in WAL mode waits for no writer; should a checkpoint hold it up even
                // so, wait for that rather than call the file down.
                fresh.execute("PRAGMA busy_timeout = 250").await?;
            }
            conn.insert(fresh)
        }
    };
    sqlx::query_scalar("SELECT version FROM rules_version WHERE id = 1")
        .fetch_one(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_failed_probe_marks_it_down_once_and_a_good_one_up_with_the_outage() {
        let t0 = Instant::now();
        let live = Liveness::new(7, t0);
        assert!(live.is_up() && live.unavailable().is_none());
        assert_eq!(live.record(Ok(8), t0 + 250 * MS), None);
        assert_eq!(live.version(), Some(8));

        let down = live.record(Err("connection refused".into()), t0 + 500 * MS);
        assert_eq!(
            down,
            Some(Transition::Down {
                error: "connection refused".into()
            })
        );
        assert!(!live.is_up());
        // Still down: nothing more to tell, however many probes fail.
        assert_eq!(
            live.record(Err("connection refused".into()), t0 + 750 * MS),
            None
        );
        assert_eq!(live.record(Err("timed out".into()), t0 + 1000 * MS), None);
        let err = live.unavailable().expect("down");
        assert!(err.to_string().contains("timed out"), "{err}");
        live.note_failure("pool timed out");
        live.note_failure("pool timed out");
        // The version read last stays, for /metrics.
        assert_eq!(live.version(), Some(8));

        let up = live.record(Ok(8), t0 + 3500 * MS);
        assert_eq!(
            up,
            Some(Transition::Up {
                down_for: 3000 * MS,
                failed: 2
            })
        );
        assert!(live.is_up() && live.unavailable().is_none());
        assert_eq!(live.record(Ok(9), t0 + 3750 * MS), None);
    }

    #[test]
    fn failures_while_up_are_told_once_per_interval() {
        let t0 = Instant::now();
        let live = Liveness::new(1, t0);
        assert_eq!(live.summary(t0 + SUMMARY_EVERY), None, "nothing failed");
        live.note_failure("a");
        live.note_failure("b");
        assert_eq!(live.summary(t0 + SUMMARY_EVERY - MS), None, "too soon");
        assert_eq!(
            live.summary(t0 + SUMMARY_EVERY),
            Some(Summary {
                failed: 2,
                last: "b".into()
            })
        );
        live.note_failure("c");
        assert_eq!(live.summary(t0 + SUMMARY_EVERY + 5 * MS), None);
        assert_eq!(
            live.summary(t0 + 2 * SUMMARY_EVERY),
            Some(Summary {
                failed: 1,
                last: "c".into()
            })
        );
    }

    #[test]
    fn failures_before_an_outage_is_seen_are_counted_in_it_and_not_summarised() {
        let t0 = Instant::now();
        let live = Liveness::new(1, t0);
        live.note_failure("pool timed out");
        live.record(Err("refused".into()), t0 + 20 * SUMMARY_EVERY);
        assert_eq!(
            live.summary(t0 + 20 * SUMMARY_EVERY),
            None,
            "down: no summary"
        );
        live.note_failure("down");
        assert_eq!(
            live.record(Ok(1), t0 + 21 * SUMMARY_EVERY),
            Some(Transition::Up {
                down_for: SUMMARY_EVERY,
                failed: 2
            })
        );
        assert_eq!(
            live.summary(t0 + 22 * SUMMARY_EVERY),
            None,
            "told in the up line"
        );
    }

    #[tokio::test]
    async fn a_waiter_is_released_when_the_database_goes_down() {
        let t0 = Instant::now();
        let live = std::sync::Arc::new(Liveness::new(1, t0));
        let waiter = tokio::spawn({
            let live = live.clone();
            async move { live.gone_down().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        live.record(Err("refused".into()), Instant::now());
        let err = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("released")
            .unwrap();
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err}");
        // Already down: at once.
        let again = tokio::time::timeout(Duration::from_secs(5), live.gone_down()).await;
        assert!(again.is_ok());
    }
}
