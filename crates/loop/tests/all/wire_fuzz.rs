//! Wire messages from broken or hostile senders: whatever counts, sequences, intervals and names
//! arrive, the hosts', aggregators' and controllers' cores neither panic nor grow without bound,
//! and what goes back down is a probability and a finite load.

use std::sync::Arc;

use proptest::prelude::*;
use prost::Message;
use spillway_core::algo::Ratio;
use spillway_core::config::load_str;
use spillway_core::counters::Snapshot;
use spillway_loop::sums::{Intervals, MAX_AHEAD};
use spillway_loop::{
    BucketKey, DecodeRules, HostCore, HostId, HostStep, HostTime, Interval, LinkRules, RegionCore,
    RegionStep, RulesSnapshot, Sums, ZoneCore, ZoneStep,
};
use spillway_proto::v1;

const RULES: &str = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: g, match: { procedure: /g }, limit: 100/s, scope: global }\n      - { name: z, match: { procedure: /z }, limit: 50/s, scope: zone }\n      - { name: a, match: { procedure: /a }, limit: 10/s, algorithm: adaptive-token-bucket, scope: region }\n";

/// Fewer buckets, in another order: positions named before these rules mean other buckets now.
const FEWER: &str = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: a, match: { procedure: /a }, limit: 10/s, algorithm: adaptive-token-bucket, scope: region }\n";

/// A Unix time in ms, far from any edge.
const NOW_MS: u64 = 1_800_000_000_000;

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
                offered_squares: None,
                hosts,
                tier_offered: Vec::new(),
                id: 0,
            },
        )
}

/// An interval length as a sender might claim it: mostly the real one, sometimes anything.
fn interval_ms() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(1000u64), 1 => Just(0u64), 1 => any::<u64>()]
}

