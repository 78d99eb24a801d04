//! The region core's buckets by index: sums kept across intervals and rules changes, buckets
//! that leave the rules, zones that name their buckets in any order.

use super::*;

/// Unix ms at the start of interval 7 of 1 s.
const START_MS: u64 = 7_000;

fn rules(version: u64, buckets: &[&str]) -> Arc<RulesSnapshot> {
    let mut yaml = String::from(
        "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\nservices:\n  api:\n    buckets:\n",
    );
    for name in buckets {
        yaml.push_str(&format!(
            "      - {{ name: {name}, match: {{ procedure: /{name} }}, limit: 100/s, scope: region }}\n"
        ));
    }
    Arc::new(RulesSnapshot::parse(version, &yaml, "rules.yaml").unwrap())
}

fn report(zone: &str, sequence: u64, buckets: &[(&str, u64)]) -> v1::ZoneReport {
    v1::ZoneReport {
        zone: zone.into(),
        region: "r1".into(),
        sequence,
        interval_ms: 1_000,
        buckets: buckets
            .iter()
            .map(|&(bucket, offered)| v1::BucketCounts {
                service: "api".into(),
                bucket: bucket.into(),
                offered,
                allowed: offered,
                hosts: Some(1),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn key(bucket: &str) -> BucketKey {
    BucketKey::new("api", bucket)
}

/// The buckets of the instructions sent to `member`, by name, with their drop ratios.
fn sent_to(steps: &[RegionStep], member: u64) -> Vec<(String, f64)> {
    steps
        .iter()
        .filter_map(|s| match s {
            RegionStep::Send {
                member: m,
                instructions,
            } if *m == member => instructions.instructions.clone(),
            _ => None,
        })
        .flat_map(|i| i.buckets)
        .map(|b| (b.bucket, Ratio::from_raw(b.drop_ratio).as_f64()))
        .collect()
}

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

#[test]
fn a_bucket_keeps_its_sums_across_intervals_and_a_renumbering() {
    let mut region = RegionCore::new("r1", rules(1, &["a", "b"]), START_MS);
    region.join(1, "z1");
    region.join(2, "z2");
    // Interval 7: a at 1.5x its limit, b under it, all in z1.
    region.on_zone_report(1, report("z1", 7, &[("a", 150), ("b", 50)]), 8_001);
    region.on_zone_report(2, report("z2", 7, &[]), 8_002);
    assert_eq!(region.view()[&key("a")].observed_rps, 150.0);
    assert!(near(region.view()[&key("a")].drop_ratio, 1.0 / 3.0));
    // z1 reports interval 8, then new rules put a bucket before both while the interval waits
    // for z2: a and b move to other indices, and the interval's sums move with them.
    region.on_zone_report(1, report("z1", 8, &[("a", 150), ("b", 50)]), 9_001);
    region.set_rules(rules(2, &["n", "a", "b"]), 9_002);
    assert_eq!(region.table.find("api", "a"), Some(1));
    let steps = region.on_zone_report(2, report("z2", 8, &[]), 9_003);
    assert_eq!(region.view()[&key("a")].observed_rps, 150.0);
    assert_eq!(region.view()[&key("b")].observed_rps, 50.0);
    assert_eq!(region.view()[&key("n")].observed_rps, 0.0);
    let sent = sent_to(&steps, 1);
    let names: Vec<&str> = sent.iter().map(|(b, _)| b.as_str()).collect();
    assert_eq!(names, ["n", "a", "b"], "in the new rules' order");
    assert!(near(sent[1].1, 1.0 / 3.0));
    // Interval 9: z1's report is lost; its part of interval 8, renumbered, stands in.
    region.on_zone_report(2, report("z2", 9, &[]), 10_001);
    region.poll(10_500);
    assert_eq!(region.view()[&key("a")].observed_rps, 150.0);
    assert!(near(region.view()[&key("a")].drop_ratio, 1.0 / 3.0));
    // Once computed, an interval's sums are held by the zone's last part alone: shared while
    // the interval waited, never copied.
    region.on_zone_report(1, report("z1", 10, &[("a", 150)]), 11_001);
    region.on_zone_report(2, report("z2", 10, &[]), 11_002);
    let last = region.zones[&1].last.as_ref().unwrap();
    assert_eq!(last.0, 10);
    assert_eq!(Arc::strong_count(&last.1), 1);
}

#[test]
fn a_bucket_removed_by_the_rules_leaves_with_its_counts_and_smoothing() {
    let mut region = RegionCore::new("r1", rules(1, &["a", "b"]), START_MS);
    region.join(1, "z1");
    region.join(2, "z2");
    region.on_zone_report(1, report("z1", 7, &[("a", 150), ("b", 300)]), 8_001);
    region.on_zone_report(2, report("z2", 7, &[]), 8_002);
    assert!(near(region.view()[&key("b")].drop_ratio, 2.0 / 3.0));
    // b leaves the rules while interval 8 waits for z2: its counts of it leave too.
    region.on_zone_report(1, report("z1", 8, &[("a", 150), ("b", 300)]), 9_001);
    region.set_rules(rules(2, &["a"]), 9_002);
    let steps = region.on_zone_report(2, report("z2", 8, &[]), 9_003);
    assert!(!region.view().contains_key(&key("b")));
    assert_eq!(region.view().len(), 1);
    assert_eq!(region.smoothers.len(), 1);
    assert!(
        region.zones[&1]
            .last
            .as_ref()
            .unwrap()
            .1
            .iter()
            .all(|&(i, _)| i == 0)
    );
    assert_eq!(sent_to(&steps, 1).len(), 1);
    // A zone still on the old rules names b: it counts for nothing.
    region.on_zone_report(1, report("z1", 9, &[("b", 300), ("a", 150)]), 10_001);
    let steps = region.on_zone_report(2, report("z2", 9, &[]), 10_002);
    assert_eq!(region.view()[&key("a")].observed_rps, 150.0);
    assert_eq!(sent_to(&steps, 1).len(), 1);
    // b back in the rules starts afresh: no smoothing state survived, nothing was counted.
    region.set_rules(rules(3, &["a", "b"]), 10_500);
    assert_eq!(region.smoothers[1], Smoother::default());
    region.on_zone_report(1, report("z1", 10, &[("a", 150), ("b", 50)]), 11_001);
    region.on_zone_report(2, report("z2", 10, &[]), 11_002);
    assert_eq!(region.view()[&key("b")].observed_rps, 50.0);
    assert_eq!(region.view()[&key("b")].drop_ratio, 0.0);
}

#[test]
fn zones_naming_their_buckets_in_any_order_count_the_same() {
    let mut region = RegionCore::new("r1", rules(1, &["a", "b", "c"]), START_MS);
    region.join(1, "z1");
    region.join(2, "z2");
    // z1 in the rules' order, z2 in another one, with a bucket the rules do not have.
    region.on_zone_report(
        1,
        report("z1", 7, &[("a", 10), ("b", 20), ("c", 30)]),
        8_001,
    );
    let steps = region.on_zone_report(
        2,
        report("z2", 7, &[("c", 300), ("x", 5), ("a", 100), ("b", 200)]),
        8_002,
    );
    let observed = |region: &RegionCore, b: &str| region.view()[&key(b)].observed_rps;
    assert_eq!(
        [observed(&region, "a"), observed(&region, "b")],
        [110.0, 220.0]
    );
    assert_eq!(observed(&region, "c"), 330.0);
    for member in [1, 2] {
        let sent = sent_to(&steps, member);
        let names: Vec<&str> = sent.iter().map(|(b, _)| b.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(near(sent[2].1, 230.0 / 330.0));
    }
    // Next interval each changes its order: z1 names a twice (its counts add up), z2 drops
    // the unknown bucket. The positions remembered from the last report no longer match, and
    // each entry is found by name.
    region.on_zone_report(
        1,
        report("z1", 8, &[("c", 30), ("a", 5), ("b", 20), ("a", 5)]),
        9_001,
    );
    region.on_zone_report(
        2,
        report("z2", 8, &[("a", 100), ("b", 200), ("c", 300)]),
        9_002,
    );
    assert_eq!(observed(&region, "a"), 110.0);
    assert_eq!(observed(&region, "b"), 220.0);
    assert_eq!(observed(&region, "c"), 330.0);
    // And the same order again is found by position.
    region.on_zone_report(
        2,
        report("z2", 9, &[("a", 100), ("b", 200), ("c", 300)]),
        10_001,
    );
    region.on_zone_report(1, report("z1", 9, &[("a", 10)]), 10_002);
    assert_eq!(observed(&region, "a"), 110.0);
    assert_eq!(observed(&region, "c"), 300.0);
}

#[test]
fn indexed_sums_merge_in_order() {
    let table = Table::new(&rules(1, &["a", "b", "c", "d"]).config, "r1");
    let wire = |buckets: &[(&str, u64)]| report("z", 1, buckets).buckets;
    let mut order = Order::default();
    let mut x = IndexedSums::default();
    x.add_wire(
        &table,
        Some(&mut order),
        &wire(&[("d", 4), ("b", 2), ("d", 1)]),
    );
    assert_eq!(
        x.iter().map(|&(i, c)| (i, c.offered)).collect::<Vec<_>>(),
        [(1, 2), (3, 5)]
    );
    let y = IndexedSums::from_wire(&table, &wire(&[("a", 1), ("b", 10), ("c", 100)]));
    x.add(&y);
    assert_eq!(
        x.iter().map(|&(i, c)| (i, c.offered)).collect::<Vec<_>>(),
        [(0, 1), (1, 12), (2, 100), (3, 5)]
    );
    assert_eq!(x.counts(1).hosts, 2);
    assert_eq!(x.offered(3), 5);
    assert_eq!(x.counts_of(&table, &key("z")), Counts::default());
    // By name again, as the peers are sent it.
    let sums = Sums::from_wire(&x.to_wire(&table));
    assert_eq!(sums.offered(&key("b")), 12);
    // Renumbered into a table without b and with a new first bucket.
    let next = Table::new(&rules(2, &["e", "d", "c", "a"]).config, "r1");
    let moved = x.remap(&table.moves_to(&next));
    assert_eq!(
        moved
            .iter()
            .map(|&(i, c)| (i, c.offered))
            .collect::<Vec<_>>(),
        [(1, 5), (2, 100), (3, 1)]
    );
}
