//! Worked examples of `plan`: what an apply creates, updates, deletes and leaves alone.

use serde_json::{Value, json};

use super::*;
use crate::rule::input_of;

/// A bucket of a configuration file, as `POST /v1/rules:apply` receives it.
fn want(service: &str, bucket: Value) -> RuleInput {
    input_of(service.to_owned(), serde_json::from_value(bucket).unwrap()).unwrap()
}

/// A stored permanent rule.
fn stored(id: &str, service: &str, bucket: Value) -> Rule {
    Rule {
        id: id.to_owned(),
        service: service.to_owned(),
        bucket: serde_json::from_value(bucket).unwrap(),
        expires_at: None,
        reason: None,
        version: 3,
        created_by: "alice".to_owned(),
        created_at: 1_700_000_000_000,
        updated_at: 1_700_000_000_000,
    }
}

/// A stored incident override, ending at `expires_at` (Unix milliseconds).
fn override_(id: &str, service: &str, bucket: Value, expires_at: i64) -> Rule {
    Rule {
        expires_at: Some(expires_at),
        reason: Some("incident 7".to_owned()),
        ..stored(id, service, bucket)
    }
}

/// Which (service, name) each step touches, and how, in the order `apply` carries them out.
fn outline(steps: &[Step<'_>]) -> Vec<String> {
    steps
        .iter()
        .map(|step| match step {
            Step::Create(input) => format!("create {}/{}", input.service, input.bucket.name),
            Step::Update(old, input) => {
                assert_eq!(
                    (&old.service, &old.bucket.name),
                    (&input.service, &input.bucket.name),
                    "an update replaces the rule of the same (service, name)"
                );
                format!("update {}/{} ({})", old.service, old.bucket.name, old.id)
            }
            Step::Delete(old) => format!("delete {}/{} ({})", old.service, old.bucket.name, old.id),
        })
        .collect()
}

#[test]
fn an_empty_store_creates_every_wanted_rule_as_proposed_json() {
    let wanted = [
        want("api", json!({ "name": "all", "limit": "9/s" })),
        want(
            "payments",
            json!({ "name": "charge", "match": { "user": "*" }, "limit": "300/min", "algorithm": "sliding-window-log" }),
        ),
    ];
    let (diff, steps) = plan(&[], &wanted);
    assert_eq!(
        outline(&steps),
        ["create api/all", "create payments/charge"]
    );
    assert!(matches!(steps[0], Step::Create(input) if std::ptr::eq(input, &wanted[0])));
    // A proposed rule is its bucket, defaults written out, plus its service; no id or version
    // yet, since only the store gives those.
    assert_eq!(
        diff.created,
        [
            json!({
                "service": "api", "name": "all", "match": {}, "limit": "9/s",
                "scope": "global", "mode": "enforce", "algorithm": "drop-ratio", "cost": 1,
            }),
            json!({
                "service": "payments", "name": "charge", "match": { "user": "*" },
                "limit": "300/min", "scope": "global", "mode": "enforce",
                "algorithm": "sliding-window-log", "cost": 1,
            }),
        ]
    );
    assert_eq!(
        (diff.updated.len(), diff.deleted.len(), diff.unchanged),
        (0, 0, 0)
    );
    assert_eq!(
        (diff.version, diff.dry_run),
        (0, false),
        "left to the caller"
    );
    assert!(!diff.is_empty());
}

#[test]
fn the_same_configuration_again_changes_nothing() {
    let rules = [
        stored("r1", "api", json!({ "name": "all", "limit": "9/s" })),
        stored(
            "r2",
            "api",
            json!({ "name": "gw", "match": { "caller": "gw-1" }, "limit": "50/s" }),
        ),
    ];
    let wanted = [
        want(
            "api",
            json!({ "name": "gw", "match": { "caller": "gw-1" }, "limit": "50/s" }),
        ),
        want("api", json!({ "name": "all", "limit": "9/s" })),
    ];
    let (diff, steps) = plan(&rules, &wanted);
    assert!(steps.is_empty());
    assert!(diff.is_empty(), "{diff:?}");
    assert_eq!(diff.unchanged, 2);
}

#[test]
fn buckets_are_compared_by_meaning_not_by_spelling() {
    // "10 per 1s" and "10/s" parse to the same limit: ten requests a second.
    let rules = [stored(
        "r1",
        "api",
        json!({ "name": "all", "limit": "10 per 1s" }),
    )];
    let wanted = [want("api", json!({ "name": "all", "limit": "10/s" }))];
    let (diff, steps) = plan(&rules, &wanted);
    assert!(steps.is_empty());
    assert_eq!(diff.unchanged, 1);

    // 600/min is the same average rate as 10/s but a different limit (a minute's window), so
    // it is an update.
    let wanted = [want("api", json!({ "name": "all", "limit": "600/min" }))];
    let (diff, steps) = plan(&rules, &wanted);
    assert_eq!(outline(&steps), ["update api/all (r1)"]);
    assert_eq!(diff.unchanged, 0);
}

#[test]
fn a_changed_bucket_updates_the_stored_rule_under_its_id() {
    let rules = [stored(
        "r1",
        "api",
        json!({ "name": "all", "limit": "9/s" }),
    )];
    let wanted = [want(
        "api",
        json!({ "name": "all", "limit": "20/s", "mode": "shadow" }),
    )];
    let (diff, steps) = plan(&rules, &wanted);
    assert_eq!(outline(&steps), ["update api/all (r1)"]);
    assert!(matches!(
        steps[0],
        Step::Update(old, input) if std::ptr::eq(old, &rules[0]) && std::ptr::eq(input, &wanted[0])
    ));
    // Before is the rule as the API shows it; after is what is proposed, without an id yet.
    assert_eq!(diff.updated.len(), 1);
    assert_eq!(diff.updated[0].before, rules[0].to_json());
    assert_eq!(diff.updated[0].before["id"], "r1");
    assert_eq!(diff.updated[0].after["limit"], "20/s");
    assert_eq!(diff.updated[0].after["mode"], "shadow");
    assert_eq!(diff.updated[0].after["service"], "api");
    assert!(diff.updated[0].after.get("id").is_none());
    assert_eq!((diff.created.len(), diff.deleted.len()), (0, 0));
}

#[test]
fn a_permanent_rule_the_configuration_leaves_out_is_deleted() {
    let rules = [
        stored("r1", "api", json!({ "name": "all", "limit": "9/s" })),
        stored(
            "r2",
            "api",
            json!({ "name": "old", "match": { "caller": "gw-9" }, "limit": "1/s" }),
        ),
    ];
    let wanted = [want("api", json!({ "name": "all", "limit": "9/s" }))];
    let (diff, steps) = plan(&rules, &wanted);
    assert_eq!(outline(&steps), ["delete api/old (r2)"]);
    assert_eq!(diff.deleted, [rules[1].to_json()]);
    assert_eq!(diff.unchanged, 1);

    // An empty configuration deletes every permanent rule.
    let (diff, steps) = plan(&rules, &[]);
    assert_eq!(
        outline(&steps),
        ["delete api/all (r1)", "delete api/old (r2)"]
    );
    assert_eq!(diff.deleted.len(), 2);
}

#[test]
fn incident_overrides_are_neither_compared_nor_deleted() {
    let rules = [
        override_(
            "o1",
            "api",
            json!({ "name": "all", "limit": "1/s" }),
            1_700_000_900_000,
        ),
        override_(
            "o2",
            "api",
            json!({ "name": "hotfix", "limit": "2/s" }),
            1_700_000_900_000,
        ),
    ];
    // The override's (service, name) is not a permanent rule's, so the file's rule of that name
    // is a create: the apply itself then refuses it as a conflict (409) while the override
    // lasts. The other override is not in the file and stays.
    let wanted = [want("api", json!({ "name": "all", "limit": "1/s" }))];
    let (diff, steps) = plan(&rules, &wanted);
    assert_eq!(outline(&steps), ["create api/all"]);
    assert_eq!((diff.unchanged, diff.deleted.len()), (0, 0));

    let (diff, steps) = plan(&rules, &[]);
    assert!(steps.is_empty());
    assert!(diff.is_empty());
}

#[test]
fn rules_are_matched_by_service_and_name_together() {
    // The same name in another service is another rule.
    let rules = [stored(
        "r1",
        "api",
        json!({ "name": "all", "limit": "9/s" }),
    )];
    let wanted = [want("web", json!({ "name": "all", "limit": "9/s" }))];
    let (diff, steps) = plan(&rules, &wanted);
    assert_eq!(outline(&steps), ["create web/all", "delete api/all (r1)"]);
    assert_eq!(diff.created[0]["service"], "web");
    assert_eq!(diff.deleted[0]["service"], "api");

    // A renamed bucket is a delete and a create, even with the same match and limit.
    let wanted = [want("api", json!({ "name": "everything", "limit": "9/s" }))];
    let (_, steps) = plan(&rules, &wanted);
    assert_eq!(
        outline(&steps),
        ["create api/everything", "delete api/all (r1)"]
    );
}

#[test]
fn creates_and_updates_follow_the_file_and_deletes_come_last_by_service_and_name() {
    // Stored out of order on purpose: deletes are sorted by (service, name), not by storage.
    let rules = [
        stored(
            "r-web-z",
            "web",
            json!({ "name": "z", "match": { "caller": "z" }, "limit": "1/s" }),
        ),
        stored(
            "r-api-b",
            "api",
            json!({ "name": "b", "match": { "caller": "b" }, "limit": "1/s" }),
        ),
        stored(
            "r-web-a",
            "web",
            json!({ "name": "a", "match": { "caller": "a" }, "limit": "1/s" }),
        ),
        stored(
            "r-api-keep",
            "api",
            json!({ "name": "keep", "match": { "caller": "k" }, "limit": "1/s" }),
        ),
        stored(
            "r-api-up",
            "api",
            json!({ "name": "up", "match": { "caller": "u" }, "limit": "1/s" }),
        ),
    ];
    let wanted = [
        want(
            "web",
            json!({ "name": "new-2", "match": { "caller": "n2" }, "limit": "1/s" }),
        ),
        want(
            "api",
            json!({ "name": "up", "match": { "caller": "u" }, "limit": "2/s" }),
        ),
        want(
            "api",
            json!({ "name": "keep", "match": { "caller": "k" }, "limit": "1/s" }),
        ),
        want(
            "api",
            json!({ "name": "new-1", "match": { "caller": "n1" }, "limit": "1/s" }),
        ),
    ];
    let (diff, steps) = plan(&rules, &wanted);
    assert_eq!(
        outline(&steps),
        [
            "create web/new-2",
            "update api/up (r-api-up)",
            "create api/new-1",
            "delete api/b (r-api-b)",
            "delete web/a (r-web-a)",
            "delete web/z (r-web-z)",
        ]
    );
    let names = |values: &[Value]| -> Vec<String> {
        values
            .iter()
            .map(|v| {
                format!(
                    "{}/{}",
                    v["service"].as_str().unwrap(),
                    v["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(names(&diff.created), ["web/new-2", "api/new-1"]);
    assert_eq!(names(&diff.deleted), ["api/b", "web/a", "web/z"]);
    assert_eq!(diff.updated.len(), 1);
    assert_eq!(diff.unchanged, 1);
}

#[test]
fn a_diff_with_only_unchanged_rules_is_empty() {
    let unchanged = ApplyDiff {
        unchanged: 5,
        ..ApplyDiff::default()
    };
    assert!(unchanged.is_empty());
    let one_delete = ApplyDiff {
        deleted: vec![json!({})],
        ..ApplyDiff::default()
    };
    assert!(!one_delete.is_empty());
}
