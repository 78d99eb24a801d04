//! The controllers' lease: which controller of a region leads, kept in a database every
//! deployment already has (the rules service's PostgreSQL, or an SQLite file on one machine).
//!
//! One row per region ([`LeaseStore::claim`]): a controller takes the lease when it is free or
//! lapsed and renews it while it holds it, in one statement, so two claims can never both win.
//! Each takeover raises the row's epoch. [`campaign`] claims every quarter of the TTL and
//! publishes the outcome as a [`Leadership`] for the controller to follow.
//!
//! A standby claims only a lease it watched unchanged for a whole TTL on its own clock (or one
//! that is free or released), so the controllers' clocks need not agree and a leader whose
//! renewals could not reach a store that was down is not overtaken when the store is back.
//!
//! Worked example, with a TTL of 3 s: the leader renews at 0.00, 0.75, 1.50 s... and may instruct
//! until 3 s after it last *asked*; killed at 1.6 s, its last renewal (1.5 s) is seen by a
//! standby reading every 0.75 s by 2.25 s, which takes the lease, at epoch + 1, 3 s after that:
//! by 5.25 s, and at the latest a period later (6 s).
//!
//! When the store does not answer, a leader keeps leading (it cannot tell a store that is down
//! from one that is slow, and nobody else can take the lease from a store that is down), a
//! standby stays one: a lost store degrades to "keep the last leader", never to none, and the
//! store never grants the lease twice.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use spillway_core::leadership::Leadership;
use sqlx::{AnyPool, Row};
use tokio::sync::watch;

use crate::DbError;

/// A region's lease as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub holder: String,
    /// Where the holder takes aggregators' streams.
    pub address: String,
    pub epoch: u64,
    /// When it lapses unless renewed, Unix milliseconds of the holder's clock.
    pub expires_at_ms: u64,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The claimant holds the lease at this epoch: it took it (a new epoch) or renewed it.
    Held { epoch: u64 },
    /// Another controller holds a lease that has not lapsed.
    Taken(LeaseRow),
}

/// The lease table of one database.
#[derive(Clone)]
pub struct LeaseStore {
    pool: AnyPool,
}

impl std::fmt::Debug for LeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseStore").finish_non_exhaustive()
    }
}

fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// The wall clock, Unix milliseconds.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl LeaseStore {
    /// Opens (creating and migrating when needed) the database at `url` (`sqlite:PATH` or
    /// `postgres://...`) for its lease; a call waits at most `wait` for a connection, so a
    /// store that is down answers within a claim's period.
    pub async fn open(url: &str, wait: Duration) -> Result<Self, DbError> {
        let (pool, _, _) = crate::open_with(url, Some(wait)).await?;
        Ok(Self { pool })
    }

    /// Takes or renews `region`'s lease for `holder` (advertising `address`) until
    /// `now_ms + ttl`, unless another holder's lease is still valid at `now_ms`. A takeover,
    /// and a renewal of a lease that had lapsed, is a new epoch.
    pub async fn claim(
        &self,
        region: &str,
        holder: &str,
        address: &str,
        ttl: Duration,
        now_ms: u64,
    ) -> Result<Claim, DbError> {
        let expires = signed(now_ms.saturating_add(u64::try_from(ttl.as_millis()).unwrap_or(0)));
        let now = signed(now_ms);
        let held = sqlx::query(
            "INSERT INTO controller_leases (region, holder, address, epoch, expires_at_ms) \
             VALUES ($1, $2, $3, 1, $4) \
             ON CONFLICT (region) DO UPDATE SET \
             epoch = CASE WHEN controller_leases.holder = excluded.holder \
             AND controller_leases.expires_at_ms > $5 \
             THEN controller_leases.epoch ELSE controller_leases.epoch + 1 END, \
             holder = excluded.holder, address = excluded.address, \
             expires_at_ms = excluded.expires_at_ms \
             WHERE controller_leases.holder = excluded.holder \
             OR controller_leases.expires_at_ms <= $6 \
             RETURNING epoch",
        )
        .bind(region)
        .bind(holder)
        .bind(address)
        .bind(expires)
        .bind(now)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = held {
            return Ok(Claim::Held {
                epoch: unsigned(row.try_get("epoch")?),
            });
        }
        match self.read(region).await? {
            Some(row) => Ok(Claim::Taken(row)),
            // Deleted between the two statements by hand: the next claim takes it.
            None => Err(DbError::Database(sqlx::Error::RowNotFound)),
        }
    }

    /// `region`'s lease as stored, if anyone ever held it.
    pub async fn read(&self, region: &str) -> Result<Option<LeaseRow>, DbError> {
        let row = sqlx::query(
            "SELECT holder, address, epoch, expires_at_ms FROM controller_leases \
             WHERE region = $1",
        )
        .bind(region)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|row| {
            Ok(LeaseRow {
                holder: row.try_get("holder")?,
                address: row.try_get("address")?,
                epoch: unsigned(row.try_get("epoch")?),
                expires_at_ms: unsigned(row.try_get("expires_at_ms")?),
            })
        })
        .transpose()
    }

    /// Gives `region`'s lease up if `holder` has it, so a standby takes it at its next claim
    /// rather than after the TTL (a controller that stops on SIGTERM).
    pub async fn release(&self, region: &str, holder: &str) -> Result<(), DbError> {
        sqlx::query(
            "UPDATE controller_leases SET expires_at_ms = 0 WHERE region = $1 AND holder = $2",
        )
        .bind(region)
        .bind(holder)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// What a controller campaigns for: its region's lease, under a name of its own.
#[derive(Debug, Clone)]
pub struct LeaseCandidate {
    pub region: String,
    /// Unique to this process ([`LeaseCandidate::new`] draws one).
    pub holder: String,
    /// Where this controller takes aggregators' streams, for the standbys to point them to.
    pub address: String,
    pub ttl: Duration,
}

impl LeaseCandidate {
    /// A candidate for `region`'s lease, advertising `address`, under a name drawn for this
    /// process (its id and a random number: a restarted controller is a new holder).
    pub fn new(region: impl Into<String>, address: impl Into<String>, ttl: Duration) -> Self {
        let mut random = RandomState::new().build_hasher();
        random.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Self {
            region: region.into(),
            holder: format!("{}-{:016x}", std::process::id(), random.finish()),
            address: address.into(),
            ttl,
        }
    }

    /// How often it claims: four times per TTL, so a leader renews three times before its
    /// lease could lapse and a standby takes a lapsed one within a quarter of the TTL.
    pub fn period(&self) -> Duration {
        (self.ttl / 4).max(Duration::from_millis(10))
    }
}

/// What the next [`Leadership`] is after a claim asked at `asked` answered `outcome`.
pub fn next_leadership(
    current: &Leadership,
    outcome: Result<Claim, ()>,
    asked: Instant,
    ttl: Duration,
) -> Leadership {
    match outcome {
        Ok(Claim::Held { epoch }) => Leadership {
            epoch,
            until: Some(asked + ttl),
            leader_url: None,
        },
        Ok(Claim::Taken(row)) => Leadership {
            epoch: row.epoch,
            until: None,
            leader_url: Some(row.address),
        },
        // Keep the last leader: one that cannot reach the store leads on, a standby waits.
        Err(()) if current.is_leader() => Leadership {
            until: Some(asked + ttl),
            ..current.clone()
        },
        Err(()) => current.clone(),
    }
}

/// Claims `candidate`'s lease every [`LeaseCandidate::period`] until `stop` turns true, publishing
/// each change of leadership (and logging it); on stop, a leader releases its lease. The
/// receiver starts as a standby's.
pub fn campaign(
    store: LeaseStore,
    candidate: LeaseCandidate,
    mut stop: watch::Receiver<bool>,
) -> (watch::Receiver<Leadership>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Leadership::standby());
    let task = tokio::spawn(async move {
        let period = candidate.period();
        let mut store_down = false;
        let mut watch = Observed::default();
        loop {
            let asked = Instant::now();
            let leads = tx.borrow().is_leader();
            let answer = tokio::time::timeout(period, async {
                if !leads
                    && let Some(row) = store.read(&candidate.region).await?
                    && !watch.may_claim(&row, &candidate, asked)
                {
                    return Ok(Claim::Taken(row));
                }
                store
                    .claim(
                        &candidate.region,
                        &candidate.holder,
                        &candidate.address,
                        candidate.ttl,
                        now_ms(),
                    )
                    .await
            })
            .await;
            if !matches!(answer, Ok(Ok(_))) {
                // After an outage the standbys watch the lease afresh: the leader renews it
                // within a period of the store's return, long before they would take it.
                watch = Observed::default();
            }
            let outcome = match answer {
                Ok(Ok(claim)) => {
                    if store_down {
                        tracing::info!(region = %candidate.region, "lease store answers again");
                        store_down = false;
                    }
                    Ok(claim)
                }
                Ok(Err(err)) => {
                    if !store_down {
                        tracing::warn!(region = %candidate.region, "lease store unreachable, keeping the last leader: {err}");
                    }
                    store_down = true;
                    Err(())
                }
                Err(_) => {
                    if !store_down {
                        tracing::warn!(region = %candidate.region, wait_ms = period.as_millis() as u64, "lease store did not answer in time, keeping the last leader");
                    }
                    store_down = true;
                    Err(())
                }
            };
            let current = tx.borrow().clone();
            let next = next_leadership(&current, outcome, asked, candidate.ttl);
            log_transition(&candidate, &current, &next);
            if next != current {
                tx.send_replace(next);
            }
            let wait = period.saturating_sub(asked.elapsed());
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => break,
            }
            if *stop.borrow() {
                break;
            }
        }
        if tx.borrow().is_leader() {
            // Stopped first: nothing of this controller instructs any more.
            tx.send_replace(Leadership::standby());
            let released =
                tokio::time::timeout(period, store.release(&candidate.region, &candidate.holder))
                    .await;
            match released {
                Ok(Ok(())) => {
                    tracing::info!(region = %candidate.region, "controller lease released")
                }
                _ => {
                    tracing::warn!(region = %candidate.region, "could not release the controller lease; a standby takes it when it lapses")
                }
            }
        }
    });
    (rx, task)
}