fn rules() -> Arc<RulesSnapshot> {
    Arc::new(RulesSnapshot::parse(1, RULES, "fuzz.yaml").unwrap())
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
        let mut now_ms = NOW_MS;
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
    fn an_aggregator_core_takes_any_report_and_keeps_its_open_intervals_bounded(
        reports in prop::collection::vec(
            (0u64..4, 0u8..3, any::<u64>(), interval_ms(), any::<u64>(),
             prop::collection::vec(bucket_counts(), 0..4)),
            1..100,
        ),
        raw in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 0..20),
    ) {
        let mut now_ms = NOW_MS;
        let mut zone = ZoneCore::new("r1", "r1z1", now_ms);
        zone.upstream_opened();
        for h in 0..4u64 {
            zone.join(&format!("h{h}"), h);
        }
        let mut raw = raw.into_iter();
        let mut closed: Option<(u64, u64)> = None;
        for (host, kind, sequence, interval_ms, rules_version, buckets) in reports {
            now_ms += 137;
            // The interval that just ended, one a little ahead of the clock, or anything.
            let current = Interval::from_ms(interval_ms).sequence_at(now_ms);
            let sequence = match kind {
                0 => current.saturating_sub(1),
                1 => current.saturating_add(sequence % 20),
                _ => sequence,
            };
            let report = v1::Report {
                // A surge report now and then: the rates now of a host whose guard engaged.
                surge: rules_version % 5 == 0,
                host_id: format!("h{host}"),
                zone: "r1z1".into(),
                region: "r1".into(),
                rules_version,
                sequence,
                interval_ms,
                buckets,
            };
            let mut steps = zone.on_report(now_ms, host, report);
            // Bytes off the wire, whatever they decode to (most do not decode at all).
            if let Some(report) = raw.next().and_then(|b| v1::Report::decode(&b[..]).ok()) {
                steps.extend(zone.on_report(now_ms, 9, report));
            }
            steps.extend(zone.poll(now_ms));
            for step in steps {
                if let ZoneStep::Forward(report) = step
                    && !report.surge
                {
                    // Intervals of one length close in order; a new length starts afresh.
                    if let Some((length, last)) = closed
                        && length == report.interval_ms
                    {
                        prop_assert!(report.sequence > last, "{} after {last}", report.sequence);
                    }
                    closed = Some((report.interval_ms, report.sequence));
                }
            }
        }
        // An hour later every open interval is overdue: one poll closes them all, and the one
        // the clock says just ended.
        let forwarded = zone
            .poll(now_ms + 3_600_000)
            .into_iter()
            .filter(|s| matches!(s, ZoneStep::Forward(_)))
            .count();
        prop_assert!(forwarded as u64 <= MAX_AHEAD + 1, "{forwarded} intervals were open");
    }

    #[test]
    fn a_controller_sends_probabilities_whatever_its_zones_and_peers_say(
        zones in prop::collection::vec(
            (0u64..3, prop::collection::vec(bucket_counts(), 0..4),
             prop::sample::select(vec!["r1z1", "r1z2", "r1z3", "", "r2z1"])),
            1..60,
        ),
        peers in prop::collection::vec(
            (prop::sample::select(vec!["r2", "r3", "r1", ""]), any::<u64>(), any::<bool>(),
             prop::collection::vec(bucket_counts(), 0..3)),
            0..30,
        ),
    ) {
        let rules = rules();
        let interval = Interval::new(rules.config.control.report_interval);
        let mut now_ms = NOW_MS;
        let mut core = RegionCore::new("r1", rules, now_ms);
        for (member, name) in ["r1z1", "r1z2", "r1z3"].into_iter().enumerate() {
            core.join(member as u64, name);
        }
        let mut peers = peers.into_iter();
        for (member, buckets, name) in zones {
            now_ms += 333;
            let current = interval.sequence_at(now_ms);
            let report = v1::ZoneReport {
                surge: false,
                zone: name.into(),
                region: "r1".into(),
                sequence: current - 1,
                interval_ms: interval.ms(),
                buckets,
                clients: 1,
                hosts: vec![v1::HostStatus { host_id: format!("{name}h1"), rules_version: 1 }],
                gone: Vec::new(),
                bucket_ids: false,
            };
            let mut steps = core.on_zone_report(member, report, now_ms);
            if let Some((region, sequence, near, buckets)) = peers.next() {
                let sums = v1::RegionSums {
                    region: region.into(),
                    sequence: if near { current - 1 } else { sequence },
                    interval_ms: interval.ms(),
                    buckets,
                };
                steps.extend(core.on_peer_sums(sums, now_ms));
            }
            steps.extend(core.poll(now_ms));
            for step in steps {
                let RegionStep::Send { instructions, .. } = step else { continue };
                for instruction in instructions.instructions.iter().flat_map(|i| &i.buckets) {
                    prop_assert!(instruction.drop_ratio <= Ratio::SCALE);
                    prop_assert!(instruction.share.is_none_or(|s| s <= Ratio::SCALE));
                    prop_assert!(instruction.scope_offered_rps.is_finite());
                    prop_assert!(instruction.scope_offered_rps >= 0.0);
                }
            }
        }
    }

    #[test]
    fn a_host_core_takes_any_instructions_and_names_only_its_own_buckets(
        instructions in prop::collection::vec(
            (any::<u64>(), interval_ms(), any::<u64>(), any::<bool>(),
             prop::collection::vec(
                 (prop::sample::select(vec!["g", "z", "a", "unknown"]), any::<u64>(),
                  proptest::option::of(any::<u64>()), any::<f64>(), any::<u64>()),
                 0..4),
             prop::option::of((1u64..4, prop::sample::select(vec![RULES, FEWER, "version: 1\nservices: 7\n"])))),
            1..40,
        ),
    ) {
        let config = load_str(RULES, "fuzz.yaml").unwrap();
        let id = HostId { host_id: "h1".into(), region: "r1".into(), zone: "r1z1".into() };
        let mut core = HostCore::new(id, &config, 0);
        let mut now = HostTime { clock: 1_000_000_000, unix_ns: NOW_MS * 1_000_000 };
        let mut offered = 0;
        core.start(now, &[Snapshot::default(); 3]);
        for (ttl_ms, interval_ms, sequence, recent, buckets, rules) in instructions {
            now.clock += 37_000_000;
            now.unix_ns += 37_000_000;
            let current = core.interval().sequence_at(now.unix_ms());
            let message = v1::Instructions {
                from_rates_now: sequence % 3 == 0,
                epoch: 0,
                issued_at_ms: now.unix_ms(),
                ttl_ms,
                interval_ms,
                sequence: if recent { current.saturating_sub(1) } else { sequence },
                provisional: sequence % 2 == 1,
                buckets: buckets
                    .into_iter()
                    .map(|(bucket, drop_ratio, share, scope_offered_rps, scope_hosts)| {
                        v1::BucketInstruction {
                            service: "api".into(),
                            bucket: bucket.into(),
                            drop_ratio,
                            share,
                            scope_offered_rps,
                            scope_hosts,
                            tier_drop_ratio: Vec::new(),
                            id: 0,
                        }
                    })
                    .collect(),
                rules_version: rules.map_or(0, |r| r.0),
                rules: rules.map(|(version, yaml)| v1::Rules { version, yaml: yaml.into(), ..Default::default() }),
            };
            let mut steps = core.on_instructions(now, message);
            if let Some(HostStep::Rules { version, rules }) = steps.first().cloned() {
                // A real client validates the rules, with its own settings, before it takes them.
                steps = match LinkRules::decode(&rules).and_then(|r| r.with_own(&config, "control-plane")) {
                    Ok(config) => core.rules_applied(now, version, &config),
                    Err(_) => core.rules_refused(now),
                };
            }
            offered += 5;
            let totals = vec![Snapshot { allowed: offered, ..Snapshot::default() }; core.buckets().len()];
            steps.extend(core.guard_tick(now.clock, &totals));
            steps.extend(core.expire_shares(now.clock));
            if core.deadline() <= now.unix_ms() {
                let _ = core.on_deadline(now, &totals);
            }
            for step in steps {
                let bucket = match step {
                    HostStep::DropRatio { bucket, .. }
                    | HostStep::Surge { bucket, .. }
                    | HostStep::Share { bucket, .. }
                    | HostStep::ShareExpired { bucket } => bucket,
                    HostStep::Rules { .. } => {
                        prop_assert!(false, "rules come alone, first");
                        continue;
                    }
                };
                // The link looks the position up in the rules the core runs now.
                prop_assert!(bucket < core.buckets().len(), "bucket {bucket} of {}", core.buckets().len());
            }
        }
    }
}

