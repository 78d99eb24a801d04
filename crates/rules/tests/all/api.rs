//! The rules service's REST API over a real socket, on SQLite and on PostgreSQL: CRUD, each error
//! status the API documents, the daily budget (also under 50 concurrent writers), the
//! audit log, incident overrides, apply, and text stored verbatim.

use std::time::Duration;

use crate::common::{Db, Service, eventually, rule, start, start_with};
use serde_json::{Value, json};
use spillway_rules::Budgets;

on_both!(
    crud,
    unauthenticated_is_401,
    viewer_writing_is_403,
    conflict_is_409,
    stale_if_match_is_412,
    invalid_rule_is_422_with_cores_message,
    eleventh_change_is_429_and_stores_nothing,
    fifty_concurrent_writers_get_exactly_ten_changes,
    audit_rows_are_exact,
    apply_diffs_and_is_one_modification,
    incident_override_expires_by_itself,
    injection_and_unicode_are_stored_verbatim,
);

/// Fields an answer adds, removed so a rule can be compared with what was sent.
fn sent_part(answer: &Value) -> Value {
    let mut value = answer.clone();
    let map = value.as_object_mut().unwrap();
    for key in ["id", "version", "created_by", "created_at", "updated_at"] {
        map.remove(key);
    }
    value
}

fn crud(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);

    let created = service.create(&service.admin, &rule(1));
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["id"].as_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&id).is_ok());
    assert_eq!(created.body["version"], 1);
    assert_eq!(created.body["created_by"], "alice");
    assert_eq!(created.body["service"], "api");
    assert_eq!(created.body["limit"], "100/s");
    assert_eq!(
        created.body["match"],
        json!({"caller": "gw-1", "procedure": "/a"})
    );

    let got = admin.get(&format!("/v1/rules/{id}")).unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.body, created.body);
    assert_eq!(got.etag.as_deref(), Some("\"1\""));

    let other = json!({"service": "billing", "name": "all", "limit": "5/s"});
    assert_eq!(service.create(&service.admin, &other).status, 201);
    assert_eq!(service.rules().len(), 2);
    let only_api = admin.get("/v1/rules?service=api").unwrap();
    assert_eq!(only_api.body.as_array().unwrap().len(), 1);
    assert_eq!(only_api.body[0]["id"], id.as_str());

    let mut changed = rule(1);
    changed["limit"] = json!("200/s");
    let put = admin
        .send(
            "PUT",
            &format!("/v1/rules/{id}"),
            Some(&changed.to_string()),
            Some("\"1\""),
        )
        .unwrap();
    assert_eq!(put.status, 200, "{:?}", put.body);
    assert_eq!(put.body["limit"], "200/s");
    assert_eq!(put.body["version"], 3);
    assert_eq!(put.body["id"], id.as_str());
    assert_eq!(put.body["created_at"], created.body["created_at"]);

    let deleted = admin
        .send("DELETE", &format!("/v1/rules/{id}"), None, None)
        .unwrap();
    assert_eq!(deleted.status, 204);
    assert_eq!(admin.get(&format!("/v1/rules/{id}")).unwrap().status, 404);
    assert_eq!(service.rules().len(), 1);
    assert_eq!(service.version(), 4);
}

fn unauthenticated_is_401(db: Db) {
    let service = start(db);
    let anonymous = service.anonymous();
    for (method, path) in [
        ("GET", "/v1/rules"),
        ("GET", "/v1/audit"),
        ("POST", "/v1/rules"),
        ("POST", "/v1/rules:apply"),
    ] {
        let body = (method == "POST").then(|| rule(1).to_string());
        let answer = anonymous.send(method, path, body.as_deref(), None).unwrap();
        assert_eq!(answer.status, 401, "{method} {path}");
        assert_eq!(
            answer.content_type.as_deref(),
            Some("application/problem+json")
        );
        assert_eq!(answer.body["status"], 401);
    }
    // A well-formed token with a wrong secret, and one naming no user.
    let (id_part, _) = service.admin.rsplit_once('_').unwrap();
    let forged = format!("{id_part}_{}", "0".repeat(64));
    let nobody = format!("spw_{}_{}", "f".repeat(32), "0".repeat(64));
    for token in [
        forged.as_str(),
        nobody.as_str(),
        "spw_garbage",
        "not-a-token",
    ] {
        let answer = service.create(token, &rule(1));
        assert_eq!(answer.status, 401, "token {token}");
    }
    assert!(service.rules().is_empty());
    // The open routes stay open.
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        assert_eq!(anonymous.get(path).unwrap().status, 200, "{path}");
    }
}

