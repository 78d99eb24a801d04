//! Standalone reload from the YAML file: an edit takes effect without a restart, and a broken
//! edit changes nothing.

use std::sync::Arc;
use std::time::Duration;

use spillway_client::{Client, NoHeaders, watch_file};
use spillway_core::pattern::RequestAttrs;

const POLL: Duration = Duration::from_millis(50);

fn yaml(limit: &str) -> String {
    format!(
        "version: 1\nservices:\n  api:\n    buckets:\n      - {{ name: all, limit: {limit}, algorithm: fixed-window }}\n"
    )
}

/// Waits (bounded: 200 polls, 10 s) until the client runs rules version `version`.
async fn wait_for_version(client: &Client, version: u64) -> bool {
    for _ in 0..200 {
        if client.rules().version() >= version {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    false
}

#[tokio::test]
async fn edits_apply_without_restart_and_broken_edits_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spillway.yaml");
    std::fs::write(&path, yaml("1/h")).unwrap();
    let client = Arc::new(Client::from_file(&path).unwrap());
    let watcher = watch_file(client.clone(), path.clone(), POLL);
    let attrs = RequestAttrs::default();
    assert!(client.decide(&attrs, &NoHeaders).forwards());
    assert!(!client.decide(&attrs, &NoHeaders).forwards());

    std::fs::write(&path, yaml("3/h")).unwrap();
    assert!(
        wait_for_version(&client, 2).await,
        "the edit was not applied"
    );
    // A changed bucket starts afresh: three more fit.
    assert!((0..3).all(|_| client.decide(&attrs, &NoHeaders).forwards()));
    assert!(!client.decide(&attrs, &NoHeaders).forwards());

    // A broken file, then a valid one after it: the broken one must have been skipped, since
    // the next version is the valid file's, and until then the 3/h rules held.
    std::fs::write(&path, yaml("5/h").replace("limit", "limt")).unwrap();
    for _ in 0..10 {
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(client.rules().version(), 2, "a broken file was applied");
    assert!(!client.decide(&attrs, &NoHeaders).forwards());
    std::fs::write(&path, yaml("2/h")).unwrap();
    assert!(wait_for_version(&client, 3).await);
    assert_eq!(client.rules().buckets()[0].limit().count.get(), 2);
    watcher.abort();
}
