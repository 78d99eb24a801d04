//! The controllers' lease on real stores: an SQLite file and a private PostgreSQL. One holder at
//! a time, epochs that only grow, a lapsed or released lease taken over, and a store that stops
//! answering keeping the last leader.

use std::time::{Duration, Instant};

use spillway_core::leadership::Leadership;
use spillway_db::lease::{Claim, LeaseCandidate, LeaseStore, campaign, next_leadership};
use spillway_testkit::Postgres;
use tokio::sync::watch;

const TTL: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(2);

async fn sqlite() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("lease.db").display());
    (dir, url)
}

/// Two holders on one store, on a clock the test moves: the second waits while the first
/// renews, takes over at a new epoch once the lease lapsed, and the first then finds it taken.
async fn takeover_on(url: &str) {
    let store = LeaseStore::open(url, WAIT).await.unwrap();
    let t = 1_000_000;
    assert_eq!(
        store
            .claim("eu", "a", "http://a:7001", TTL, t)
            .await
            .unwrap(),
        Claim::Held { epoch: 1 }
    );
    match store
        .claim("eu", "b", "http://b:7001", TTL, t + 1)
        .await
        .unwrap()
    {
        Claim::Taken(row) => {
            assert_eq!(row.holder, "a");
            assert_eq!(row.address, "http://a:7001");
            assert_eq!(row.epoch, 1);
            assert_eq!(row.expires_at_ms, t + 3_000);
        }
        other => panic!("b must find a's lease, got {other:?}"),
    }
    // a renews within its lease: the same epoch, a later expiry.
    assert_eq!(
        store
            .claim("eu", "a", "http://a:7001", TTL, t + 2_000)
            .await
            .unwrap(),
        Claim::Held { epoch: 1 }
    );
    assert!(matches!(
        store
            .claim("eu", "b", "http://b:7001", TTL, t + 4_999)
            .await
            .unwrap(),
        Claim::Taken(_)
    ));
    // a fell silent: its lease lapsed at t + 5,000.
    assert_eq!(
        store
            .claim("eu", "b", "http://b:7001", TTL, t + 5_000)
            .await
            .unwrap(),
        Claim::Held { epoch: 2 }
    );
    match store
        .claim("eu", "a", "http://a:7001", TTL, t + 5_001)
        .await
        .unwrap()
    {
        Claim::Taken(row) => assert_eq!((row.holder.as_str(), row.epoch), ("b", 2)),
        other => panic!("a must find b's lease, got {other:?}"),
    }
    // Another region's lease is a row of its own.
    assert_eq!(
        store
            .claim("us", "a", "http://a:7001", TTL, t + 5_001)
            .await
            .unwrap(),
        Claim::Held { epoch: 1 }
    );
    // b lets its lease lapse and takes it again: a new epoch all the same, since another
    // holder could have had it in between.
    assert_eq!(
        store
            .claim("eu", "b", "http://b:7001", TTL, t + 9_000)
            .await
            .unwrap(),
        Claim::Held { epoch: 3 }
    );
    // Released: a takes it at once, without waiting for the TTL.
    store.release("eu", "b").await.unwrap();
    assert_eq!(
        store
            .claim("eu", "a", "http://a:7001", TTL, t + 9_001)
            .await
            .unwrap(),
        Claim::Held { epoch: 4 }
    );
    // Releasing a lease one does not hold changes nothing.
    store.release("eu", "b").await.unwrap();
    assert_eq!(store.read("eu").await.unwrap().unwrap().holder, "a");
    store.close().await;
}

#[tokio::test]
async fn a_lapsed_lease_is_taken_over_at_a_new_epoch_on_sqlite() {
    let (_dir, url) = sqlite().await;
    takeover_on(&url).await;
}

#[tokio::test]
async fn a_lapsed_lease_is_taken_over_at_a_new_epoch_on_postgres() {
    let pg = Postgres::start().expect("start a private PostgreSQL");
    takeover_on(&pg.url()).await;
}