fn viewer_writing_is_403(db: Db) {
    let service = start(db);
    let id = service.create(&service.admin, &rule(1)).body["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let viewer = service.client(&service.viewer);
    assert_eq!(viewer.get("/v1/rules").unwrap().status, 200);
    assert_eq!(viewer.get("/v1/audit").unwrap().status, 200);
    let writes = [
        viewer.post("/v1/rules", &rule(2).to_string()).unwrap(),
        viewer
            .send(
                "PUT",
                &format!("/v1/rules/{id}"),
                Some(&rule(3).to_string()),
                Some("\"1\""),
            )
            .unwrap(),
        viewer
            .send("DELETE", &format!("/v1/rules/{id}"), None, None)
            .unwrap(),
        viewer
            .post("/v1/rules:apply", "version: 1\nservices: {}\n")
            .unwrap(),
    ];
    for answer in writes {
        assert_eq!(answer.status, 403, "{:?}", answer.body);
    }
    assert_eq!(service.rules().len(), 1);
    assert_eq!(service.version(), 1);
}

fn conflict_is_409(db: Db) {
    let service = start(db);
    assert_eq!(service.create(&service.admin, &rule(1)).status, 201);
    // Same (caller gw-1, api /a) under another name.
    let mut same_key = rule(1);
    same_key["name"] = json!("other-name");
    let answer = service.create(&service.admin, &same_key);
    assert_eq!(answer.status, 409, "{:?}", answer.body);
    assert!(answer.body["detail"].as_str().unwrap().contains("gw-1"));
    // Same name, another key.
    let mut same_name = rule(2);
    same_name["name"] = json!("gw-1");
    assert_eq!(service.create(&service.admin, &same_name).status, 409);
    // The same key in another service is another rule.
    let mut elsewhere = rule(1);
    elsewhere["service"] = json!("billing");
    assert_eq!(service.create(&service.admin, &elsewhere).status, 201);
    assert_eq!(service.rules().len(), 2);
    assert_eq!(service.version(), 2);
}

fn stale_if_match_is_412(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    let id = service.create(&service.admin, &rule(1)).body["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/rules/{id}");
    let mut first = rule(1);
    first["limit"] = json!("150/s");
    assert_eq!(
        admin
            .send("PUT", &path, Some(&first.to_string()), Some("\"1\""))
            .unwrap()
            .status,
        200
    );
    // A second writer still holding version 1.
    let mut second = rule(1);
    second["limit"] = json!("999/s");
    let stale = admin
        .send("PUT", &path, Some(&second.to_string()), Some("\"1\""))
        .unwrap();
    assert_eq!(stale.status, 412, "{:?}", stale.body);
    assert_eq!(stale.body["current_version"], 2);
    let missing = admin
        .send("PUT", &path, Some(&second.to_string()), None)
        .unwrap();
    assert_eq!(missing.status, 428);
    let stale_delete = admin.send("DELETE", &path, None, Some("1")).unwrap();
    assert_eq!(stale_delete.status, 412);
    let now = admin.get(&path).unwrap();
    assert_eq!(now.body["limit"], "150/s");
    assert_eq!(service.version(), 2);
}

fn invalid_rule_is_422_with_cores_message(db: Db) {
    let service = start(db);
    // Each bucket, written in YAML, is refused by `spillway check` with this message.
    let cases = [
        json!({"name": "a", "limit": "0/s"}),
        json!({"name": "a", "limit": "100/s", "limt": 3}),
        json!({"name": "a", "limit": "100/s", "algorithm": "drop-ratio", "store": "local"}),
        json!({"name": "a b", "limit": "100/s"}),
        json!({"name": "a", "limit": "100/s", "match": {"user": "*", "org": "x"}}),
        json!({"name": "a", "limit": "100/s", "burst": 5}),
    ];
    for bucket in cases {
        let yaml = format!(
            "version: 1\nservices:\n  api:\n    buckets:\n      - {bucket}\nredis: {{ url: redis://127.0.0.1:6379 }}\n"
        );
        let expected = spillway_core::config::load_str(&yaml, "x.yaml")
            .expect_err("core refuses it")
            .message();
        let mut body = bucket.clone();
        body["service"] = json!("api");
        let answer = service.create(&service.admin, &body);
        assert_eq!(answer.status, 422, "{bucket}");
        assert_eq!(answer.body["detail"], expected.as_str(), "{bucket}");
    }
    for (body, why) in [
        (json!({"name": "a", "limit": "1/s"}), "needs its `service`"),
        (json!([1, 2]), "a rule is a JSON object"),
        (
            json!({"service": "api", "name": "a", "limit": "1/s", "ttl": "5m"}),
            "needs a `reason`",
        ),
        (
            json!({"service": "api", "name": "a", "limit": "1/s", "match": {"caller": "a\u{0}b"}}),
            "NUL",
        ),
    ] {
        let answer = service.create(&service.admin, &body);
        assert_eq!(answer.status, 422, "{body}");
        assert!(answer.body["detail"].as_str().unwrap().contains(why));
    }
    let not_json = service
        .client(&service.admin)
        .post("/v1/rules", "{nope")
        .unwrap();
    assert_eq!(not_json.status, 400);
    assert!(service.rules().is_empty());
    assert_eq!(service.version(), 0);
    // Refusals spend no budget.
    for n in 0..10 {
        assert_eq!(service.create(&service.admin, &rule(n)).status, 201);
    }
}

fn eleventh_change_is_429_and_stores_nothing(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    let mut ids = Vec::new();
    for n in 0..10 {
        let answer = service.create(&service.admin, &rule(n));
        assert_eq!(answer.status, 201, "change {}", n + 1);
        ids.push(answer.body["id"].as_str().unwrap().to_owned());
    }
    let eleventh = service.create(&service.admin, &rule(10));
    assert_eq!(eleventh.status, 429, "{:?}", eleventh.body);
    let retry_after: u64 = eleventh.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry_after));
    assert_eq!(
        eleventh.content_type.as_deref(),
        Some("application/problem+json")
    );
    // Every kind of modification is refused, and none is stored.
    let mut edit = rule(0);
    edit["limit"] = json!("1/s");
    let path = format!("/v1/rules/{}", ids[0]);
    assert_eq!(
        admin
            .send("PUT", &path, Some(&edit.to_string()), Some("*"))
            .unwrap()
            .status,
        429
    );
    assert_eq!(admin.send("DELETE", &path, None, None).unwrap().status, 429);
    assert_eq!(
        admin
            .post(
                "/v1/rules:apply",
                "version: 1\nservices: { x: { buckets: [ { name: a, limit: 1/s } ] } }\n"
            )
            .unwrap()
            .status,
        429
    );
    let rules = service.rules();
    assert_eq!(rules.len(), 10);
    assert!(rules.iter().all(|r| r["limit"] == "100/s"));
    assert_eq!(service.version(), 10);
    assert_eq!(service.audit().len(), 10);
    // The budget is per user: another admin and the service account still write.
    assert_eq!(service.create(&service.admin2, &rule(20)).status, 201);
    assert_eq!(service.create(&service.robot, &rule(21)).status, 201);
}

