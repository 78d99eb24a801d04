//! Wire messages from broken or hostile senders: whatever counts, sequences and names
//! arrive, the aggregator's and the controller's bookkeeping neither panics nor grows
//! without bound, and what goes back down is a probability and a finite load.

use std::collections::HashMap;

use proptest::prelude::*;
use spillway_control::controller::{RegionCore, Step};
use spillway_control::sums::{Intervals, MAX_AHEAD, Sums};
use spillway_control::timing::Interval;
use spillway_core::algo::Ratio;
use spillway_core::config::load_str;
use spillway_proto::v1;

const RULES: &str = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: g, match: { procedure: /g }, limit: 100/s, scope: global }\n      - { name: z, match: { procedure: /z }, limit: 50/s, scope: zone }\n      - { name: a, match: { procedure: /a }, limit: 10/s, algorithm: adaptive-token-bucket, scope: region }\n";

fn bucket_counts() -> impl Strategy<Value = v1::BucketCounts> {
    (
        prop::sample::select(vec!["g", "z", "a", "", "unknown"]),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        proptest::option::of(any::<u64>()),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(
            |(bucket, offered, allowed, shadow, tail, hosts)| v1::BucketCounts {
                service: "api".into(),
                bucket: bucket.into(),
                offered,
                allowed,
                shadow_dropped: shadow,
                offered_tail: tail,
                hosts,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn an_aggregator_window_stays_bounded_whatever_arrives(
        reports in prop::collection::vec(
            (0u8..6, prop::collection::vec(bucket_counts(), 0..4), any::<bool>()),
            1..200,
        ),
        wild in prop::collection::vec(any::<u64>(), 0..50),
    ) {
        let interval = Interval::from_ms(1000);
        let mut now_ms = 1_800_000_000_000u64;
        let mut window: Intervals<String, Sums> =
            Intervals::new(interval.sequence_at(now_ms) - 1);
        let members: Vec<String> = (0..6).map(|h| format!("h{h}")).collect();
        let mut last_closed = window.closed_through();
        for (i, (host, buckets, far)) in reports.into_iter().enumerate() {
            now_ms += 137;
            let current = interval.sequence_at(now_ms);
            let seq = if far { wild.get(i).copied().unwrap_or(u64::MAX) } else { current - 1 };
            if let Some(sums) = window.accept(seq, format!("h{host}")) {
                sums.add_wire(&buckets);
            }
            for (sequence, _, _) in window.close_ready(now_ms, interval, 250, members.iter()) {
                prop_assert!(sequence > last_closed, "intervals close in order");
                last_closed = sequence;
            }
            prop_assert!(window.open() as u64 <= MAX_AHEAD + 1, "{} open", window.open());
        }
    }

    #[test]
    fn a_controller_sends_probabilities_whatever_its_zones_and_peers_say(
        zones in prop::collection::vec(
            (0u64..3, prop::collection::vec(bucket_counts(), 0..4)),
            1..60,
        ),
        peers in prop::collection::vec(
            (prop::sample::select(vec!["r2", "r3", "r1", ""]), any::<u64>(), any::<bool>(),
             prop::collection::vec(bucket_counts(), 0..3)),
            0..30,
        ),
    ) {
        let config = load_str(RULES, "fuzz.yaml").unwrap();
        let interval = Interval::new(config.control.report_interval);
        let mut now_ms = 1_800_000_000_000u64;
        let mut core = RegionCore::new("r1", interval.sequence_at(now_ms) - 1);
        let members = [0u64, 1, 2];
        let names = ["r1z1", "r1z2", "r1z3"];
        let mut peers = peers.into_iter();
        for (zone, buckets) in zones {
            now_ms += 333;
            let current = interval.sequence_at(now_ms);
            core.on_zone_sums(zone, names[zone as usize], current - 1, &buckets);
            if let Some((region, sequence, near, buckets)) = peers.next() {
                let sequence = if near { current - 1 } else { sequence };
                let sums = v1::RegionSums {
                    region: region.into(),
                    sequence,
                    interval_ms: interval.ms(),
                    buckets,
                };
                core.on_peer_sums(&config, sums, now_ms);
            }
            for step in core.poll(&config, members.iter(), names.iter().copied(), now_ms) {
                if let Step::Instruct { per_zone, .. } = step {
                    let per_zone: HashMap<String, Vec<v1::BucketInstruction>> = per_zone;
                    for instruction in per_zone.values().flatten() {
                        prop_assert!(instruction.drop_ratio <= Ratio::SCALE);
                        prop_assert!(instruction.share.is_none_or(|s| s <= Ratio::SCALE));
                        prop_assert!(instruction.scope_offered_rps.is_finite());
                        prop_assert!(instruction.scope_offered_rps >= 0.0);
                    }
                }
            }
        }
    }
}

#[test]
fn a_peers_sums_from_the_future_do_not_push_its_real_ones_out() {
    let config = load_str(RULES, "fuzz.yaml").unwrap();
    let interval = Interval::new(config.control.report_interval);
    let now_ms = 1_800_000_000_500u64;
    let sequence = interval.sequence_at(now_ms) - 1;
    let mut core = RegionCore::new("r1", sequence - 1);
    let offered = |n: u64| v1::BucketCounts {
        service: "api".into(),
        bucket: "g".into(),
        offered: n,
        ..Default::default()
    };
    core.on_zone_sums(0, "r1z1", sequence, &[offered(500)]);
    let real = v1::RegionSums {
        region: "r2".into(),
        sequence,
        interval_ms: interval.ms(),
        buckets: vec![offered(1_000)],
    };
    core.on_peer_sums(&config, real, now_ms);
    // More bogus intervals than the peer's window keeps, all ahead of the clock.
    for k in 0..20 {
        let bogus = v1::RegionSums {
            region: "r2".into(),
            sequence: sequence + 100 + k,
            interval_ms: interval.ms(),
            buckets: vec![offered(u64::MAX)],
        };
        core.on_peer_sums(&config, bogus, now_ms);
    }
    let later = interval.end_of(sequence) + interval.ms();
    let steps = core.poll(&config, [0u64].iter(), ["r1z1"].into_iter(), later);
    assert!(steps.iter().any(|s| matches!(s, Step::Instruct { .. })));
    let view = core.view()[&spillway_control::BucketKey::new("api", "g")];
    // 500/s here and the peer's real 1,000/s.
    assert_eq!(view.observed_rps, 1_500.0, "{view:?}");
}
