//! Two aggregators of one zone, as the region's core sees them: each is a part of its zone's
//! sums, the parts add up per interval, a part missing for an interval stands in with its last
//! one unless its hosts moved to the other aggregator, a zone's adaptive share is split between
//! its aggregators by their load, and an aggregator that is gone counts for nothing
//! (`RegionCore::on_zone_report`, `RegionCore::poll`).

use crate::support::zone_counts;
use std::sync::Arc;

use spillway_core::algo::Ratio;
use spillway_loop::{BucketKey, RegionCore, RegionStep, RulesSnapshot};
use spillway_proto::v1;

/// Unix ms at the start of interval 7 of 1 s.
const START_MS: u64 = 7_000;

fn rules(algorithm: &str) -> Arc<RulesSnapshot> {
    let yaml = format!(
        "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\nservices:\n  api:\n    buckets:\n      - {{ name: all, limit: 1000/s, scope: region, algorithm: {algorithm} }}\n"
    );
    Arc::new(RulesSnapshot::parse(1, &yaml, "rules.yaml").unwrap())
}

/// Aggregator `zone`'s sums of interval `sequence`: `offered` requests, and the hosts it
/// reports for the first time.
fn zone_report(zone: &str, sequence: u64, offered: u64, new_hosts: &[&str]) -> v1::ZoneReport {
    v1::ZoneReport {
        hosts: new_hosts
            .iter()
            .map(|h| v1::HostStatus {
                host_id: (*h).into(),
                rules_version: 1,
            })
            .collect(),
        ..zone_counts(zone, sequence, offered, 2)
    }
}

fn key() -> BucketKey {
    BucketKey::new("api", "all")
}

/// Zone z1 on aggregators 1 (hosts a, b) and 2 (hosts c, d), zone z2 on aggregator 3, each
/// reporting 500/s of interval 7: 1.5 times the region's limit.
fn region_of_pairs(algorithm: &str) -> RegionCore {
    let mut region = RegionCore::new("r1", rules(algorithm), START_MS);
    for (member, zone) in [(1, "z1"), (2, "z1"), (3, "z2")] {
        region.join(member, zone);
    }
    region.on_zone_report(1, zone_report("z1", 7, 500, &["a", "b"]), 8_001);
    region.on_zone_report(2, zone_report("z1", 7, 500, &["c", "d"]), 8_001);
    region.on_zone_report(3, zone_report("z2", 7, 500, &["e", "f"]), 8_001);
    region.poll(8_010);
    region
}

#[test]
fn two_aggregators_of_one_zone_add_up() {
    let region = region_of_pairs("drop-ratio");
    assert_eq!(region.view()[&key()].observed_rps, 1_500.0);
    assert!((region.view()[&key()].drop_ratio - 1.0 / 3.0).abs() < 1e-6);
    assert_eq!(region.hosts().len(), 6, "every host once");
}

#[test]
fn an_aggregator_that_misses_an_interval_counts_with_its_own_last_part() {
    let mut region = region_of_pairs("drop-ratio");
    // Interval 8: aggregator 2's report is lost; its zone's other aggregator reported. Its own
    // 500/s of interval 7 stand in for it, not nothing (the zone heard from is not the zone
    // whole) and not the zone's 1,000/s.
    region.on_zone_report(1, zone_report("z1", 8, 500, &[]), 9_001);
    region.on_zone_report(3, zone_report("z2", 8, 500, &[]), 9_001);
    region.poll(9_500);
    assert_eq!(region.view()[&key()].observed_rps, 1_500.0);
}

#[test]
fn a_host_that_moved_to_the_other_aggregator_counts_once() {
    let mut region = region_of_pairs("drop-ratio");
    // Aggregator 2 stalls (its stream stays open) and its hosts c and d move to aggregator 1,
    // which reports them for interval 8 with its own: 1,000/s. Aggregator 2's last part
    // counted them; standing in for its missing report it would count them twice (2,000/s).
    region.on_zone_report(1, zone_report("z1", 8, 1_000, &["c", "d"]), 9_001);
    region.on_zone_report(3, zone_report("z2", 8, 500, &[]), 9_001);
    region.poll(9_500);
    assert_eq!(region.view()[&key()].observed_rps, 1_500.0);
    assert!((region.view()[&key()].drop_ratio - 1.0 / 3.0).abs() < 1e-6);
    assert_eq!(region.moved_hosts(), 2);
    let mut hosts: Vec<(String, String)> = region
        .hosts()
        .into_iter()
        .map(|h| (h.host_id, h.zone))
        .collect();
    hosts.sort();
    assert_eq!(hosts.len(), 6, "each host once: {hosts:?}");
}

#[test]
fn an_aggregator_that_is_gone_counts_for_nothing_and_its_hosts_count_at_the_other() {
    let mut region = region_of_pairs("drop-ratio");
    // Aggregator 2 is killed during interval 8: its stream ends, and its hosts report
    // interval 8 to aggregator 1. The interval closes as soon as the aggregators still
    // there reported it.
    region.leave(2, 8_500);
    region.on_zone_report(1, zone_report("z1", 8, 1_000, &["c", "d"]), 9_001);
    region.on_zone_report(3, zone_report("z2", 8, 500, &[]), 9_002);
    assert_eq!(
        region.view()[&key()].observed_rps,
        1_500.0,
        "computed on the last report, without waiting for the one that is gone"
    );
    assert!((region.view()[&key()].drop_ratio - 1.0 / 3.0).abs() < 1e-6);
}

#[test]
fn a_zones_adaptive_share_is_split_between_its_aggregators_by_their_load() {
    let mut region = RegionCore::new("r1", rules("adaptive-token-bucket"), START_MS);
    for (member, zone) in [(1, "z1"), (2, "z1"), (3, "z2")] {
        region.join(member, zone);
    }
    region.on_zone_report(1, zone_report("z1", 7, 300, &["a"]), 8_001);
    region.on_zone_report(2, zone_report("z1", 7, 100, &["b"]), 8_001);
    let steps = region.on_zone_report(3, zone_report("z2", 7, 400, &["c"]), 8_001);
    let mut steps = steps;
    steps.extend(region.poll(8_010));
    let share = |member: u64| -> f64 {
        steps
            .iter()
            .rev()
            .find_map(|s| match s {
                RegionStep::Send {
                    member: m,
                    instructions,
                } if *m == member => instructions.instructions.as_ref(),
                _ => None,
            })
            .and_then(|i| i.buckets.first())
            .and_then(|b| b.share)
            .map(|raw| Ratio::from_raw(raw).as_f64())
            .unwrap_or_else(|| panic!("instructions for aggregator {member}: {steps:?}"))
    };
    // z1 offered half the region's 800/s, z2 the other half; z1's half goes 3:1 to its
    // aggregators, which split it among their own hosts.
    assert!((share(1) - 0.375).abs() < 1e-6, "{}", share(1));
    assert!((share(2) - 0.125).abs() < 1e-6, "{}", share(2));
    assert!((share(3) - 0.5).abs() < 1e-6, "{}", share(3));
}
