//! A client that stops mid-interval, over real gRPC on loopback: its link's last report, of what
//! it counted so far, reaches the aggregator before the stream ends, and counts as counted.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::{Fleet, close, wait_for};

const YAML: &str = "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 3s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000000/s, scope: region }\n";

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stopping_mid_interval_counts_what_it_offered_until_then() {
    // Two clients of one zone at 100/s each; the second stops halfway through an interval. That
    // interval's load is 100 + 50: its last report lost with the stream (the link returned
    // without waiting for it to leave) counted 100, and scaled up to a whole interval 200.
    let mut fleet = Fleet::start(YAML, 1, 1, 2).await;
    fleet.wait_linked().await;
    for client in &fleet.clients {
        client.set_rate("all", 100.0);
    }
    let observed = |fleet: &Fleet| {
        fleet
            .controller_of(0)
            .buckets()
            .values()
            .next()
            .map_or(0.0, |v| v.observed_rps)
    };
    wait_for(Duration::from_secs(20), "the controller sees 200/s", || {
        close(observed(&fleet), 200.0, 5.0)
    })
    .await;
    // Halfway through an interval (intervals are aligned to the wall clock).
    tokio::time::sleep(Duration::from_millis((1_500 - unix_ms() % 1_000) % 1_000)).await;
    let stopped_at = unix_ms();
    fleet.links.remove(1).shutdown().await;
    // What the controller saw of each interval from then on, in order.
    let mut seen: Vec<f64> = Vec::new();
    while unix_ms() < stopped_at + 3_000 {
        let now = observed(&fleet);
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "stopped {} ms into its interval; seen {seen:?}",
        stopped_at % 1_000
    );
    assert!(
        seen.iter().any(|&o| close(o, 150.0, 15.0)),
        "no interval counted the stopped client's half: {seen:?}"
    );
    assert!(
        seen.last().is_some_and(|&o| close(o, 100.0, 5.0)),
        "{seen:?}"
    );
    fleet.shutdown().await;
}
