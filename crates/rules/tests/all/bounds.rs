//! Bounds on what the service stores, on SQLite and PostgreSQL: an override's `ttl` up to the
//! configured maximum, a `reason` up to 4096 bytes wherever it is sent, and the audit log read
//! in pages.

use std::time::Duration;

use crate::common::{Db, rule, start, start_bounded, start_with};
use serde_json::json;
use spillway_rules::{Bounds, Budgets, MAX_REASON_BYTES};

on_both!(
    an_override_longer_than_the_maximum_is_refused,
    a_reason_longer_than_4096_bytes_is_refused,
    the_audit_log_is_read_in_pages,
);

fn override_rule(n: usize, ttl: &str) -> serde_json::Value {
    let mut value = rule(n);
    value["ttl"] = json!(ttl);
    value["reason"] = json!("incident 4711");
    value
}

fn an_override_longer_than_the_maximum_is_refused(db: Db) {
    // The default maximum: a week.
    let service = start(db);
    let refused = service.create(&service.admin, &override_rule(1, "8d"));
    assert_eq!(refused.status, 422, "{}", refused.body);
    let detail = refused.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("ttl 8d") && detail.contains("maximum of 7d"),
        "{detail}"
    );
    assert!(detail.contains("--max-override-ttl"), "{detail}");
    let refused = service.create(&service.admin, &override_rule(1, "169h"));
    assert_eq!(refused.status, 422, "{}", refused.body);
    let created = service.create(&service.admin, &override_rule(1, "7d"));
    assert_eq!(
        created.status, 201,
        "exactly the maximum is fine: {}",
        created.body
    );
    // A replacement is held to the same bound.
    let id = created.body["id"].as_str().unwrap();
    let replaced = service
        .client(&service.admin)
        .send(
            "PUT",
            &format!("/v1/rules/{id}"),
            Some(&override_rule(1, "30d").to_string()),
            Some("*"),
        )
        .unwrap();
    assert_eq!(replaced.status, 422, "{}", replaced.body);
    assert_eq!(service.rules().len(), 1);
    drop(service);
}

#[test]
fn the_maximum_is_configurable() {
    let bounds = Bounds {
        max_override_ttl: Duration::from_secs(3600),
    };
    let service = start_bounded(Db::sqlite(), Budgets::default(), bounds);
    let refused = service.create(&service.admin, &override_rule(1, "61m"));
    assert_eq!(refused.status, 422, "{}", refused.body);
    let detail = refused.body["detail"].as_str().unwrap();
    assert!(detail.contains("maximum of 1h"), "{detail}");
    assert_eq!(
        service
            .create(&service.admin, &override_rule(1, "1h"))
            .status,
        201
    );
}

fn a_reason_longer_than_4096_bytes_is_refused(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    // Bytes, not characters: 1366 three-byte characters are 4098 bytes.
    for long in ["x".repeat(MAX_REASON_BYTES + 1), "€".repeat(1366)] {
        let mut body = override_rule(1, "15m");
        body["reason"] = json!(long);
        let refused = service.create(&service.admin, &body);
        assert_eq!(refused.status, 422, "{}", refused.body);
        let detail = refused.body["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("is {} bytes long", long.len()))
                && detail.contains("at most 4096"),
            "{detail}"
        );
    }
    let mut body = override_rule(1, "15m");
    body["reason"] = json!("x".repeat(MAX_REASON_BYTES));
    let created = service.create(&service.admin, &body);
    assert_eq!(created.status, 201, "4096 bytes are fine: {}", created.body);
    let id = created.body["id"].as_str().unwrap();

    let long = "x".repeat(MAX_REASON_BYTES + 1);
    let deleted = admin
        .send(
            "DELETE",
            &format!("/v1/rules/{id}?reason={long}"),
            None,
            None,
        )
        .unwrap();
    assert_eq!(deleted.status, 400, "{}", deleted.body);
    assert!(
        deleted.body["detail"]
            .as_str()
            .unwrap()
            .contains("the `reason` parameter is 4097 bytes long"),
        "{}",
        deleted.body
    );
    let applied = admin
        .post(&format!("/v1/rules:apply?reason={long}"), "version: 1\n")
        .unwrap();
    assert_eq!(applied.status, 400, "{}", applied.body);
    let nul = admin
        .send(
            "DELETE",
            &format!("/v1/rules/{id}?reason=a%00b"),
            None,
            None,
        )
        .unwrap();
    assert_eq!(nul.status, 400, "{}", nul.body);
    assert!(nul.body["detail"].as_str().unwrap().contains("NUL"));
    assert_eq!(service.rules().len(), 1, "nothing was deleted");
    assert_eq!(
        service.audit().len(),
        1,
        "nothing but the create was audited"
    );
}

fn the_audit_log_is_read_in_pages(db: Db) {
    let service = start_with(
        db,
        Budgets {
            admin: 100,
            service: 100,
        },
    );
    for n in 1..=7 {
        assert_eq!(service.create(&service.admin, &rule(n)).status, 201);
    }
    let admin = service.client(&service.admin);
    let mut path = "/v1/audit?limit=3".to_owned();
    let mut pages = Vec::new();
    loop {
        let page = admin.get(&path).unwrap();
        assert_eq!(page.status, 200, "{}", page.body);
        let versions: Vec<i64> = page
            .body
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["version"].as_i64().unwrap())
            .collect();
        pages.push(versions);
        match page.link {
            Some(link) => {
                let next = link
                    .strip_prefix('<')
                    .and_then(|l| l.split_once(">; rel=\"next\""))
                    .unwrap_or_else(|| panic!("a next link: {link}"))
                    .0;
                path = next.to_owned();
            }
            None => break,
        }
        assert!(pages.len() < 10, "the pages end: {pages:?}");
    }
    assert_eq!(pages, [vec![7, 6, 5], vec![4, 3, 2], vec![1]]);
    let all = admin.get("/v1/audit").unwrap();
    assert_eq!(
        all.body.as_array().unwrap().len(),
        7,
        "100 a page by default"
    );
    assert!(all.link.is_none());
    // A full page cannot know it is the last: it links to the next, which is empty.
    let exact = admin.get("/v1/audit?limit=7").unwrap();
    assert!(exact.link.is_some(), "a full page links to the next");
    let after = admin.get("/v1/audit?limit=7&before=1").unwrap();
    assert_eq!(after.body, json!([]));
    for bad in ["limit=0", "limit=1001", "before=0", "before=-3", "limit=x"] {
        let answer = admin.get(&format!("/v1/audit?{bad}")).unwrap();
        assert_eq!(answer.status, 400, "{bad}: {}", answer.body);
    }
}
