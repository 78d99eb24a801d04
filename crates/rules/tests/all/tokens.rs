//! Users and tokens. A revoked, rotated, expired, demoted or deleted user's token
//! stops working within a second on every instance: each such change is made through instance
//! A, and instance B, another process's worth of service (its own pool, its own memory of
//! verified tokens) on the same PostgreSQL, is asked every 50 ms until it refuses. Then the API
//! itself on both stores: admin only, never a secret listed, the last admin kept, and the tokens
//! of a store made before tokens had a table of their own still working after the upgrade.

use std::time::{Duration, Instant};

use crate::common::{Db, Service, start};
use serde_json::{Value, json};
use spillway_rules::time::now_millis;

/// A new token for `user`, made by the admin through `service`: (id, token).
fn new_token(service: &Service, user: &str, expires: Option<&str>) -> (String, String) {
    let mut body = json!({ "user": user });
    if let Some(expires) = expires {
        body["expires"] = json!(expires);
    }
    let made = service
        .client(&service.admin)
        .post("/v1/tokens", &body.to_string())
        .unwrap();
    assert_eq!(made.status, 201, "{}", made.body);
    let id = made.body["id"].as_str().unwrap().to_owned();
    let token = made.body["token"].as_str().unwrap().to_owned();
    assert_eq!(
        token
            .strip_prefix("spw_")
            .unwrap()
            .split_once('_')
            .unwrap()
            .0,
        id
    );
    (id, token)
}

