//! The link carries rules as data: whatever connects to an aggregator receives the
//! controller's services and control section, never its file's text, its comments or its
//! `redis` section; and a linked host runs those services with its own identity and Redis.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{SimClient, quick_backoff, wait_for};
use prost::Message;
use spillway_control::{Aggregator, AggregatorOptions, Controller, ControllerOptions, FileRules};
use spillway_core::config;
use spillway_link::{ClientLink, LinkOptions};
use spillway_proto::v1;
use spillway_proto::v1::aggregator_client::AggregatorClient;

/// The controller's file: a comment, a password in its Redis URL, and a `store: redis` bucket
/// beside a drop-ratio one.
const CONTROLLER_FILE: &str = "# secret comment: the on-call rota is in the vault
version: 1
control:
  report_interval: 200ms
  instruction_ttl: 1s
services:
  api:
    buckets:
      - { name: global, limit: 100/s, scope: global }
      - { name: per-user, limit: 5/s, algorithm: token-bucket, store: redis, match: { user: \"*\" } }
redis: { url: \"redis://:hunter2@127.0.0.1:6379\" }
";

/// A host's own file: its own identity and its own Redis, no services until the rules come.
const HOST_FILE: &str = "version: 1
identity:
  user: header:x-account
control:
  report_interval: 200ms
  instruction_ttl: 1s
redis: { url: redis://127.0.0.1:6390, password_file: /run/secrets/redis-password }
";

/// What must never cross the link.
fn assert_no_secret(what: &str, text: &str) {
    for secret in ["secret comment", "vault", "hunter2", "redis://", "6379"] {
        assert!(!text.contains(secret), "{what} carries {secret:?}: {text}");
    }
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with("redis")),
        "{what} carries a redis section: {text}"
    );
}

struct Plane {
    _dir: tempfile::TempDir,
    controller: Controller,
    aggregator: Aggregator,
}

async fn plane() -> Plane {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, CONTROLLER_FILE).unwrap();
    let rules = FileRules::load(&path)
        .unwrap()
        .watch(Duration::from_millis(50));
    let mut options = ControllerOptions::new("127.0.0.1:0".parse().unwrap(), "r1", rules);
    options.backoff = quick_backoff();
    let controller = Controller::start(options).await.unwrap();
    let mut options = AggregatorOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        "r1",
        "r1z1",
        format!("http://{}", controller.local_addr()),
    );
    options.backoff = quick_backoff();
    let aggregator = Aggregator::start(options).await.unwrap();
    Plane {
        _dir: dir,
        controller,
        aggregator,
    }
}

/// A report of nothing, as any client may send, every 200 ms.
fn report(sequence: u64) -> v1::Report {
    v1::Report {
        surge: false,
        host_id: "outsider".into(),
        zone: "r1z1".into(),
        region: "r1".into(),
        rules_version: 0,
        sequence,
        interval_ms: 200,
        buckets: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_an_aggregator_receives_no_comment_and_no_redis_section() {
    let plane = plane().await;
    let channel = tonic::transport::Endpoint::from_shared(format!(
        "http://{}",
        plane.aggregator.local_addr()
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let reporter = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(200));
        loop {
            every.tick().await;
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            if tx.send(report(now_ms / 200)).await.is_err() {
                return;
            }
        }
    });
    let reports = tokio_stream::wrappers::ReceiverStream::new(rx);
    let mut stream = AggregatorClient::new(channel)
        .link(reports)
        .await
        .unwrap()
        .into_inner();

    let rules = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let instructions = stream
                .message()
                .await
                .unwrap()
                .expect("the stream stays open");
            if instructions.rules.is_some() {
                return instructions;
            }
        }
    })
    .await
    .expect("rules within 30 s");

    // Every byte that came down, and each field on its own.
    let bytes = rules.encode_to_vec();
    assert_no_secret("the message", &String::from_utf8_lossy(&bytes));
    let carried = rules.rules.unwrap();
    assert_no_secret("yaml", &carried.yaml);
    assert_no_secret("json", &carried.json);
    // The data is the control section and the services, and says what the file said of them.
    let json: serde_json::Value = serde_json::from_str(&carried.json).unwrap();
    let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["control", "services"]);
    let file = config::load_str(CONTROLLER_FILE, "rules.yaml").unwrap();
    let data = spillway_loop::LinkRules::from_json(&carried.json).unwrap();
    let own = config::load_str(HOST_FILE, "host.yaml").unwrap();
    let ran = data.with_own(&own, "received").unwrap();
    assert_eq!(ran.services, file.services);
    assert_eq!(ran.control, file.control);

    reporter.abort();
    drop(stream);
    plane.aggregator.shutdown().await;
    plane.controller.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_host_runs_the_received_services_with_its_own_identity_and_redis() {
    let plane = plane().await;
    let client = Arc::new(SimClient::new("h1".into(), "r1", "r1z1", HOST_FILE));
    let own = client.running();
    assert!(own.services.is_empty());
    // Twice the limit of `global`, a bucket only the controller's rules have.
    client.set_rate("global", 200.0);
    let mut options = LinkOptions::new(
        format!("http://{}", plane.aggregator.local_addr()),
        "h1",
        "r1",
        "r1z1",
    );
    options.backoff = quick_backoff();
    let link = ClientLink::spawn(options, client.clone()).unwrap();

    wait_for(
        Duration::from_secs(30),
        "the host runs the controller's rules and drops half of `global`",
        || client.rules_version() > 0 && client.drops("global", 0.5),
    )
    .await;

    let running = client.running();
    let file = config::load_str(CONTROLLER_FILE, "rules.yaml").unwrap();
    assert_eq!(running.services, file.services);
    assert_eq!(running.control, file.control);
    // Its own identity and Redis, not the controller's.
    assert_eq!(running.identity, own.identity);
    assert_eq!(running.redis, own.redis);
    assert!(!format!("{running:?}").contains("hunter2"));
    let received = client.received_rules().unwrap();
    assert_no_secret("yaml", &received.yaml);
    assert_no_secret("json", &received.json);
    // The controller shows the host on the version it applied.
    let version = client.rules_version();
    wait_for(
        Duration::from_secs(10),
        "the controller sees the version",
        || {
            plane
                .controller
                .hosts()
                .iter()
                .any(|h| h.rules_version == version)
        },
    )
    .await;

    link.shutdown().await;
    plane.aggregator.shutdown().await;
    plane.controller.shutdown().await;
}
