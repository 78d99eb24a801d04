//! `SPILLWAY_REDIS_PASSWORD`: without a `password_file`, the process's environment
//! gives the Redis password. One test in this binary: it sets the variable for its process.
#![cfg(feature = "redis")]

use std::sync::Arc;

use crate::redis_auth::{PASSWORD, admitted, failures, per_user_in, server};
use spillway_client::Client;

#[tokio::test]
async fn the_environment_gives_the_password_when_the_file_names_none() {
    let redis = server();
    // SAFETY: the only test of this binary sets the variable before anything else runs that
    // reads the environment (the runtime's own threads do not).
    unsafe { std::env::set_var(spillway_redis::PASSWORD_ENV, PASSWORD) };
    let client = Arc::new(Client::new(per_user_in(&redis.url(), "")).unwrap());
    assert_eq!(admitted(client.clone(), "alice", 3).await, 2);
    assert_eq!(failures(&client), 0);
    assert!(!format!("{:?}", client.rules()).contains(PASSWORD));
}