/// Many claims at the same instant, each on a connection of its own: exactly one wins.
async fn one_winner_on(url: &str) {
    let store = LeaseStore::open(url, Duration::from_secs(30))
        .await
        .unwrap();
    let claims = (0..8).map(|i| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .claim("eu", &format!("c{i}"), "http://x:7001", TTL, 5_000)
                .await
                .unwrap()
        })
    });
    let mut held = 0;
    for claim in claims {
        held += usize::from(matches!(claim.await.unwrap(), Claim::Held { epoch: 1 }));
    }
    assert_eq!(
        held, 1,
        "exactly one of eight simultaneous claims holds the lease"
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_claims_have_one_winner_on_postgres() {
    let pg = Postgres::start().expect("start a private PostgreSQL");
    one_winner_on(&pg.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_claims_have_one_winner_on_sqlite() {
    let (_dir, url) = sqlite().await;
    one_winner_on(&url).await;
}

#[test]
fn a_store_that_does_not_answer_keeps_the_last_leader() {
    let asked = Instant::now();
    let leader = Leadership {
        epoch: 4,
        until: Some(asked),
        leader_url: None,
    };
    let kept = next_leadership(&leader, Err(()), asked, TTL);
    assert_eq!(kept.epoch, 4);
    assert!(kept.leads_at(asked + TTL - Duration::from_millis(1)));
    let standby = Leadership {
        epoch: 4,
        until: None,
        leader_url: Some("http://a:7001".into()),
    };
    assert_eq!(next_leadership(&standby, Err(()), asked, TTL), standby);
    // A store that answers again decides: here another holder had taken the lease.
    let taken = next_leadership(
        &kept,
        Ok(Claim::Taken(spillway_db::lease::LeaseRow {
            holder: "b".into(),
            address: "http://b:7001".into(),
            epoch: 5,
            expires_at_ms: 0,
        })),
        asked,
        TTL,
    );
    assert!(!taken.is_leader());
    assert_eq!(taken.epoch, 5);
    assert_eq!(taken.leader_url.as_deref(), Some("http://b:7001"));
}

/// Two campaigns on one SQLite file: one leads, the other stands by naming it; the leader
/// stops (releasing its lease) and the standby leads at the next epoch within a few periods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_leads_once_the_leader_stops() {
    let (_dir, url) = sqlite().await;
    let ttl = Duration::from_millis(400);
    let open = || LeaseStore::open(&url, WAIT);
    let (stop_a, stop_a_rx) = watch::channel(false);
    let (stop_b, stop_b_rx) = watch::channel(false);
    let (mut a, task_a) = campaign(
        open().await.unwrap(),
        LeaseCandidate::new("eu", "http://a:7001", ttl),
        stop_a_rx,
    );
    wait_for(&mut a, |l| l.is_leader()).await;
    let first = a.borrow().epoch;
    let (mut b, task_b) = campaign(
        open().await.unwrap(),
        LeaseCandidate::new("eu", "http://b:7001", ttl),
        stop_b_rx,
    );
    wait_for(&mut b, |l| l.leader_url.is_some()).await;
    assert!(!b.borrow().is_leader());
    assert_eq!(b.borrow().leader_url.as_deref(), Some("http://a:7001"));
    stop_a.send_replace(true);
    task_a.await.unwrap();
    assert!(!a.borrow().is_leader(), "a stopped leader no longer leads");
    let started = Instant::now();
    wait_for(&mut b, |l| l.is_leader()).await;
    assert!(b.borrow().epoch > first, "a takeover is a new epoch");
    // Released, not lapsed: taken within a period or two, well before the TTL.
    assert!(started.elapsed() < ttl, "took {:?}", started.elapsed());
    stop_b.send_replace(true);
    task_b.await.unwrap();
}

async fn wait_for(rx: &mut watch::Receiver<Leadership>, ok: impl Fn(&Leadership) -> bool) {
    tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|l| ok(l)))
        .await
        .expect("leadership within 10 s")
        .unwrap();
}
