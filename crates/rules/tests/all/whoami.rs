//! `GET /v1/whoami`: the caller as its token names it, for every role, on a real SQLite store;
//! what the configurator finds its own rules by (`created_by`).

use crate::common::{Db, start};

#[test]
fn whoami_names_the_tokens_user_and_role_and_needs_a_token() {
    let service = start(Db::sqlite());
    for (token, name, role) in [
        (&service.admin, "alice", "admin"),
        (&service.viewer, "victor", "viewer"),
        (&service.robot, "configurator", "service"),
    ] {
        let answer = service.client(token).get("/v1/whoami").unwrap();
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        assert_eq!(answer.body["name"], name);
        assert_eq!(answer.body["role"], role);
    }
    let anonymous = spillway_rules::client::RulesClient::new(&service.url, None);
    assert_eq!(anonymous.get("/v1/whoami").unwrap().status, 401);
    let created = service
        .client(&service.robot)
        .post(
            "/v1/rules",
            r#"{"service": "api", "name": "all", "limit": "10/s", "mode": "shadow"}"#,
        )
        .unwrap();
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(
        created.body["created_by"], "configurator",
        "what whoami named"
    );
}
