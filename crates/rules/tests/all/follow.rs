//! Following the store as the controller, `spillway up` and the demo do: every committed
//! change becomes a snapshot with the store's version and the consumer's own identity and control
//! sections, and a change that cannot be rendered leaves the rules in force.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Db, Service, eventually, rule, start};
use serde_json::json;
use spillway_core::config::ConfigFile;
use spillway_core::rules::RulesSnapshot;
use spillway_rules::RulesWatcher;
use tokio::sync::watch;

on_both!(
    snapshots_follow_every_change_with_the_base_sections,
    a_change_that_cannot_be_rendered_keeps_the_rules_in_force
);

/// A consumer's file: its identity and control sections differ from the defaults, and it has no
/// `redis` section, so a `store: redis` rule cannot run under it.
fn base() -> ConfigFile {
    yaml_serde::from_str(
        "version: 1\n\
         identity: { caller: header:x-caller }\n\
         control: { report_interval: 250ms, instruction_ttl: 3s }\n",
    )
    .expect("base file")
}

/// Waits until the followed snapshot reaches `version`.
fn snapshot_at(rules: &watch::Receiver<Arc<RulesSnapshot>>, version: u64) -> Arc<RulesSnapshot> {
    eventually(Duration::from_secs(10), || {
        let snapshot = rules.borrow().clone();
        (snapshot.version == version).then_some(snapshot)
    })
}

/// The snapshot's bucket names, in order.
fn buckets(snapshot: &RulesSnapshot) -> Vec<String> {
    snapshot
        .config
        .buckets()
        .map(|(_, b)| b.name.clone())
        .collect()
}

/// A rules service on `db` holding one rule (`gw-1`, version 1), and a follower of it with
/// [`base`]; the watcher must be held for as long as the rules are followed.
fn following(db: Db) -> (Service, RulesWatcher, watch::Receiver<Arc<RulesSnapshot>>) {
    let service = start(db);
    assert_eq!(service.create(&service.admin, &rule(1)).status, 201);
    let url = service.db.url();
    let (watcher, rules) = service.runtime.block_on(async {
        let watcher = RulesWatcher::start(&url).await.expect("watcher");
        let rules = spillway_rules::follow(&watcher, base()).expect("first snapshot");
        (watcher, rules)
    });
    (service, watcher, rules)
}

fn snapshots_follow_every_change_with_the_base_sections(db: Db) {
    let (service, _watcher, rules) = following(db);

    let first = rules.borrow().clone();
    assert_eq!(first.version, 1);
    let base = base();
    assert_eq!(first.config.identity, base.identity);
    assert_eq!(
        first.config.control.report_interval,
        Duration::from_millis(250)
    );
    assert_eq!(first.config.control.instruction_ttl, Duration::from_secs(3));
    assert_eq!(buckets(&first), ["gw-1"]);
    // What clients receive is the text the snapshot was validated from.
    assert!(first.yaml.contains("x-caller"), "{}", first.yaml);

    assert_eq!(service.create(&service.admin, &rule(2)).status, 201);
    let second = snapshot_at(&rules, 2);
    assert_eq!(buckets(&second), ["gw-1", "gw-2"]);
    assert_eq!(second.config.identity, base.identity);
}

fn a_change_that_cannot_be_rendered_keeps_the_rules_in_force(db: Db) {
    let (service, watcher, mut rules) = following(db);
    assert_eq!(rules.borrow_and_update().version, 1);

    // The store accepts a Redis rule (some consumer may have a `redis` section); this base does
    // not, so version 2 cannot be rendered with it.
    let mut redis = rule(2);
    redis["store"] = json!("redis");
    let created = service.create(&service.admin, &redis);
    assert_eq!(created.status, 201, "{}", created.body);
    eventually(Duration::from_secs(10), || {
        (watcher.current().version == 2).then_some(())
    });
    // The follower has seen version 2 by now or is about to: give it time to (not) publish.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!rules.has_changed().expect("follower running"));
    let kept = rules.borrow().clone();
    assert_eq!(kept.version, 1);
    assert_eq!(buckets(&kept), ["gw-1"]);

    // The follower goes on: removing the rule renders again, as version 3.
    let id = created.body["id"].as_str().expect("rule id");
    let deleted = service
        .client(&service.admin)
        .send("DELETE", &format!("/v1/rules/{id}"), None, None)
        .unwrap();
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    let third = snapshot_at(&rules, 3);
    assert_eq!(buckets(&third), ["gw-1"]);
}
