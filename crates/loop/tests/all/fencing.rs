//! Fencing across the three cores: a region's new leader (epoch 5) and its old one, paused past
//! its lease and awake again (epoch 4), both compute the same interval; the zone relays only the
//! new leader's instructions, and a host that got the old one's straight (a zone that had not
//! heard of epoch 5) drops them once it has.

use crate::support::zone_counts;
use std::sync::Arc;

use spillway_core::algo::Ratio;
use spillway_loop::{
    HostCore, HostId, HostStep, HostTime, RegionCore, RegionStep, RulesSnapshot, ZoneCore, ZoneStep,
};
use spillway_proto::v1;

const YAML: &str = "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 3s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s, scope: region }\n";

fn rules() -> Arc<RulesSnapshot> {
    Arc::new(RulesSnapshot::parse(1, YAML, "rules.yaml").unwrap())
}

fn zone_report(sequence: u64, offered: u64) -> v1::ZoneReport {
    zone_counts("z1", sequence, offered, 1)
}

/// The instructions `region` sends zone `z1` for interval 7, with `offered` requests in it.
fn instruct(region: &mut RegionCore, offered: u64) -> v1::ZoneInstructions {
    region.join(1, "z1");
    let steps = region.on_zone_report(1, zone_report(7, offered), 8_001);
    let steps = [steps, region.poll(8_010)].concat();
    steps
        .into_iter()
        .find_map(|s| match s {
            RegionStep::Send { instructions, .. } => Some(instructions),
            _ => None,
        })
        .expect("interval 7 computed")
}

fn ratio_of(instructions: &v1::Instructions) -> f64 {
    Ratio::from_raw(instructions.buckets[0].drop_ratio).as_f64()
}

#[test]
fn only_the_newest_leaders_instructions_reach_the_hosts() {
    let mut leader = RegionCore::new("r1", rules(), 7_000);
    leader.set_epoch(5);
    // The paused leader: it saw the load before the surge.
    let mut paused = RegionCore::new("r1", rules(), 7_000);
    paused.set_epoch(4);
    let new = instruct(&mut leader, 1_500);
    let old = instruct(&mut paused, 900);
    assert_eq!(new.instructions.as_ref().unwrap().epoch, 5);
    assert_eq!(old.instructions.as_ref().unwrap().epoch, 4);
    assert!((ratio_of(new.instructions.as_ref().unwrap()) - 1.0 / 3.0).abs() < 1e-6);
    assert_eq!(ratio_of(old.instructions.as_ref().unwrap()), 0.0);

    let mut zone = ZoneCore::new("r1", "z1", 7_000);
    zone.join("h1", 1);
    let mut host = HostCore::new(
        HostId {
            host_id: "h1".into(),
            region: "r1".into(),
            zone: "z1".into(),
        },
        &rules().config,
        1,
    );
    let at = |ms: u64| HostTime {
        clock: ms * 1_000_000,
        unix_ns: ms * 1_000_000,
    };
    let relayed = |steps: Vec<ZoneStep>| -> Vec<v1::Instructions> {
        steps
            .into_iter()
            .filter_map(|s| match s {
                ZoneStep::Send { instructions, .. } => Some(instructions),
                ZoneStep::Forward(_) => None,
            })
            .collect()
    };
    // The new leader's instructions reach the host; then the old one's arrive and stop at the zone.
    let to_host = relayed(zone.on_instructions(8_020, new));
    assert_eq!(to_host.len(), 1);
    let applied = host.on_instructions(at(8_030), to_host[0].clone());
    assert!(applied.iter().any(|s| matches!(
        s,
        HostStep::DropRatio { ratio, .. } if (ratio.as_f64() - 1.0 / 3.0).abs() < 1e-6
    )));
    assert!(relayed(zone.on_instructions(8_040, old.clone())).is_empty());
    assert_eq!(zone.fence().dropped(), 1);
    // A host that moved to an aggregator that had not heard of epoch 5 gets epoch 4's: it
    // drops them itself.
    let mut unfenced = ZoneCore::new("r1", "z1", 7_000);
    unfenced.join("h1", 2);
    let stale = relayed(unfenced.on_instructions(8_050, old));
    assert_eq!(stale.len(), 1);
    assert!(host.on_instructions(at(8_060), stale[0].clone()).is_empty());
    assert_eq!(host.fence().dropped(), 1);
    assert_eq!(host.fence().epoch(), 5);
}