/// Asks `probe` every 50 ms, from now on, until it answers `refused`, and returns how long after
/// `changed` the first refused request was sent. The promise, exactly: no request sent a
/// second or more after the change is accepted (`changed` is when the change's answer came
/// back, so the change had committed by then). Once refused, the token stays refused.
fn refused_within_a_second(
    changed: Instant,
    mut probe: impl FnMut() -> (u16, Value),
    accepted: u16,
    refused: u16,
) -> Duration {
    loop {
        let sent = Instant::now();
        let (status, body) = probe();
        let after = sent.saturating_duration_since(changed);
        if status == refused {
            for _ in 0..5 {
                assert_eq!(probe().0, refused, "refused once, refused for good");
            }
            eprintln!("refused by the other instance {after:?} after the change");
            return after;
        }
        assert_eq!(status, accepted, "{body}");
        assert!(
            after < Duration::from_secs(1),
            "a request sent {after:?} after the change was still accepted by the other instance"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_revoked_token_is_refused_by_every_instance_within_a_second() {
    let a = start(Db::postgres());
    let b = a.another_instance();
    let (id, token) = new_token(&a, "victor", None);
    let read = |url: &str| {
        let answer = spillway_rules::client::RulesClient::new(url, Some(token.clone()))
            .get("/v1/rules")
            .unwrap();
        (answer.status, answer.body)
    };
    assert_eq!(read(&a.url).0, 200);
    // B has just verified it: the worst case, a fresh memory of a good token.
    assert_eq!(read(&b.url).0, 200);
    let revoked = a
        .client(&a.admin)
        .post(&format!("/v1/tokens/{id}/revoke"), "")
        .unwrap();
    let changed = Instant::now();
    assert_eq!(revoked.status, 200, "{}", revoked.body);
    assert_eq!(revoked.body["state"], "revoked");
    assert!(
        revoked.body.get("token").is_none(),
        "no secret in the answer"
    );
    // The instance that revoked it forgets it at once, and says why to the token's holder.
    let (status, body) = read(&a.url);
    assert_eq!(status, 401);
    assert!(
        body["detail"].as_str().unwrap().contains("revoked"),
        "{body}"
    );
    refused_within_a_second(changed, || read(&b.url), 200, 401);
    // Revoking again changes nothing; the user's other token still works.
    let again = a
        .client(&a.admin)
        .post(&format!("/v1/tokens/{id}/revoke"), "")
        .unwrap();
    assert_eq!(again.status, 200);
    assert_eq!(again.body["revoked_at"], revoked.body["revoked_at"]);
    assert_eq!(b.client(&a.viewer).get("/v1/rules").unwrap().status, 200);
}

#[test]
fn a_rotated_token_s_old_secret_is_refused_by_every_instance_within_a_second() {
    let a = start(Db::postgres());
    let b = a.another_instance();
    let (id, old) = new_token(&a, "configurator", Some("1h"));
    let read = |url: &str, token: &str| {
        let answer = spillway_rules::client::RulesClient::new(url, Some(token.to_owned()))
            .get("/v1/rules")
            .unwrap();
        (answer.status, answer.body)
    };
    assert_eq!(read(&a.url, &old).0, 200);
    assert_eq!(read(&b.url, &old).0, 200);
    let rotated = a
        .client(&a.admin)
        .post(&format!("/v1/tokens/{id}/rotate"), "")
        .unwrap();
    let changed = Instant::now();
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    assert_eq!(rotated.body["id"], id.as_str(), "the token keeps its id");
    let new = rotated.body["token"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    // The new secret works everywhere at once: nothing remembers it yet, so it is verified.
    assert_eq!(read(&b.url, &new).0, 200);
    assert_eq!(read(&a.url, &new).0, 200);
    assert_eq!(read(&a.url, &old).0, 401);
    refused_within_a_second(changed, || read(&b.url, &old), 200, 401);
    assert_eq!(read(&b.url, &new).0, 200, "and the new one still works");
    // Without --expires, the new secret lives as long as the old one was given: an hour.
    let tokens = a
        .runtime
        .block_on(a.store.list_tokens(Some("configurator")))
        .unwrap();
    let token = tokens.iter().find(|t| t.id == id).unwrap();
    assert_eq!(token.expires_at.unwrap() - token.issued_at, 3_600_000);
    assert!(token.issued_at > token.created_at);
}

#[test]
fn an_expired_token_is_refused_by_every_instance_within_a_second_of_its_expiry() {
    let a = start(Db::postgres());
    let b = a.another_instance();
    let (id, token) = new_token(&a, "victor", Some("2s"));
    let tokens = a
        .runtime
        .block_on(a.store.list_tokens(Some("victor")))
        .unwrap();
    let expires_at = tokens
        .iter()
        .find(|t| t.id == id)
        .unwrap()
        .expires_at
        .unwrap();
    let expiry = Instant::now() + Duration::from_millis((expires_at - now_millis()).max(0) as u64);
    let read = |url: &str| {
        let answer = spillway_rules::client::RulesClient::new(url, Some(token.clone()))
            .get("/v1/rules")
            .unwrap();
        (answer.status, answer.body)
    };
    assert_eq!(read(&a.url).0, 200, "good until it expires");
    assert_eq!(read(&b.url).0, 200, "good until it expires");
    refused_within_a_second(expiry, || read(&b.url), 200, 401);
    let (status, body) = read(&a.url);
    assert_eq!(status, 401);
    assert!(
        body["detail"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    let listed = a.client(&a.admin).get("/v1/tokens?user=victor").unwrap();
    let entry = listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(entry["state"], "expired");
}

#[test]
fn a_demoted_admin_writes_on_no_instance_within_a_second() {
    let a = start(Db::postgres());
    let b = a.another_instance();
    // A dry run needs a writer's role and changes nothing, so it spends no budget.
    let write = || {
        let answer = b
            .client(&a.admin2)
            .post("/v1/rules:apply?dry_run=true", "version: 1\n")
            .unwrap();
        (answer.status, answer.body)
    };
    assert_eq!(write().0, 200);
    let demoted = a
        .client(&a.admin)
        .send(
            "PATCH",
            "/v1/users/bob",
            Some(&json!({"role": "viewer"}).to_string()),
            None,
        )
        .unwrap();
    let changed = Instant::now();
    assert_eq!(demoted.status, 200, "{}", demoted.body);
    assert_eq!(demoted.body["role"], "viewer");
    refused_within_a_second(changed, write, 200, 403);
    // Bob still reads, and may no longer manage users.
    assert_eq!(b.client(&a.admin2).get("/v1/rules").unwrap().status, 200);
    assert_eq!(b.client(&a.admin2).get("/v1/users").unwrap().status, 403);
}

#[test]
fn a_deleted_user_s_tokens_are_refused_by_every_instance_within_a_second() {
    let a = start(Db::postgres());
    let b = a.another_instance();
    let (_, second) = new_token(&a, "victor", None);
    let read = |token: &str| {
        let answer = b.client(token).get("/v1/rules").unwrap();
        (answer.status, answer.body)
    };
    assert_eq!(read(&second).0, 200);
    assert_eq!(read(&a.viewer).0, 200);
    let deleted = a
        .client(&a.admin)
        .send("DELETE", "/v1/users/victor", None, None)
        .unwrap();
    let changed = Instant::now();
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    refused_within_a_second(changed, || read(&a.viewer), 200, 401);
    assert_eq!(read(&second).0, 401, "every token of the user");
    let users = a.client(&a.admin).get("/v1/users").unwrap();
    let names: Vec<&str> = users
        .body
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["name"].as_str())
        .collect();
    assert_eq!(names, ["alice", "bob", "configurator"]);
}

on_both!(
    users_and_tokens_are_for_admins_only,
    a_token_list_shows_no_secret,
    users_are_created_changed_and_deleted,
    the_last_admin_stays,
    bad_requests_say_what_is_wrong,
    tokens_made_before_the_upgrade_still_work,
);

fn users_and_tokens_are_for_admins_only(db: Db) {
    let service = start(db);
    let some_id = "0".repeat(32);
    for token in [&service.viewer, &service.robot] {
        let client = service.client(token);
        for (method, path, body) in [
            ("GET", "/v1/users".to_owned(), None),
            ("POST", "/v1/users".to_owned(), Some(r#"{"name": "eve"}"#)),
            (
                "PATCH",
                "/v1/users/alice".to_owned(),
                Some(r#"{"role": "viewer"}"#),
            ),
            ("DELETE", "/v1/users/alice".to_owned(), None),
            ("GET", "/v1/tokens".to_owned(), None),
            ("POST", "/v1/tokens".to_owned(), Some("{}")),
            ("POST", format!("/v1/tokens/{some_id}/revoke"), None),
            ("POST", format!("/v1/tokens/{some_id}/rotate"), None),
        ] {
            let answer = client.send(method, &path, body, None).unwrap();
            assert_eq!(answer.status, 403, "{method} {path}: {}", answer.body);
            assert!(
                answer.body["detail"].as_str().unwrap().contains("admin"),
                "{}",
                answer.body
            );
        }
    }
    assert_eq!(service.anonymous().get("/v1/users").unwrap().status, 401);
    assert_eq!(service.anonymous().get("/v1/tokens").unwrap().status, 401);
}

fn a_token_list_shows_no_secret(db: Db) {
    let service = start(db);
    let (first, first_token) = new_token(&service, "bob", Some("30d"));
    let (second, second_token) = new_token(&service, "bob", None);
    let listed = service
        .client(&service.admin)
        .get("/v1/tokens?user=bob")
        .unwrap();
    assert_eq!(listed.status, 200);
    let text = listed.body.to_string();
    for token in [&first_token, &second_token, &service.admin2] {
        let secret = token.rsplit_once('_').unwrap().1;
        assert!(!text.contains(secret), "a secret in {text}");
    }
    let tokens = listed.body.as_array().unwrap();
    assert_eq!(tokens.len(), 3, "bob's first token and the two new ones");
    for token in tokens {
        assert_eq!(token["user"], "bob");
        assert_eq!(token["state"], "active");
        assert!(token.get("token").is_none());
    }
    let ids: Vec<&str> = tokens.iter().filter_map(|t| t["id"].as_str()).collect();
    assert!(ids.contains(&first.as_str()) && ids.contains(&second.as_str()));
    let dated = tokens.iter().find(|t| t["id"] == first.as_str()).unwrap();
    assert!(dated["expires_at"].is_string());
    // Using a token notes when.
    assert!(tokens.iter().find(|t| t["id"] == second.as_str()).unwrap()["last_used_at"].is_null());
    assert_eq!(
        service
            .client(&second_token)
            .get("/v1/rules")
            .unwrap()
            .status,
        200
    );
    crate::common::eventually(Duration::from_secs(10), || {
        let listed = service
            .client(&service.admin)
            .get("/v1/tokens?user=bob")
            .unwrap();
        listed
            .body
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == second.as_str())
            .filter(|t| t["last_used_at"].is_string())
            .cloned()
    });
    // Everybody's, without ?user: one token for each of the four users, and bob's two more.
    let all = service.client(&service.admin).get("/v1/tokens").unwrap();
    assert_eq!(all.body.as_array().unwrap().len(), 6);
    let nobody = service
        .client(&service.admin)
        .get("/v1/tokens?user=nobody")
        .unwrap();
    assert_eq!(nobody.status, 404);
}

fn users_are_created_changed_and_deleted(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    let made = admin
        .post(
            "/v1/users",
            &json!({"name": "dora", "role": "service", "expires": "30d"}).to_string(),
        )
        .unwrap();
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["user"]["name"], "dora");
    assert_eq!(made.body["user"]["role"], "service");
    assert_eq!(made.body["user"]["active_tokens"], 1);
    assert!(made.body["token"]["expires_at"].is_string());
    let dora = made.body["token"]["token"].as_str().unwrap().to_owned();
    let written = service.create(&dora, &crate::common::rule(1));
    assert_eq!(
        written.status, 201,
        "a service account writes: {}",
        written.body
    );
    assert_eq!(written.body["created_by"], "dora");

    let taken = admin
        .post("/v1/users", &json!({"name": "dora"}).to_string())
        .unwrap();
    assert_eq!(taken.status, 409, "{}", taken.body);

    let viewer = admin
        .send(
            "PATCH",
            "/v1/users/dora",
            Some(&json!({"role": "viewer"}).to_string()),
            None,
        )
        .unwrap();
    assert_eq!(viewer.status, 200, "{}", viewer.body);
    assert_eq!(viewer.body["role"], "viewer");
    let mut rule = crate::common::rule(2);
    rule["name"] = json!("gw-2");
    assert_eq!(service.create(&dora, &rule).status, 403);

    let users = admin.get("/v1/users").unwrap();
    let dora_listed = users
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "dora")
        .unwrap()
        .clone();
    assert_eq!(dora_listed["role"], "viewer");

    let gone = admin.send("DELETE", "/v1/users/dora", None, None).unwrap();
    assert_eq!(gone.status, 204, "{}", gone.body);
    assert_eq!(service.client(&dora).get("/v1/rules").unwrap().status, 401);
    // The audit log still names who made the rule.
    assert_eq!(service.audit()[0]["actor"], "dora");
    let again = admin.send("DELETE", "/v1/users/dora", None, None).unwrap();
    assert_eq!(again.status, 404);
}

fn the_last_admin_stays(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    assert_eq!(
        admin
            .send("DELETE", "/v1/users/bob", None, None)
            .unwrap()
            .status,
        204
    );
    let demote = admin
        .send(
            "PATCH",
            "/v1/users/alice",
            Some(&json!({"role": "viewer"}).to_string()),
            None,
        )
        .unwrap();
    assert_eq!(demote.status, 409, "{}", demote.body);
    assert!(
        demote.body["detail"]
            .as_str()
            .unwrap()
            .contains("last admin"),
        "{}",
        demote.body
    );
    let delete = admin.send("DELETE", "/v1/users/alice", None, None).unwrap();
    assert_eq!(delete.status, 409, "{}", delete.body);
    assert_eq!(
        admin.get("/v1/users").unwrap().status,
        200,
        "alice is still an admin"
    );
}

fn bad_requests_say_what_is_wrong(db: Db) {
    let service = start(db);
    let admin = service.client(&service.admin);
    let cases: [(&str, String, Option<String>, u16, &str); 11] = [
        (
            "POST",
            "/v1/users".into(),
            Some(r#"{"name": "has space"}"#.into()),
            422,
            "1 to 64 letters",
        ),
        (
            "POST",
            "/v1/users".into(),
            Some(r#"{"name": "eve", "role": "root"}"#.into()),
            422,
            "admin, viewer, service",
        ),
        (
            "POST",
            "/v1/users".into(),
            Some(r#"{"name": "eve", "colour": "red"}"#.into()),
            400,
            "unknown field",
        ),
        (
            "POST",
            "/v1/tokens".into(),
            Some(r#"{"expires": "30 days"}"#.into()),
            422,
            "30d",
        ),
        (
            "POST",
            "/v1/tokens".into(),
            Some(r#"{"user": "nobody"}"#.into()),
            404,
            "nobody",
        ),
        (
            "PATCH",
            "/v1/users/nobody".into(),
            Some(r#"{"role": "viewer"}"#.into()),
            404,
            "nobody",
        ),
        ("GET", "/v1/tokens?user=a%00b".into(), None, 404, "no user"),
        ("DELETE", "/v1/users/a%00b".into(), None, 404, "no user"),
        (
            "POST",
            "/v1/tokens/not-an-id/revoke".into(),
            None,
            404,
            "32 hex digits",
        ),
        (
            "POST",
            format!("/v1/tokens/{}/rotate", "a".repeat(32)),
            None,
            404,
            "no token",
        ),
        (
            "POST",
            format!("/v1/tokens/{}/revoke", "a".repeat(32)),
            None,
            404,
            "no token",
        ),
    ];
    for (method, path, body, status, says) in cases {
        let answer = admin.send(method, &path, body.as_deref(), None).unwrap();
        assert_eq!(
            answer.status, status,
            "{method} {path} {body:?}: {}",
            answer.body
        );
        assert_eq!(
            answer.content_type.as_deref(),
            Some("application/problem+json")
        );
        let detail = answer.body["detail"].as_str().unwrap();
        assert!(
            detail.contains(says),
            "{method} {path}: {detail:?} should say {says:?}"
        );
    }
    // A revoked token cannot be rotated back to life.
    let (id, _) = new_token(&service, "victor", None);
    assert_eq!(
        admin
            .post(&format!("/v1/tokens/{id}/revoke"), "")
            .unwrap()
            .status,
        200
    );
    let rotated = admin
        .post(&format!("/v1/tokens/{id}/rotate"), "{}")
        .unwrap();
    assert_eq!(rotated.status, 409, "{}", rotated.body);
    assert!(rotated.body["detail"].as_str().unwrap().contains("revoked"));
}

/// A store whose schema is the first migration's, with a user made the way that schema kept
/// tokens (one hash on the user's row), is upgraded by `Store::connect`: the token keeps working
/// and is listed as the user's one token, under the user's id.
fn tokens_made_before_the_upgrade_still_work(db: Db) {
    use sqlx::SqlSafeStr;
    use sqlx::migrate::{Migration, MigrationType, Migrator};

    let url = db.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let user_id = "0123456789abcdef0123456789abcdef";
    let secret = "f".repeat(64);
    runtime.block_on(async {
        sqlx::any::install_default_drivers();
        let connect = if url.starts_with("sqlite:") {
            format!("{url}?mode=rwc")
        } else {
            url.clone()
        };
        let pool = sqlx::AnyPool::connect(&connect).await.unwrap();
        let first = Migration::new(
            1,
            "rules".into(),
            MigrationType::Simple,
            include_str!("../../../db/migrations/0001_rules.sql").into_sql_str(),
            false,
        );
        Migrator::with_migrations(vec![first]).run(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO users (id, name, role, token_hash, created_at) VALUES ($1, 'old', 'admin', $2, 0)",
        )
        .bind(user_id)
        .bind(spillway_rules::auth::hash_secret(&secret).unwrap())
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    });
    let service = start(db);
    let old = format!("spw_{user_id}_{secret}");
    let answer = service.client(&old).get("/v1/users").unwrap();
    assert_eq!(answer.status, 200, "{}", answer.body);
    let tokens = service.client(&old).get("/v1/tokens?user=old").unwrap();
    let tokens = tokens.body.as_array().unwrap();
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0]["id"], user_id);
    assert_eq!(tokens[0]["state"], "active");
    let wrong = format!("spw_{user_id}_{}", "e".repeat(64));
    assert_eq!(service.client(&wrong).get("/v1/rules").unwrap().status, 401);
}
