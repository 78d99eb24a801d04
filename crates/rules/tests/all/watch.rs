//! Propagation: a RulesWatcher sees every committed change, on PostgreSQL through
//! LISTEN/NOTIFY and on SQLite in-process, resyncs after PostgreSQL restarts, and drops an
//! incident override when its time is up even with no rules service running.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Db, eventually, rule, start};
use serde_json::json;
use spillway_rules::rule::parse_rule;
use spillway_rules::{Role, RulesWatcher, Store};

on_both!(
    watcher_follows_every_change,
    override_ends_in_the_watcher_by_itself
);

fn watcher_follows_every_change(db: Db) {
    let service = start(db);
    let url = service.db.url();
    let watcher = service
        .runtime
        .block_on(RulesWatcher::start(&url))
        .expect("watcher");
    assert_eq!(watcher.current().version, 0);
    assert!(watcher.current().config.services.is_empty());

    let created = service.create(&service.admin, &rule(1));
    assert_eq!(created.status, 201);
    let set = eventually(Duration::from_secs(10), || {
        let set = watcher.current();
        (set.version == 1).then_some(set)
    });
    assert_eq!(set.rules.len(), 1);
    let bucket = &set.config.service("api").unwrap().buckets[0];
    assert_eq!(bucket.name, "gw-1");
    assert_eq!(bucket.limit.per_second(), 100.0);
    assert!(set.config.redis.is_none());

    let id = created.body["id"].as_str().unwrap();
    let mut edit = rule(1);
    edit["limit"] = json!("5/s");
    let put = service
        .client(&service.admin)
        .send(
            "PUT",
            &format!("/v1/rules/{id}"),
            Some(&edit.to_string()),
            Some("1"),
        )
        .unwrap();
    assert_eq!(put.status, 200);
    let set = eventually(Duration::from_secs(10), || {
        let set = watcher.current();
        (set.version == 2).then_some(set)
    });
    assert_eq!(
        set.config.service("api").unwrap().buckets[0]
            .limit
            .per_second(),
        5.0
    );
}

fn override_ends_in_the_watcher_by_itself(db: Db) {
    // No rules service runs here, so nothing deletes the override: the watcher must stop
    // applying it when its time is up.
    let url = db.url();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let watcher = runtime.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        let (admin, _) = store.create_user("alice", Role::Admin).await.unwrap();
        let mut body = rule(1);
        body["ttl"] = json!("1s");
        body["reason"] = json!("incident 9");
        store
            .create_rule(&admin, parse_rule(body).unwrap())
            .await
            .unwrap();
        RulesWatcher::start(&url).await.unwrap()
    });
    assert_eq!(watcher.current().rules.len(), 1);
    let set = eventually(Duration::from_secs(10), || {
        let set = watcher.current();
        set.rules.is_empty().then_some(set)
    });
    assert_eq!(set.version, 1, "the override ended without a new version");
    assert!(set.config.services.is_empty());
    drop(watcher);
    drop(db);
}

#[test]
fn postgres_restart_misses_no_version() {
    let mut service = start(Db::postgres());
    let url = service.db.url();
    let (watcher, seen) = service.runtime.block_on(async {
        let watcher = RulesWatcher::start(&url).await.expect("watcher");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut updates = watcher.subscribe();
        let record = seen.clone();
        tokio::spawn(async move {
            while updates.changed().await.is_ok() {
                let version = updates.borrow_and_update().version;
                record.lock().unwrap().push(version);
            }
        });
        (watcher, seen)
    });
    assert_eq!(service.create(&service.admin, &rule(1)).status, 201);
    eventually(Duration::from_secs(10), || {
        (watcher.current().version == 1).then_some(())
    });

    let crate::common::Db::Postgres(pg) = &mut service.db else {
        unreachable!()
    };
    pg.restart().expect("PostgreSQL restarts");

    // Changes committed while the watcher may still be reconnecting: NOTIFY is not durable,
    // so only the resync by version can bring them.
    for n in 2..=3 {
        eventually(Duration::from_secs(30), || {
            (service.create(&service.admin, &rule(n)).status == 201).then_some(())
        });
    }
    let set = eventually(Duration::from_secs(15), || {
        let set = watcher.current();
        (set.version == 3).then_some(set)
    });
    let names: Vec<&str> = set.rules.iter().map(|r| r.bucket.name.as_str()).collect();
    assert_eq!(names, ["gw-1", "gw-2", "gw-3"]);

    // And the listener is back for the next change.
    // The store is back: the first request after it gets through, whatever the restart did to
    // the connections the pool held.
    let created = service.create(&service.admin, &rule(4));
    assert_eq!(created.status, 201, "{created:?}");
    eventually(Duration::from_secs(10), || {
        (watcher.current().version == 4).then_some(())
    });
    // The subscriber task records what it saw on its own thread; give it the moment it needs
    // to record the version the watcher already holds.
    let seen = eventually(Duration::from_secs(10), || {
        let seen = seen.lock().unwrap().clone();
        (seen.last() == Some(&4)).then_some(seen)
    });
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "versions {seen:?}");
}