/// A standby's view of the lease row, on its own monotonic clock: it claims a lease only once
/// it saw the row unchanged for a whole TTL (or free, or released), whatever the row's expiry
/// says in the holder's wall clock. So a leader whose renewals did not reach a store that was
/// down is not overtaken the moment the store is back, and the clocks of the controllers need
/// not agree.
#[derive(Debug, Default)]
struct Observed {
    row: Option<LeaseRow>,
    since: Option<Instant>,
}

impl Observed {
    fn may_claim(&mut self, row: &LeaseRow, candidate: &LeaseCandidate, now: Instant) -> bool {
        if row.holder == candidate.holder || row.expires_at_ms == 0 {
            return true;
        }
        if self.row.as_ref() != Some(row) {
            self.row = Some(row.clone());
            self.since = Some(now);
        }
        self.since
            .is_some_and(|since| now.saturating_duration_since(since) >= candidate.ttl)
    }
}

/// One log line per change of role (and per new leader seen by a standby).
fn log_transition(candidate: &LeaseCandidate, current: &Leadership, next: &Leadership) {
    let region = &candidate.region;
    match (current.is_leader(), next.is_leader()) {
        (false, true) => {
            tracing::info!(%region, epoch = next.epoch, holder = %candidate.holder, "controller lease taken: leading")
        }
        (true, false) => tracing::warn!(
            %region,
            epoch = next.epoch,
            leader = next.leader_url.as_deref().unwrap_or("unknown"),
            "controller lease lost to another controller: standing by"
        ),
        (true, true) if next.epoch != current.epoch => {
            tracing::warn!(%region, epoch = next.epoch, "controller lease lapsed and taken again: leading at a new epoch")
        }
        (false, false) if next.epoch != current.epoch || next.leader_url != current.leader_url => {
            tracing::info!(
                %region,
                epoch = next.epoch,
                leader = next.leader_url.as_deref().unwrap_or("unknown"),
                "standing by for the leader"
            )
        }
        _ => {}
    }
}
