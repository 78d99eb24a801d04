//! A controller's instructions as aggregators of either age read them over real gRPC on
//! loopback: the controller encodes the buckets common to every zone once and copies them into
//! each zone's message, and prost's own decoding (an aggregator's) must read the same message as
//! ever: names and no numbers for an aggregator older than the numbers, numbers for a newer one.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spillway_control::{Controller, ControllerOptions};
use spillway_core::algo::Ratio;
use spillway_link::Target;
use spillway_loop::RulesSnapshot;
use spillway_proto::v1;
use tokio_stream::wrappers::ReceiverStream;

const YAML: &str = "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 3s\nservices:\n  api:\n    buckets:\n      - { name: all, match: { procedure: /all }, limit: 100/s, scope: region }\n      - { name: other, match: { procedure: /other }, limit: 1000/s, scope: region }\n";

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A zone's report of `sequence`: 75 offered to `all` and 10 to `other`, by name (with numbers
/// and the numbers asked for when `ids`).
fn report(zone: &str, sequence: u64, ids: bool) -> v1::ZoneReport {
    let bucket = |name: &str, id: u32, offered: u64| v1::BucketCounts {
        service: "api".into(),
        bucket: name.into(),
        id: if ids { id } else { 0 },
        offered,
        allowed: offered,
        hosts: Some(1),
        ..Default::default()
    };
    v1::ZoneReport {
        zone: zone.into(),
        region: "r1".into(),
        sequence,
        interval_ms: 1_000,
        buckets: vec![bucket("all", 1, 75), bucket("other", 2, 10)],
        clients: 1,
        bucket_ids: ids,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_and_a_new_aggregator_read_their_instructions_as_prost_decodes_them() {
    let rules = Arc::new(RulesSnapshot::parse(1, YAML, "rules.yaml").unwrap());
    let (_rules_tx, rules_rx) = tokio::sync::watch::channel(rules);
    let options = ControllerOptions::new("127.0.0.1:0".parse().unwrap(), "r1", rules_rx);
    let controller = Controller::start(options).await.unwrap();
    let url = format!("http://{}", controller.local_addr());
    let mut streams = Vec::new();
    for (zone, ids) in [("old", false), ("new", true)] {
        let channel = Target::plain(&url).unwrap().connect().await.unwrap();
        let mut client = v1::controller_client::ControllerClient::new(channel);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let inbound = client
            .link_zone(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        streams.push((zone, ids, tx, inbound));
    }
    // Both zones report each interval just ended, until each has, after its first instructions
    // (which carry the names, and may be of an interval before the first report), instructions
    // computed from both reports.
    let mut got: Vec<Vec<v1::Instructions>> = vec![Vec::new(), Vec::new()];
    let counted = |g: &Vec<v1::Instructions>| {
        g.iter()
            .skip(1)
            .any(|i| i.buckets[0].scope_offered_rps == 150.0)
    };
    let deadline = unix_ms() + 15_000;
    while !got.iter().all(counted) && unix_ms() < deadline {
        let sequence = unix_ms() / 1_000 - 1;
        for (zone, ids, tx, _) in &streams {
            tx.send(report(zone, sequence, *ids)).await.unwrap();
        }
        for ((_, _, _, inbound), got) in streams.iter_mut().zip(&mut got) {
            let wait = Duration::from_millis(1_500);
            if let Ok(Ok(Some(message))) = tokio::time::timeout(wait, inbound.message()).await {
                assert!(message.bucket_ids, "the controller takes numbers");
                let instructions = message.instructions.unwrap();
                if !instructions.buckets.is_empty() {
                    got.push(instructions);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(1_000 - unix_ms() % 1_000 + 20)).await;
    }
    let [old, new] = &got[..] else { unreachable!() };
    assert!(counted(old) && counted(new), "instructions: {got:?}");
    let ratio = |b: &v1::BucketInstruction| Ratio::from_raw(b.drop_ratio).as_f64();
    for instructions in old.iter().chain(new) {
        let all = &instructions.buckets[0];
        if all.scope_offered_rps == 150.0 {
            // 150/s offered over the region against 100/s: a third dropped, in both zones.
            assert!((ratio(all) - 1.0 / 3.0).abs() < 0.02, "{all:?}");
        }
        assert_eq!(ratio(&instructions.buckets[1]), 0.0);
    }
    // Older than the numbers: every bucket by name, every time, without a number.
    for instructions in old {
        let names: Vec<(&str, &str, u32)> = instructions
            .buckets
            .iter()
            .map(|b| (b.service.as_str(), b.bucket.as_str(), b.id))
            .collect();
        assert_eq!(names, [("api", "all", 0), ("api", "other", 0)]);
    }
    // Newer: named with their numbers the first time, numbers alone after.
    let named = |i: &v1::Instructions| -> Vec<(String, u32)> {
        i.buckets.iter().map(|b| (b.bucket.clone(), b.id)).collect()
    };
    assert_eq!(named(&new[0]), [("all".into(), 1), ("other".into(), 2)]);
    for later in &new[1..] {
        assert_eq!(named(later), [(String::new(), 1), (String::new(), 2)]);
    }
    // The rules went with the first instructions only.
    assert!(old[0].rules.is_some() && new[0].rules.is_some());
    assert!(old[1..].iter().chain(&new[1..]).all(|i| i.rules.is_none()));
    controller.shutdown().await;
}
