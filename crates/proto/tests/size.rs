//! What the control plane costs on the wire: one host's report and instructions per interval.

use prost::Message;
use spillway_proto::v1;

/// 100 buckets with realistic names and counts (5,000 requests per bucket per interval).
fn buckets() -> Vec<(String, String)> {
    (0..100)
        .map(|i| ("payments".to_owned(), format!("gateway-charge-{i:03}")))
        .collect()
}

#[test]
fn a_host_with_100_buckets_exchanges_under_10_kib_per_interval() {
    let report = v1::Report {
        surge: false,
        host_id: "payments-7f9c4d-abcde".into(),
        zone: "us-east-1a".into(),
        region: "us-east-1".into(),
        rules_version: 1_795_973_127_008,
        sequence: 1_795_973_127,
        interval_ms: 1000,
        buckets: buckets()
            .into_iter()
            .map(|(service, bucket)| v1::BucketCounts {
                service,
                bucket,
                offered: 5_000,
                allowed: 3_334,
                shadow_dropped: 0,
                offered_tail: Some(1_250),
                offered_squares: None,
                hosts: None,
                tier_offered: Vec::new(),
                id: 0,
            })
            .collect(),
    };
    let instructions = v1::Instructions {
        from_rates_now: false,
        epoch: 7,
        issued_at_ms: 1_795_973_128_004,
        ttl_ms: 5_000,
        interval_ms: 1000,
        sequence: 1_795_973_127,
        provisional: false,
        buckets: buckets()
            .into_iter()
            .map(|(service, bucket)| v1::BucketInstruction {
                service,
                bucket,
                drop_ratio: 1_431_655_766,
                share: None,
                scope_offered_rps: 150_000.0,
                scope_hosts: 40,
                tier_drop_ratio: Vec::new(),
                id: 0,
            })
            .collect(),
        rules_version: 1_795_973_127_008,
        rules: None,
    };
    let up = report.encoded_len();
    let down = instructions.encoded_len();
    // 4,162 bytes up and 4,928 down: at 1 s reports about 9.1 KB per host per second, at 250 ms
    // four times that. Names dominate; the interval's tail (3 bytes a bucket) is what lets the
    // controller see a surge whole in the interval it starts, and the scope's offered load and
    // host count (9 and 2 bytes a bucket) what lets a client's surge guard work out its part of
    // the limit between two instructions.
    assert!(up < 4608, "report of {up} bytes");
    assert!(down < 5 * 1024, "instructions of {down} bytes");
    assert!(up + down < 10 * 1024, "{up} + {down} bytes");
    eprintln!("per interval with 100 buckets: {up} bytes up, {down} bytes down");
    // And both survive the wire unchanged.
    assert_eq!(
        v1::Report::decode(report.encode_to_vec().as_slice()).unwrap(),
        report
    );
    assert_eq!(
        v1::Instructions::decode(instructions.encode_to_vec().as_slice()).unwrap(),
        instructions
    );
}

#[test]
fn criticality_tiers_cost_a_few_bytes_a_bucket_and_nothing_without_them() {
    // A bucket whose load is all critical sends no tiers either way (empty repeated fields take
    // no bytes); one with a mix sends four counts up and four ratios down.
    let counts = |tiers: Vec<u64>| v1::BucketCounts {
        service: "payments".into(),
        bucket: "gateway-charge-000".into(),
        offered: 5_000,
        allowed: 3_334,
        shadow_dropped: 0,
        offered_tail: Some(1_250),
        offered_squares: None,
        hosts: None,
        tier_offered: tiers,
        id: 0,
    };
    let instruction = |tiers: Vec<u64>| v1::BucketInstruction {
        service: "payments".into(),
        bucket: "gateway-charge-000".into(),
        drop_ratio: 1_431_655_766,
        share: None,
        scope_offered_rps: 150_000.0,
        scope_hosts: 40,
        tier_drop_ratio: tiers,
        id: 0,
    };
    let plain_up = counts(Vec::new()).encoded_len();
    let plain_down = instruction(Vec::new()).encoded_len();
    // 40% sheddable at 1.5x the limit: [0, 3000, 0, 2000] up, [0, 0, 0, 5/6] down.
    let up = counts(vec![0, 3_000, 0, 2_000]).encoded_len() - plain_up;
    let down = instruction(vec![0, 0, 0, 3_579_139_414]).encoded_len() - plain_down;
    eprintln!("tiers add {up} bytes up and {down} down per bucket");
    assert!(up <= 8, "{up} bytes up");
    assert!(down <= 10, "{down} bytes down");
    let decoded =
        v1::BucketCounts::decode(counts(vec![0, 3_000, 0, 2_000]).encode_to_vec().as_slice())
            .unwrap();
    assert_eq!(decoded.tier_offered, [0, 3_000, 0, 2_000]);
}

#[test]
fn buckets_by_number_cost_a_zone_stream_a_fraction_of_their_names() {
    let entries = |named: bool| -> Vec<v1::BucketCounts> {
        (1..)
            .zip(buckets())
            .map(|(id, (service, bucket))| v1::BucketCounts {
                service: if named { service } else { String::new() },
                bucket: if named { bucket } else { String::new() },
                offered: 500_000,
                allowed: 333_334,
                offered_tail: Some(125_000),
                hosts: Some(100),
                id,
                ..Default::default()
            })
            .collect()
    };
    let report = |named: bool| v1::ZoneReport {
        zone: "us-east-1a".into(),
        region: "us-east-1".into(),
        sequence: 1_795_973_127,
        interval_ms: 1000,
        buckets: entries(named),
        clients: 100,
        bucket_ids: true,
        ..Default::default()
    };
    let instructions = |named: bool| v1::ZoneInstructions {
        instructions: Some(v1::Instructions {
            issued_at_ms: 1_795_973_128_004,
            ttl_ms: 5_000,
            interval_ms: 1000,
            sequence: 1_795_973_127,
            buckets: (1..)
                .zip(buckets())
                .map(|(id, (service, bucket))| v1::BucketInstruction {
                    service: if named { service } else { String::new() },
                    bucket: if named { bucket } else { String::new() },
                    drop_ratio: 1_431_655_766,
                    scope_offered_rps: 15_000_000.0,
                    scope_hosts: 4_000,
                    id,
                    ..Default::default()
                })
                .collect(),
            rules_version: 1_795_973_127_008,
            ..Default::default()
        }),
        bucket_ids: true,
    };
    let (up_named, up) = (report(true).encoded_len(), report(false).encoded_len());
    let (down_named, down) = (
        instructions(true).encoded_len(),
        instructions(false).encoded_len(),
    );
    eprintln!(
        "a zone's 100 buckets per interval: {up_named} bytes up and {down_named} down with names, \
         {up} and {down} by number"
    );
    // The names are 30 bytes of a report's 48 per bucket here; the number is 2.
    assert!(up * 2 < up_named, "{up} of {up_named} bytes");
    assert!(down * 2 < down_named, "{down} of {down_named} bytes");
    // A bucket by number decodes to empty names.
    let decoded = v1::ZoneReport::decode(report(false).encode_to_vec().as_slice()).unwrap();
    assert!(
        decoded
            .buckets
            .iter()
            .all(|b| b.service.is_empty() && b.id > 0)
    );
}