#[test]
fn a_peers_sums_from_the_future_do_not_push_its_real_ones_out() {
    let rules = rules();
    let interval = Interval::new(rules.config.control.report_interval);
    // 100 ms into the interval after `sequence`, within its grace: nothing closed yet.
    let now_ms = NOW_MS + 100;
    let sequence = interval.sequence_at(now_ms) - 1;
    let mut core = RegionCore::new("r1", rules, interval.end_of(sequence) - 1);
    core.join(0, "r1z1");
    let offered = |n: u64| v1::BucketCounts {
        service: "api".into(),
        bucket: "g".into(),
        offered: n,
        ..Default::default()
    };
    let mut steps = core.on_peer_sums(
        v1::RegionSums {
            region: "r2".into(),
            sequence,
            interval_ms: interval.ms(),
            buckets: vec![offered(1_000)],
        },
        now_ms,
    );
    // More bogus intervals than the peer's window keeps, all ahead of the clock.
    for k in 0..20 {
        let bogus = v1::RegionSums {
            region: "r2".into(),
            sequence: sequence + 100 + k,
            interval_ms: interval.ms(),
            buckets: vec![offered(u64::MAX)],
        };
        steps.extend(core.on_peer_sums(bogus, now_ms));
    }
    let report = v1::ZoneReport {
        zone: "r1z1".into(),
        region: "r1".into(),
        sequence,
        interval_ms: interval.ms(),
        buckets: vec![offered(500)],
        ..Default::default()
    };
    steps.extend(core.on_zone_report(0, report, now_ms));
    steps.extend(core.poll(interval.end_of(sequence) + interval.ms()));
    assert!(steps.iter().any(|s| matches!(s, RegionStep::Send { .. })));
    let view = core.view()[&BucketKey::new("api", "g")];
    // 500/s here and the peer's real 1,000/s.
    assert_eq!(view.observed_rps, 1_500.0, "{view:?}");
}
