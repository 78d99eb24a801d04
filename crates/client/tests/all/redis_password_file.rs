//! `redis.password_file`: a Redis that requires a password is reached with the
//! process's own file, and the password never appears in an error or a printed configuration.
#![cfg(feature = "redis")]

use std::sync::Arc;

use crate::redis_auth::{PASSWORD, admitted, failures, per_user_in, server};
use spillway_client::Client;

#[tokio::test]
async fn a_password_file_reaches_a_redis_that_requires_it() {
    let redis = server();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redis-password");
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let config = per_user_in(
        &redis.url(),
        &format!(", password_file: \"{}\"", file.display()),
    );
    assert!(!format!("{config:?}").contains(PASSWORD));
    let client = Arc::new(Client::new(config).unwrap());
    // Counted in Redis: two an hour, the third refused, and another client sees the same count.
    assert_eq!(admitted(client.clone(), "alice", 3).await, 2);
    assert_eq!(failures(&client), 0);
    assert!(!format!("{:?}", client.rules()).contains(PASSWORD));
}

#[tokio::test]
async fn without_the_password_redis_refuses_and_the_bucket_fails_closed() {
    let redis = server();
    // What the test above passes depends on the password: without it every call fails, and the
    // store's default failure policy (closed) refuses everyone.
    let client = Arc::new(Client::new(per_user_in(&redis.url(), "")).unwrap());
    assert_eq!(admitted(client.clone(), "alice", 3).await, 0);
    assert!(failures(&client) > 0);
}

#[tokio::test]
async fn a_wrong_password_in_the_url_is_never_printed() {
    let redis = server();
    let url = redis.url().replace("redis://", "redis://:wr0ng-s3cret@");
    let config = per_user_in(&url, "");
    let client = Arc::new(Client::new(config.clone()).unwrap());
    assert_eq!(admitted(client.clone(), "alice", 1).await, 0);
    for printed in [format!("{config:?}"), format!("{:?}", client.rules())] {
        assert!(!printed.contains("wr0ng-s3cret"), "{printed}");
        assert!(printed.contains(":***@"), "{printed}");
    }
}

#[test]
fn an_unreadable_password_file_is_a_clear_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere");
    let config = per_user_in(
        "redis://127.0.0.1:1",
        &format!(", password_file: \"{}\"", missing.display()),
    );
    let err = Client::new(config).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "redis.password_file {}: cannot read it",
            missing.display()
        )),
        "{err}"
    );
}