fn fifty_concurrent_writers_get_exactly_ten_changes(db: Db) {
    let service = start(db);
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..50)
            .map(|n| {
                let service = &service;
                scope.spawn(move || service.create(&service.admin, &rule(n)).status)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        statuses.iter().filter(|&&s| s == 201).count(),
        10,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        40,
        "{statuses:?}"
    );
    assert_eq!(service.rules().len(), 10);
    assert_eq!(service.version(), 10);
    let audit = service.audit();
    assert_eq!(audit.len(), 10);
    let versions: Vec<i64> = audit
        .iter()
        .map(|a| a["version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, (1..=10).rev().collect::<Vec<_>>());
}

fn audit_rows_are_exact(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    let created = service.create(&service.admin, &rule(1)).body;
    let id = created["id"].as_str().unwrap().to_owned();
    let mut edit = rule(1);
    edit["limit"] = json!("7/s");
    edit["reason"] = json!("tighten after incident 42");
    let updated = admin
        .send(
            "PUT",
            &format!("/v1/rules/{id}"),
            Some(&edit.to_string()),
            Some("\"1\""),
        )
        .unwrap()
        .body;
    let deleted = admin
        .send("DELETE", &format!("/v1/rules/{id}?reason=gone"), None, None)
        .unwrap();
    assert_eq!(deleted.status, 204);
    let applied = admin
        .post(
            "/v1/rules:apply?reason=from%20git",
            "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 9/s }\n",
        )
        .unwrap();
    assert_eq!(applied.status, 200, "{:?}", applied.body);
    let new_rule = applied.body["created"][0].clone();

    let audit = service.audit();
    assert_eq!(audit.len(), 4);
    let row = |version: i64| audit.iter().find(|a| a["version"] == version).unwrap();
    let expect =
        |version: i64, action: &str, rule_id: Value, before: Value, after: Value, reason: Value| {
            let entry = row(version);
            assert_eq!(entry["from_version"], version - 1);
            assert_eq!(entry["actor"], "alice");
            assert_eq!(entry["action"], action);
            assert_eq!(entry["rule_id"], rule_id);
            assert_eq!(entry["before"], before, "before of {action}");
            assert_eq!(entry["after"], after, "after of {action}");
            assert_eq!(entry["reason"], reason);
            assert!(entry["at"].as_str().unwrap().ends_with('Z'));
        };
    expect(
        1,
        "create",
        json!(id),
        Value::Null,
        created.clone(),
        Value::Null,
    );
    expect(
        2,
        "update",
        json!(id),
        created.clone(),
        updated.clone(),
        json!("tighten after incident 42"),
    );
    expect(3, "delete", json!(id), updated, Value::Null, json!("gone"));
    expect(
        4,
        "apply",
        Value::Null,
        json!([]),
        json!([new_rule]),
        json!("from git"),
    );
}

fn apply_diffs_and_is_one_modification(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    let kept = service.create(&service.admin, &rule(1)).body;
    let doomed = service.create(&service.admin, &rule(2)).body;
    let file = "version: 1\nservices:\n  api:\n    buckets:\n      - name: gw-1\n        match: { caller: gw-1, procedure: /a }\n        limit: 50/s\n        algorithm: token-bucket\n      - { name: fresh, match: { user: \"*\" }, limit: 10/min, algorithm: sliding-window-log }\n  payments:\n    buckets:\n      - { name: charge, limit: 5000/s }\n";

    let dry = admin.post("/v1/rules:apply?dry_run=true", file).unwrap();
    assert_eq!(dry.status, 200, "{:?}", dry.body);
    assert_eq!(dry.body["dry_run"], true);
    assert_eq!(dry.body["created"].as_array().unwrap().len(), 2);
    assert_eq!(dry.body["updated"][0]["before"], kept);
    assert_eq!(dry.body["updated"][0]["after"]["limit"], "50/s");
    assert_eq!(dry.body["deleted"], json!([doomed]));
    assert_eq!(service.version(), 2, "a dry run changes nothing");
    assert_eq!(service.rules().len(), 2);

    let real = admin.post("/v1/rules:apply", file).unwrap();
    assert_eq!(real.status, 200);
    assert_eq!(real.body["version"], 3);
    assert_eq!(service.version(), 3, "one apply is one modification");
    let rules = service.rules();
    let names: Vec<(&str, &str)> = rules
        .iter()
        .map(|r| (r["service"].as_str().unwrap(), r["name"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [("api", "fresh"), ("api", "gw-1"), ("payments", "charge")]
    );
    let gw1 = rules.iter().find(|r| r["name"] == "gw-1").unwrap();
    assert_eq!(gw1["id"], kept["id"], "an updated rule keeps its id");
    assert_eq!(gw1["limit"], "50/s");

    // The same file again changes nothing and spends nothing.
    let again = admin.post("/v1/rules:apply", file).unwrap();
    assert_eq!(again.body["unchanged"], 3);
    assert_eq!(again.body["created"], json!([]));
    assert_eq!(service.version(), 3);

    // A broken file is refused with its line and column, as `spillway check` does.
    let broken = admin
        .post("/v1/rules:apply", "version: 1\nservices:\n  api:\n    buckets:\n      - { name: a, limit: 10/fortnight }\n")
        .unwrap();
    assert_eq!(broken.status, 422);
    assert!(
        broken.body["detail"]
            .as_str()
            .unwrap()
            .starts_with("apply:5:"),
        "{:?}",
        broken.body
    );
}

fn incident_override_expires_by_itself(db: Db) {
    let service = start(db);
    let mut hotfix = rule(1);
    hotfix["ttl"] = json!("1s");
    hotfix["reason"] = json!("incident 7: gw-1 floods /a");
    hotfix["limit"] = json!("1/s");
    let created = service.create(&service.admin, &hotfix);
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.body["reason"], "incident 7: gw-1 floods /a");
    assert!(created.body["expires_at"].is_string());
    let expired: Vec<Value> = eventually(Duration::from_secs(20), || {
        let audit = service.audit();
        audit
            .iter()
            .any(|a| a["action"] == "expire")
            .then_some(audit)
    });
    assert!(service.rules().is_empty());
    let end = &expired[0];
    assert_eq!(end["actor"], "system");
    assert_eq!(end["before"]["id"], created.body["id"]);
    assert_eq!(end["reason"], "incident 7: gw-1 floods /a");
    assert_eq!(expired[1]["action"], "override");
    // Expiry spends nobody's budget: ten more changes still fit... minus the override.
    for n in 10..19 {
        assert_eq!(service.create(&service.admin, &rule(n)).status, 201);
    }
    assert_eq!(service.create(&service.admin, &rule(30)).status, 429);
}

fn injection_and_unicode_are_stored_verbatim(db: Db) {
    let service = start_with(
        db,
        Budgets {
            admin: 100,
            service: 100,
        },
    );
    let witness = service.create(&service.admin, &rule(0)).body;
    let texts = [
        "'; DROP TABLE rules; --",
        "Robert'); DELETE FROM users WHERE ('1'='1",
        "\" OR 1=1 --",
        "$1 $2 ?1 :name @x %s {0} \\N \\x00",
        "名前 — ümlaut — עִבְרִית — العربية",
        "e\u{301}\u{200b}\u{200d}\u{feff}\u{202e}reversed",
        "🦀🏳️‍🌈👩🏽‍🚀",
        "line\nbreak\ttab\r\u{1}\u{7f}",
        "\u{10ffff}\u{fffd}",
        "*",
    ];
    for (n, text) in texts.iter().enumerate() {
        let body = json!({
            "service": "api",
            "name": format!("odd-{n}"),
            "match": { "caller": text, "procedure": format!("/{text}") },
            "limit": "3/s",
            "reason": text,
        });
        let created = service.create(&service.admin, &body);
        assert_eq!(created.status, 201, "{text:?}: {:?}", created.body);
        let id = created.body["id"].as_str().unwrap();
        let got = service
            .client(&service.admin)
            .get(&format!("/v1/rules/{id}"))
            .unwrap();
        assert_eq!(got.body["match"]["caller"], *text);
        assert_eq!(got.body["match"]["procedure"], format!("/{text}"));
        let audit = service.audit();
        assert_eq!(audit[0]["reason"], *text);
    }
    let rules = service.rules();
    assert_eq!(rules.len(), texts.len() + 1);
    let still = rules.iter().find(|r| r["id"] == witness["id"]).unwrap();
    assert_eq!(sent_part(still), sent_part(&witness));
    // The users table is intact: every token still works.
    for token in [&service.admin, &service.viewer, &service.robot] {
        assert_eq!(service.client(token).get("/v1/rules").unwrap().status, 200);
    }
}

#[test]
fn openapi_document_lists_every_route() {
    let service: Service = start(Db::sqlite());
    let doc = service.anonymous().get("/openapi.json").unwrap().body;
    let paths = doc["paths"].as_object().unwrap();
    for path in [
        "/v1/rules",
        "/v1/rules/{id}",
        "/v1/rules:apply",
        "/v1/audit",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(paths.contains_key(path), "{path} missing");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
}

/// What the rules API fuzz found: each of these was answered otherwise before.
#[test]
fn malformed_requests_get_problem_documents() {
    let service: Service = start(Db::sqlite());
    let admin = service.client(&service.admin);
    let created = service.create(&service.admin, &rule(1));
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["id"].as_str().unwrap().to_owned();

    // A query parameter of the wrong type: a problem document, not axum's plain text.
    let answer = admin.get("/v1/audit?limit=many").unwrap();
    assert_eq!(answer.status, 400);
    assert_eq!(
        answer.content_type.as_deref(),
        Some("application/problem+json")
    );
    assert!(
        answer.body["detail"].as_str().unwrap().contains("limit"),
        "{:?}",
        answer.body
    );

    // An if-match that is no version is a bad request, not a version that moved.
    // Nor is a sign, an unbalanced quote or a weak tag without its quotes.
    for tag in [
        "",
        "W/\"\"",
        "\"seven\"",
        "+7",
        "-1",
        "\"7",
        "W/7",
        "1234567890123456789",
    ] {
        let answer = admin
            .send("DELETE", &format!("/v1/rules/{id}"), None, Some(tag))
            .unwrap();
        assert_eq!(answer.status, 400, "if-match {tag:?}: {:?}", answer.body);
    }
    assert_eq!(service.rules().len(), 1, "nothing was deleted");

    // serde reads a struct from an array of its fields too; the API takes objects only.
    let answer = admin.post("/v1/tokens", "[null, null]").unwrap();
    assert_eq!(answer.status, 400, "{:?}", answer.body);
    let answer = admin
        .post("/v1/users", r#"["mallory", "admin", null]"#)
        .unwrap();
    assert_eq!(answer.status, 400, "{:?}", answer.body);
}

/// JSON has one kind of number and escapes characters past the BMP as surrogate pairs; both
/// reach the YAML loader that validates rules, which reads `5.0` as a float and refuses the
/// pair. A rule and an applied file in JSON are read as JSON means them.
#[test]
fn json_bodies_are_read_as_json_means_them() {
    let service: Service = start(Db::sqlite());
    let admin = service.client(&service.admin);
    let created = service.create(
        &service.admin,
        &serde_json::from_str(
            r#"{"service": "api", "name": "whole", "limit": "10/s",
                "algorithm": "token-bucket", "burst": 20.0, "cost": 2.0}"#,
        )
        .unwrap(),
    );
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.body["burst"], 20);
    assert_eq!(created.body["cost"], 2);

    let file = r#"{"version": 1, "services": {"api": {"buckets": [
        {"name": "smile", "limit": "5/s", "algorithm": "gcra", "cost": 3.0,
         "match": {"user": "\ud83d\ude00"}}]}}}"#;
    let applied = admin.post("/v1/rules:apply", file).unwrap();
    assert_eq!(applied.status, 200, "{:?}", applied.body);
    let rules = service.rules();
    let smile = rules.iter().find(|r| r["name"] == "smile").unwrap();
    assert_eq!(smile["match"]["user"], "😀");
    assert_eq!(smile["cost"], 3);

    // A large whole number written as a float is read exactly, not a unit of the last place off
    // (which made it a fraction and the rule invalid).
    let big = admin
        .post(
            "/v1/rules",
            r#"{"service": "api", "name": "big", "limit": "10/s", "algorithm": "token-bucket",
                "cost": 4204198101187882.0}"#,
        )
        .unwrap();
    assert_eq!(big.status, 201, "{:?}", big.body);
    assert_eq!(big.body["cost"], 4_204_198_101_187_882u64);
}

/// The query parameters are documented as query parameters (utoipa's default is the path), and
/// every `/v1` route documents the guard's 429 and 503 and, with a body, the 413.
#[test]
fn openapi_document_places_parameters_and_common_answers() {
    let service: Service = start(Db::sqlite());
    let doc = service.anonymous().get("/openapi.json").unwrap().body;
    let audit = &doc["paths"]["/v1/audit"]["get"];
    for parameter in audit["parameters"].as_array().unwrap() {
        assert_eq!(parameter["in"], "query", "{parameter}");
        assert_eq!(parameter["required"], false, "{parameter}");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for (method, operation) in item.as_object().unwrap() {
            let responses = &operation["responses"];
            for status in ["401", "429", "503"] {
                assert!(
                    responses.get(status).is_some(),
                    "{method} {path}: no {status}"
                );
            }
            if operation.get("requestBody").is_some() {
                assert!(responses.get("413").is_some(), "{method} {path}: no 413");
            }
        }
    }
}
