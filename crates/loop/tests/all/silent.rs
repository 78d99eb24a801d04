//! A report that does not come: the zone's and the region's cores close the interval without
//! it, and what the silent member reported for the interval before stands in for it, one
//! interval only (`ZoneCore::poll`, `RegionCore::poll`).

use crate::support::zone_counts;
use std::sync::Arc;

use spillway_loop::{BucketKey, RegionCore, RulesSnapshot};
use spillway_proto::v1;

/// Unix ms at the start of interval 7 of 1 s.
const START_MS: u64 = 7_000;

fn rules() -> Arc<RulesSnapshot> {
    let yaml = "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s, scope: region }\n";
    Arc::new(RulesSnapshot::parse(1, yaml, "rules.yaml").unwrap())
}

fn zone_report(zone: &str, sequence: u64, offered: u64) -> v1::ZoneReport {
    zone_counts(zone, sequence, offered, 10)
}

#[test]
fn a_zone_that_misses_one_interval_counts_with_its_last_sums() {
    let mut region = RegionCore::new("r1", rules(), START_MS);
    for (member, zone) in [(1, "z1"), (2, "z2"), (3, "z3")] {
        region.join(member, zone);
    }
    let key = BucketKey::new("api", "all");
    // Interval 7: 500/s from each zone, 1.5x the limit.
    for (member, zone) in [(1, "z1"), (2, "z2"), (3, "z3")] {
        region.on_zone_report(member, zone_report(zone, 7, 500), 8_001);
    }
    region.poll(8_010);
    assert_eq!(region.view()[&key].observed_rps, 1_500.0);
    assert!((region.view()[&key].drop_ratio - 1.0 / 3.0).abs() < 1e-6);
    // Interval 8: z3's report is lost. Two graces after its end the interval closes, and z3's
    // 500/s of interval 7 stand in for it: the ratio holds at 1/3, where 1,000/s counted
    // would have been no overload at all.
    region.on_zone_report(1, zone_report("z1", 8, 500), 9_001);
    region.on_zone_report(2, zone_report("z2", 8, 500), 9_001);
    region.poll(9_499);
    region.poll(9_500);
    assert_eq!(region.view()[&key].observed_rps, 1_500.0);
    assert!((region.view()[&key].drop_ratio - 1.0 / 3.0).abs() < 1e-6);
    // Interval 9: z3 is silent again; its last report (7) is two intervals old, so it is left
    // out and the region counts what it heard.
    region.on_zone_report(1, zone_report("z1", 9, 500), 10_001);
    region.on_zone_report(2, zone_report("z2", 9, 500), 10_001);
    region.poll(10_500);
    assert_eq!(region.view()[&key].observed_rps, 1_000.0);
}
