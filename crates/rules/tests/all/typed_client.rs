//! The rules client's typed calls against a real service on SQLite: a rule created, listed by
//! its service, replaced at the version it was read at and refused at an older one, and the
//! JSON the service answers read as the same rule the untyped call shows.

use crate::common::{Db, start};
use spillway_core::config::BucketFile;
use spillway_core::decision::Mode;
use spillway_core::limit::Limit;
use spillway_core::rule::{Rule, RuleBody};
use spillway_rules::client::CallError;

fn body(service: &str, name: &str, limit: &str) -> RuleBody {
    let bucket: BucketFile = serde_json::from_value(serde_json::json!({
        "name": name,
        "match": {"caller": "gw", "procedure": "/a"},
        "limit": limit,
        "mode": "shadow",
    }))
    .unwrap();
    RuleBody {
        service: service.to_owned(),
        bucket,
        ttl: None,
        reason: Some("typed".to_owned()),
    }
}

#[test]
fn typed_calls_create_list_and_replace_rules() {
    let service = start(Db::sqlite());
    let client = service.client(&service.robot);

    let created = client
        .create_rule(&body("api.v2", "gw-a", "100/s"))
        .unwrap();
    assert_eq!(created.service, "api.v2");
    assert_eq!(created.bucket.name, "gw-a");
    assert_eq!(created.created_by, "configurator");
    assert!(!created.is_override());
    client.create_rule(&body("other", "gw-a", "5/s")).unwrap();

    // `?service=` selects its rules only.
    let listed = client.rules(Some("api.v2")).unwrap();
    assert_eq!(listed, std::slice::from_ref(&created));
    assert_eq!(client.rules(None).unwrap().len(), 2);
    // The typed rule is what the untyped call answers, read.
    let raw = client.get(&format!("/v1/rules/{}", created.id)).unwrap();
    assert_eq!(serde_json::from_value::<Rule>(raw.body).unwrap(), created);

    let mut change = created.to_body(Some("enforce it".to_owned()));
    change.bucket.mode = Mode::Enforce;
    change.bucket.limit = Limit::parse("200/s").unwrap();
    let replaced = client
        .replace_rule(&created.id, created.version, &change)
        .unwrap();
    assert_eq!(replaced.id, created.id);
    assert!(replaced.version > created.version);
    assert_eq!(replaced.bucket.mode, Mode::Enforce);
    assert_eq!(replaced.bucket.limit.per_second(), 200.0);
    assert_eq!(replaced.created_at, created.created_at);

    // Replaced at the version read before: the service refuses it, and nothing changes.
    let stale = client
        .replace_rule(&created.id, created.version, &change)
        .unwrap_err();
    assert!(
        matches!(stale, CallError::Status { status: 412, .. }),
        "{stale}"
    );
    assert_eq!(client.rules(Some("api.v2")).unwrap(), [replaced]);

    // An invalid rule is the service's refusal, said as it says it.
    let refused = client
        .create_rule(&body("api.v2", "gw-a", "100/s"))
        .unwrap_err();
    assert!(
        matches!(refused, CallError::Status { status: 409, .. }),
        "{refused}"
    );
}
