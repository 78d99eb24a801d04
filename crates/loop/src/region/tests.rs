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
    let mut names = Dictionary::default();
    let mut x = IndexedSums::default();
    x.add_wire(
        &table,
        &mut names,
        true,
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

/// A report of interval `sequence` from an aggregator that numbers its buckets: `(bucket,
/// number, offered)`, by number alone when `bucket` is empty.
fn numbered(zone: &str, sequence: u64, buckets: &[(&str, u32, u64)]) -> v1::ZoneReport {
    v1::ZoneReport {
        bucket_ids: true,
        buckets: buckets
            .iter()
            .map(|&(bucket, id, offered)| v1::BucketCounts {
                service: if bucket.is_empty() { "" } else { "api" }.into(),
                bucket: bucket.into(),
                id,
                offered,
                allowed: offered,
                hosts: Some(1),
                ..Default::default()
            })
            .collect(),
        ..report(zone, sequence, &[])
    }
}

/// The instructions sent to `member`: each bucket's number, name and drop ratio (to 0.01).
fn sent_ids(steps: &[RegionStep], member: u64) -> Vec<(u32, String, f64)> {
    steps
        .iter()
        .filter_map(|s| match s {
            RegionStep::Send {
                member: m,
                instructions,
            } if *m == member => {
                assert!(instructions.bucket_ids, "the controller takes numbers");
                instructions.instructions.clone()
            }
            _ => None,
        })
        .flat_map(|i| i.buckets)
        .map(|b| {
            let ratio = Ratio::from_raw(b.drop_ratio).as_f64();
            assert_eq!(b.service.is_empty(), b.bucket.is_empty());
            (b.id, b.bucket, (ratio * 100.0).round() / 100.0)
        })
        .collect()
}

fn named(entries: &[(u32, &str, f64)]) -> Vec<(u32, String, f64)> {
    entries
        .iter()
        .map(|&(id, bucket, ratio)| (id, bucket.to_owned(), ratio))
        .collect()
}

#[test]
fn reports_by_number_count_as_by_name_and_a_number_never_named_is_skipped() {
    let mut region = RegionCore::new("r1", rules(1, &["a", "b"]), START_MS);
    region.join(1, "z1");
    // Numbered in another order than the rules', named the first time.
    region.on_zone_report(1, numbered("z1", 7, &[("b", 1, 50), ("a", 2, 150)]), 8_001);
    assert_eq!(region.view()[&key("a")].observed_rps, 150.0);
    assert_eq!(region.view()[&key("b")].observed_rps, 50.0);
    // By number alone, with a number the stream never named.
    let entries = [("", 1, 60), ("", 9, 1_000), ("", 2, 120)];
    region.on_zone_report(1, numbered("z1", 8, &entries), 9_001);
    assert_eq!(region.view()[&key("a")].observed_rps, 120.0);
    assert_eq!(region.view()[&key("b")].observed_rps, 60.0);
    assert_eq!(region.unbound_ids(), 1);
    let by_number = |id| v1::BucketCounts {
        id,
        ..Default::default()
    };
    assert_eq!(region.bucket_names(1, &by_number(2)), Some(("api", "a")));
    assert_eq!(region.bucket_names(1, &by_number(9)), None);
    // An aggregator older than the numbers, on another stream, names every entry.
    region.join(2, "z2");
    region.on_zone_report(1, numbered("z1", 9, &[("", 2, 100)]), 10_001);
    region.on_zone_report(2, report("z2", 9, &[("a", 50)]), 10_002);
    assert_eq!(region.view()[&key("a")].observed_rps, 150.0);
    // Numbers are the stream's own: the other stream's 2 means nothing here.
    region.on_zone_report(2, numbered("z2", 10, &[("", 2, 100)]), 11_001);
    assert_eq!(region.unbound_ids(), 2);
    // Renumbered rules: the stream's numbers keep their buckets; b, gone from the rules, counts
    // for nothing, and counts again when it comes back.
    region.set_rules(rules(2, &["c", "a"]), 11_500);
    region.on_zone_report(1, numbered("z1", 11, &[("", 1, 70), ("", 2, 130)]), 12_001);
    region.on_zone_report(2, report("z2", 11, &[]), 12_002);
    assert_eq!(region.view()[&key("a")].observed_rps, 130.0);
    assert!(!region.view().contains_key(&key("b")));
    region.set_rules(rules(3, &["b", "c", "a"]), 12_500);
    region.on_zone_report(1, numbered("z1", 12, &[("", 1, 70), ("", 2, 130)]), 13_001);
    region.on_zone_report(2, report("z2", 12, &[]), 13_002);
    assert_eq!(region.view()[&key("b")].observed_rps, 70.0);
    assert_eq!(region.unbound_ids(), 2);
}

#[test]
fn instructions_name_a_bucket_once_per_stream_to_an_aggregator_that_takes_numbers() {
    let mut region = RegionCore::new("r1", rules(1, &["a", "b"]), START_MS);
    region.join(1, "z1");
    region.join(2, "z2");
    let interval = |region: &mut RegionCore, sequence: u64| {
        let at = (sequence + 1) * 1_000 + 1;
        let mut steps = region.on_zone_report(1, numbered("z1", sequence, &[("a", 1, 150)]), at);
        steps.extend(region.on_zone_report(2, report("z2", sequence, &[("b", 50)]), at + 1));
        steps
    };
    let first = interval(&mut region, 7);
    assert_eq!(sent_ids(&first, 1), named(&[(1, "a", 0.33), (2, "b", 0.0)]));
    // An aggregator older than the numbers gets names alone, every time.
    let old = named(&[(0, "a", 0.33), (0, "b", 0.0)]);
    assert_eq!(sent_ids(&first, 2), old);
    let second = interval(&mut region, 8);
    assert_eq!(sent_ids(&second, 1), named(&[(1, "", 0.33), (2, "", 0.0)]));
    assert_eq!(sent_ids(&second, 2), old);
    // Instructions that could not be sent: the names they carried go again.
    region.send_failed(1, &sent_message(&first, 1));
    let third = interval(&mut region, 9);
    assert_eq!(sent_ids(&third, 1), named(&[(1, "a", 0.33), (2, "b", 0.0)]));
    let fourth = interval(&mut region, 10);
    assert_eq!(sent_ids(&fourth, 1), named(&[(1, "", 0.33), (2, "", 0.0)]));
    // New rules renumber the buckets: every name again.
    region.set_rules(rules(2, &["c", "b", "a"]), 11_500);
    let fifth = interval(&mut region, 11);
    let renamed = named(&[(1, "c", 0.0), (2, "b", 0.0), (3, "a", 0.33)]);
    assert_eq!(sent_ids(&fifth, 1), renamed);
    // A new stream of the same zone starts afresh.
    region.leave(1, 12_100);
    region.join(3, "z1");
    let at = 13_001;
    region.on_zone_report(3, numbered("z1", 12, &[("a", 1, 150)]), at);
    let sixth = region.on_zone_report(2, report("z2", 12, &[("b", 50)]), at + 1);
    assert_eq!(sent_ids(&sixth, 3), renamed);
}

fn sent_message(steps: &[RegionStep], member: u64) -> v1::ZoneInstructions {
    steps
        .iter()
        .find_map(|s| match s {
            RegionStep::Send {
                member: m,
                instructions,
            } if *m == member => Some(instructions.clone()),
            _ => None,
        })
        .expect("instructions for the member")
}

/// One global bucket `g` of 900/s, 1 s intervals.
fn global_rules() -> Arc<RulesSnapshot> {
    let yaml = "version: 1\ncontrol:\n  report_interval: 1s\n  instruction_ttl: 5s\nservices:\n  api:\n    buckets:\n      - { name: g, match: { procedure: /g }, limit: 900/s, scope: global }\n";
    Arc::new(RulesSnapshot::parse(1, yaml, "rules.yaml").unwrap())
}

/// A peer region's sums of `g` for one interval.
fn peer(region: &str, sequence: u64, offered: u64) -> v1::RegionSums {
    v1::RegionSums {
        region: region.into(),
        sequence,
        interval_ms: 1_000,
        buckets: report("", sequence, &[("g", offered)]).buckets,
    }
}

/// Region r1 of [`global_rules`] with zones z1-z3 joined on streams 1-3.
fn three_zone_region() -> RegionCore {
    let mut region = RegionCore::new("r1", global_rules(), START_MS);
    for member in 1..=3 {
        region.join(member, &format!("z{member}"));
    }
    region
}

/// Zones z1-z3 (streams 1-3) report `offered` each for every (interval, offered) of `loads`,
/// a millisecond after its end; the steps that follow.
fn three_zones(region: &mut RegionCore, loads: &[(u64, u64)]) -> Vec<RegionStep> {
    let mut steps = Vec::new();
    for &(sequence, offered) in loads {
        let at = (sequence + 1) * 1_000 + 1;
        for member in 1..=3 {
            let zone = format!("z{member}");
            steps.extend(region.on_zone_report(
                member,
                report(&zone, sequence, &[("g", offered)]),
                at,
            ));
        }
    }
    steps
}

/// The drop ratio of `g` in the last instructions sent to zone 1.
fn ratio_of(steps: &[RegionStep]) -> Option<f64> {
    sent_to(steps, 1)
        .into_iter()
        .rfind(|(b, _)| b == "g")
        .map(|(_, r)| r)
}

#[test]
fn a_peer_late_with_a_steps_interval_counts_at_the_step_in_the_answers_to_surges() {
    let mut region = three_zone_region();
    // Intervals 7 and 8: 150/s here and 150/s at r2, a third of the limit.
    three_zones(&mut region, &[(7, 50)]);
    region.on_peer_sums(peer("r2", 7, 150), 8_010);
    three_zones(&mut region, &[(8, 50)]);
    region.on_peer_sums(peer("r2", 8, 150), 9_010);
    // Interval 9: a 15x step everywhere; r2 is late with its sums of it.
    three_zones(&mut region, &[(9, 750)]);
    assert_eq!(region.rose[&9].len(), 1, "the step's rise is kept");
    // In interval 10 the zones' guards report the load now, as high as in 9: no rise since.
    let mut steps = Vec::new();
    for member in 1..=3 {
        let mut surge = report(&format!("z{member}"), 10, &[("g", 750)]);
        surge.surge = true;
        steps.extend(region.on_zone_report(member, surge, 10_100));
    }
    steps.extend(region.poll(10_120));
    // r2's sums of 8 stand in for its 10, risen 15 times like this region's: 4,500/s in all.
    let ratio = ratio_of(&steps).expect("the surge reports are answered");
    assert!(
        near(ratio, 1.0 - 900.0 / 4_500.0),
        "answered {ratio}; r2 counted at its load before the step would be {}",
        1.0 - 900.0 / 2_400.0
    );
}

#[test]
fn a_peer_two_intervals_behind_a_ramp_counts_at_both_rises() {
    let mut region = three_zone_region();
    // Interval 7: 150/s in each region. Then this region's load doubles into 8 and rises
    // four times into 9. r2 reports 8 and is late with 9; r3's sums of 8 were lost.
    three_zones(&mut region, &[(7, 50)]);
    region.on_peer_sums(peer("r2", 7, 150), 8_010);
    region.on_peer_sums(peer("r3", 7, 150), 8_010);
    three_zones(&mut region, &[(8, 100)]);
    region.on_peer_sums(peer("r2", 8, 300), 9_010);
    let steps = three_zones(&mut region, &[(9, 400)]);
    // The provisional instruction at 9's close: r2 at 300 x 4, r3 at 150 x 2 x 4, 3,600/s.
    let ratio = ratio_of(&steps).expect("a provisional instruction");
    assert_eq!(region.provisionals(), 1);
    assert!(
        near(ratio, 1.0 - 900.0 / 3_600.0),
        "instructed {ratio}; r3 scaled by the last rise alone would be {}",
        1.0 - 900.0 / 3_000.0
    );
}

#[test]
fn a_peer_whose_sums_before_a_step_were_lost_counts_at_the_step_in_the_computed_instructions() {
    let mut region = three_zone_region();
    // r2 at 150/s in interval 7; its sums of 8 are lost, so interval 9 does not wait for it.
    three_zones(&mut region, &[(7, 50)]);
    region.on_peer_sums(peer("r2", 7, 150), 8_010);
    three_zones(&mut region, &[(8, 50)]);
    let steps = three_zones(&mut region, &[(9, 750)]);
    // Interval 9, a 15x step here, is computed at once: r2's sums of 7, risen 15 times.
    assert_eq!(region.provisionals(), 0, "nothing was awaited");
    let ratio = ratio_of(&steps).expect("interval 9 is instructed");
    assert!(
        near(ratio, 1.0 - 900.0 / 4_500.0),
        "instructed {ratio}; r2 at its load before the step would be {}",
        1.0 - 900.0 / 2_400.0
    );
}

#[test]
fn a_zone_report_lost_in_a_steps_interval_counts_that_zone_at_the_others_rise() {
    let mut region = three_zone_region();
    three_zones(&mut region, &[(7, 50), (8, 50)]);
    // Interval 9: a 15x step in every zone; z3's report of it is lost.
    for member in 1..=2 {
        let zone = format!("z{member}");
        region.on_zone_report(member, report(&zone, 9, &[("g", 750)]), 10_001);
    }
    let step = 1.0 - 900.0 / 2_250.0;
    let wait = 1_000 / LATE_ZONE_WAIT;
    assert_eq!(ratio_of(&region.poll(10_000 + wait - 1)), None);
    // z3 stands in at its load of 8, risen 15 times like the others': 2,250/s.
    let early = ratio_of(&region.poll(10_000 + wait)).expect("instructed without z3");
    assert!(near(early, step), "instructed {early} without z3");
    assert_eq!(region.provisionals(), 1);
    assert_eq!(
        ratio_of(&region.poll(10_000 + wait + 10)),
        None,
        "once per interval"
    );
    // Two graces after the end the interval closes without z3, counted the same way.
    let computed = ratio_of(&region.poll(10_500)).expect("interval 9 is computed");
    assert!(
        near(computed, step),
        "computed {computed}; z3 at its load before the step would be {}",
        1.0 - 900.0 / 1_550.0
    );
    // With every zone in on time, nothing goes out early.
    three_zones(&mut region, &[(10, 750)]);
    assert_eq!(ratio_of(&region.poll(11_000 + wait)), None);
    assert_eq!(region.provisionals(), 1);
}
