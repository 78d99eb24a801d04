use super::*;

fn report(host: &str, sequence: u64, offered: u64, rules_version: u64) -> v1::Report {
    v1::Report {
        surge: false,
        host_id: host.into(),
        zone: "z1".into(),
        region: "r1".into(),
        rules_version,
        sequence,
        interval_ms: 1_000,
        buckets: vec![v1::BucketCounts {
            service: "api".into(),
            bucket: "all".into(),
            offered,
            allowed: offered,
            shadow_dropped: 0,
            offered_tail: Some(offered / 4),
            offered_squares: None,
            hosts: None,
            tier_offered: Vec::new(),
            id: 0,
        }],
    }
}

fn surge_report(host: &str, sequence: u64, offered: u64) -> v1::Report {
    v1::Report {
        surge: true,
        ..report(host, sequence, offered, 1)
    }
}

fn forwards(steps: &[ZoneStep]) -> Vec<&v1::ZoneReport> {
    steps
        .iter()
        .filter_map(|s| match s {
            ZoneStep::Forward(r) => Some(r),
            ZoneStep::Send { .. } => None,
        })
        .collect()
}

/// A zone at 7.000 s with hosts a and b linked, the controller's stream open.
fn zone() -> ZoneCore {
    let mut zone = ZoneCore::new("r1", "z1", 7_000);
    zone.upstream_opened();
    zone.join("a", 1);
    zone.join("b", 2);
    zone
}

#[test]
fn an_interval_leaves_when_its_last_host_reports_or_after_the_grace() {
    let mut zone = zone();
    assert!(zone.on_report(8_001, 1, report("a", 7, 300, 1)).is_empty());
    let steps = zone.on_report(8_002, 2, report("b", 7, 100, 1));
    let sent = forwards(&steps);
    assert_eq!(sent.len(), 1, "complete when both reported");
    assert_eq!((sent[0].sequence, sent[0].clients), (7, 2));
    assert_eq!(sent[0].buckets[0].offered, 400);
    // The controller learns the hosts once, then only what changed.
    let hosts: Vec<&str> = sent[0].hosts.iter().map(|h| h.host_id.as_str()).collect();
    assert_eq!(hosts, ["a", "b"]);
    // Interval 8: only a reports; it leaves a grace (250 ms) after its end, without b.
    zone.on_report(9_001, 1, report("a", 8, 300, 1));
    assert!(forwards(&zone.poll(9_249)).is_empty());
    let steps = zone.poll(9_250);
    let sent = forwards(&steps);
    assert_eq!((sent[0].sequence, sent[0].clients), (8, 1));
    // b's counts of interval 7 stand in for its missing report.
    assert_eq!(sent[0].buckets[0].offered, 400);
    assert!(sent[0].hosts.is_empty(), "nothing changed");
    assert_eq!(zone.forwarded(), 2);
    // A report of a forwarded interval is late.
    zone.on_report(9_300, 2, report("b", 8, 100, 1));
    assert_eq!(zone.late_reports(), 1);
    // Interval 9: b is silent again; its last report was of 7, two intervals ago, so the
    // sums go without it.
    zone.on_report(10_001, 1, report("a", 9, 300, 1));
    let steps = zone.poll(10_250);
    let sent = forwards(&steps);
    assert_eq!((sent[0].sequence, sent[0].buckets[0].offered), (9, 300));
}

#[test]
fn a_leaving_hosts_last_partial_report_counts_once_and_nothing_stands_in_for_it() {
    let mut zone = zone();
    zone.on_report(8_001, 1, report("a", 7, 300, 1));
    zone.on_report(8_002, 2, report("b", 7, 100, 1));
    // Halfway through interval 8, a stops: its last report is of what it counted so far,
    // then its stream ends.
    assert!(forwards(&zone.on_report(8_500, 1, report("a", 8, 150, 1))).is_empty());
    assert!(forwards(&zone.on_stream_end(8_500, "a", 1)).is_empty());
    let steps = zone.on_report(9_001, 2, report("b", 8, 250, 1));
    let sent = forwards(&steps);
    assert_eq!(sent[0].sequence, 8);
    assert_eq!(sent[0].buckets[0].offered, 150 + 250);
    // Interval 9 goes without a.
    let sent = zone.on_report(10_001, 2, report("b", 9, 400, 1));
    assert_eq!(forwards(&sent)[0].buckets[0].offered, 400);
}

#[test]
fn a_surge_estimate_counts_a_host_that_left_for_nothing() {
    let mut zone = zone();
    zone.on_report(8_001, 1, report("a", 7, 300, 1));
    zone.on_report(8_002, 2, report("b", 7, 100, 1));
    // In interval 8, a stops and b's guard engages at 400 an interval.
    zone.on_stream_end(8_300, "a", 1);
    zone.on_report(8_400, 2, surge_report("b", 8, 400));
    let steps = zone.poll(8_410);
    let sent = forwards(&steps);
    assert!(sent[0].surge);
    // b's 100 replaced by its 400 now, and a's 300 gone with it.
    assert_eq!(sent[0].buckets[0].offered, 400);
    assert_eq!(sent[0].buckets[0].hosts, Some(1));
    // c, which joined in interval 8, stops at its end: its last report (of 8) and the end
    // of its stream come before b's report, so interval 8 closes after c left, its sums
    // counting c.
    zone.join("c", 3);
    zone.on_report(9_000, 3, report("c", 8, 200, 1));
    zone.on_stream_end(9_000, "c", 3);
    let sent = zone.on_report(9_001, 2, report("b", 8, 400, 1));
    assert_eq!(
        forwards(&sent)[0].buckets[0].offered,
        600,
        "interval 8 counts c"
    );
    zone.on_report(9_300, 2, surge_report("b", 9, 500));
    let steps = zone.poll(9_310);
    // b's 400 replaced by its 500 now, c's 200 gone.
    assert_eq!(forwards(&steps)[0].buckets[0].offered, 500);
    // d reports interval 9 only: 10 closes with its counts standing in, 11 without them
    // (no stand-in past one interval). When it leaves in 12, nothing of it is in the last
    // closed interval's sums to take out of the estimate.
    zone.join("d", 4);
    zone.on_report(10_000, 4, report("d", 9, 200, 1));
    let sent = zone.on_report(10_001, 2, report("b", 9, 500, 1));
    assert_eq!(forwards(&sent)[0].buckets[0].offered, 700);
    zone.on_report(11_001, 2, report("b", 10, 500, 1));
    assert_eq!(forwards(&zone.poll(11_250))[0].buckets[0].offered, 700);
    zone.on_report(12_001, 2, report("b", 11, 500, 1));
    assert_eq!(forwards(&zone.poll(12_250))[0].buckets[0].offered, 500);
    zone.on_stream_end(12_300, "d", 4);
    zone.on_report(12_400, 2, surge_report("b", 12, 600));
    assert_eq!(forwards(&zone.poll(12_410))[0].buckets[0].offered, 600);
}

#[test]
fn a_large_zone_closes_early_without_a_few_silent_hosts() {
    // 64 hosts: two may be missing 10 ms (a hundredth of the interval) after the interval's end.
    let mut zone = ZoneCore::new("r1", "z1", 7_000);
    zone.upstream_opened();
    let names: Vec<String> = (0..64).map(|i| format!("h{i:02}")).collect();
    for (i, name) in names.iter().enumerate() {
        zone.join(name, i as u64);
    }
    for (i, name) in names.iter().enumerate() {
        zone.on_report(8_001, i as u64, report(name, 7, 10, 1));
    }
    // Interval 8: h00 and h01 are silent, 62 report.
    for (i, name) in names.iter().enumerate().skip(2) {
        assert!(forwards(&zone.on_report(9_001, i as u64, report(name, 8, 20, 1))).is_empty());
    }
    assert!(
        forwards(&zone.poll(9_009)).is_empty(),
        "before the quorum's wait"
    );
    let steps = zone.poll(9_010);
    let sent = forwards(&steps);
    assert_eq!((sent[0].sequence, sent[0].clients), (8, 62));
    // 62 x 20 reported, and 2 x 10 from the silent hosts' interval 7.
    assert_eq!(sent[0].buckets[0].offered, 62 * 20 + 2 * 10);
    // Interval 9: three silent are more than one in 32: the grace applies.
    for (i, name) in names.iter().enumerate().skip(3) {
        zone.on_report(10_001, i as u64, report(name, 9, 20, 1));
    }
    assert!(forwards(&zone.poll(10_249)).is_empty());
    assert_eq!(forwards(&zone.poll(10_250))[0].sequence, 9);
}

#[test]
fn instructions_split_shares_by_each_hosts_load_and_carry_rules_to_hosts_that_lack_them() {
    let mut zone = zone();
    zone.on_report(8_001, 1, report("a", 7, 300, 1));
    zone.on_report(8_002, 2, report("b", 7, 100, 2));
    let instructions = v1::ZoneInstructions {
        instructions: Some(v1::Instructions {
            interval_ms: 1_000,
            sequence: 7,
            rules_version: 2,
            rules: Some(v1::Rules {
                version: 2,
                yaml: "rules".into(),
                ..Default::default()
            }),
            buckets: vec![v1::BucketInstruction {
                service: "api".into(),
                bucket: "all".into(),
                share: Some(Ratio::from_f64(0.5).raw()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        bucket_ids: false,
    };
    let steps = zone.on_instructions(8_100, instructions.clone());
    let sent: Vec<(&str, f64, bool)> = steps
        .iter()
        .map(|s| match s {
            ZoneStep::Send { host, instructions } => (
                host.as_str(),
                Ratio::from_raw(instructions.buckets[0].share.unwrap()).as_f64(),
                instructions.rules.is_some(),
            ),
            ZoneStep::Forward(_) => panic!("nothing to forward"),
        })
        .collect();
    // A offered 300 of the zone's 400: 0.375 of the bucket; only a runs other rules.
    assert!((sent[0].1 - 0.375).abs() < 1e-6 && (sent[1].1 - 0.125).abs() < 1e-6);
    assert_eq!((sent[0].0, sent[0].2), ("a", true));
    assert_eq!((sent[1].0, sent[1].2), ("b", false));
    // Sent once; again only when the send failed.
    let again = zone.on_instructions(8_200, instructions.clone());
    assert_eq!(again.len(), 2, "both hosts are still instructed");
    assert!(
        again.iter().all(
            |s| matches!(s, ZoneStep::Send { instructions, .. } if instructions.rules.is_none())
        )
    );
    zone.send_failed("a");
    let retry = zone.on_instructions(8_300, instructions);
    assert!(
        matches!(&retry[0], ZoneStep::Send { host, instructions } if host == "a" && instructions.rules.is_some())
    );
}

#[test]
fn a_host_that_left_is_reported_gone_and_an_old_stream_ending_changes_nothing() {
    let mut zone = zone();
    zone.on_report(8_001, 1, report("a", 7, 300, 1));
    zone.on_report(8_002, 2, report("b", 7, 100, 1));
    // a reconnected on stream 3 before its stream 1 ended.
    zone.on_report(9_001, 3, report("a", 8, 300, 1));
    assert!(zone.on_stream_end(9_002, "a", 1).is_empty());
    assert_eq!(zone.hosts(), 2);
    // b leaves: interval 8 no longer waits for it.
    let steps = zone.on_stream_end(9_003, "b", 2);
    let sent = forwards(&steps);
    assert_eq!(sent[0].sequence, 8);
    assert_eq!(sent[0].gone, ["b"]);
    // That report was lost on the way up: the next one says it again.
    let lost = sent[0].clone();
    zone.forward_failed(&lost);
    let steps = zone.on_report(10_001, 3, report("a", 9, 300, 1));
    assert_eq!(forwards(&steps)[0].gone, ["b"]);
}

fn of_epoch(epoch: u64, ratio: f64) -> v1::ZoneInstructions {
    v1::ZoneInstructions {
        instructions: Some(v1::Instructions {
            interval_ms: 1_000,
            ttl_ms: 3_000,
            sequence: 7,
            epoch,
            buckets: vec![v1::BucketInstruction {
                service: "api".into(),
                bucket: "all".into(),
                drop_ratio: Ratio::from_f64(ratio).raw(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        bucket_ids: false,
    }
}

#[test]
fn instructions_of_an_older_epoch_are_not_relayed() {
    let mut zone = zone();
    // The new leader (epoch 5) instructs; the old one (epoch 4) wakes and sends its own.
    let steps = zone.on_instructions(8_100, of_epoch(5, 0.5));
    assert_eq!(steps.len(), 2, "both hosts instructed");
    assert!(
        steps
            .iter()
            .all(|s| matches!(s, ZoneStep::Send { instructions, .. } if instructions.epoch == 5))
    );
    assert!(zone.on_instructions(8_200, of_epoch(4, 0.0)).is_empty());
    assert_eq!(zone.fence().dropped(), 1);
    assert_eq!(zone.on_instructions(8_300, of_epoch(5, 0.4)).len(), 2);
    assert_eq!(zone.fence().epoch(), 5);
    // Without instructions of epoch 5 for a whole TTL, the hosts failed open: whoever
    // instructs now is followed.
    assert_eq!(zone.on_instructions(11_300, of_epoch(4, 0.3)).len(), 2);
    assert_eq!(zone.fence().epoch(), 4);
}

#[test]
fn a_host_that_moved_here_mid_interval_is_waited_for_from_its_hello() {
    let mut zone = zone();
    zone.on_report(8_001, 1, report("a", 7, 300, 1));
    zone.on_report(8_002, 2, report("b", 7, 100, 1));
    // Host c, whose aggregator was lost, opens a stream here at 8.300 s and says hello: a
    // report of nothing for interval 7, which closed here without it. Not late: it joined.
    let hello = v1::Report {
        buckets: Vec::new(),
        ..report("c", 7, 0, 1)
    };
    zone.on_report(8_300, 3, hello);
    assert_eq!(zone.late_reports(), 0);
    assert_eq!(zone.hosts(), 3);
    // Interval 8 waits for c's report, which comes a few milliseconds after a's and b's.
    assert!(forwards(&zone.on_report(9_001, 1, report("a", 8, 300, 1))).is_empty());
    assert!(forwards(&zone.on_report(9_002, 2, report("b", 8, 100, 1))).is_empty());
    let steps = zone.on_report(9_004, 3, report("c", 8, 200, 1));
    let sent = forwards(&steps);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].buckets[0].offered, 600, "c's load counted here");
}

#[test]
fn a_zone_adds_its_hosts_squares_and_counts_a_host_that_does_not_say_as_requests() {
    let mut zone = zone();
    // a: a token budget's 42,000 tokens in 40 answers; b: a host older than the field.
    let mut tokens = report("a", 7, 42_000, 1);
    tokens.buckets[0].offered_squares = Some(56_000_000);
    assert!(zone.on_report(8_001, 1, tokens).is_empty());
    let steps = zone.on_report(8_002, 2, report("b", 7, 40_000, 1));
    let sent = forwards(&steps);
    assert_eq!(sent[0].buckets[0].offered, 82_000);
    assert_eq!(sent[0].buckets[0].offered_squares, Some(56_040_000));
    // Without a host that says, the zone says nothing either.
    zone.on_report(9_001, 1, report("a", 8, 300, 1));
    let steps = zone.on_report(9_002, 2, report("b", 8, 100, 1));
    let sent = forwards(&steps);
    assert_eq!(sent[0].buckets[0].offered, 400);
    assert_eq!(sent[0].buckets[0].offered_squares, None);
}

/// Instructions for one zone with one bucket entry: `(bucket, number, drop ratio)`.
fn by_number(entries: &[(&str, u32, f64)], bucket_ids: bool) -> v1::ZoneInstructions {
    v1::ZoneInstructions {
        instructions: Some(v1::Instructions {
            interval_ms: 1_000,
            buckets: entries
                .iter()
                .map(|&(bucket, id, ratio)| v1::BucketInstruction {
                    service: if bucket.is_empty() { "" } else { "api" }.into(),
                    bucket: bucket.into(),
                    id,
                    drop_ratio: Ratio::from_f64(ratio).raw(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        bucket_ids,
    }
}

/// What host `host` was sent of `steps`: each bucket's name, number and drop ratio.
fn sent_to_host(steps: &[ZoneStep], host: &str) -> Vec<(String, u32, f64)> {
    steps
        .iter()
        .filter_map(|s| match s {
            ZoneStep::Send {
                host: h,
                instructions,
            } if h == host => Some(instructions),
            _ => None,
        })
        .flat_map(|i| &i.buckets)
        .map(|b| {
            let ratio = Ratio::from_raw(b.drop_ratio).as_f64();
            (b.bucket.clone(), b.id, (ratio * 100.0).round() / 100.0)
        })
        .collect()
}

fn entries(report: &v1::ZoneReport) -> Vec<(u32, &str, &str, u64)> {
    report
        .buckets
        .iter()
        .map(|b| (b.id, b.service.as_str(), b.bucket.as_str(), b.offered))
        .collect()
}

#[test]
fn a_numbering_zone_names_each_bucket_once_per_stream_both_ways() {
    let mut zone = ZoneCore::new("r1", "z1", 7_000);
    zone.number_buckets();
    zone.upstream_opened();
    zone.join("a", 1);
    let steps = zone.on_report(8_001, 1, report("a", 7, 100, 0));
    let first = forwards(&steps)[0];
    assert!(first.bucket_ids, "asks for instructions by number");
    assert_eq!(entries(first), [(1, "api", "all", 100)]);
    // The controller's first instructions: a number with its names, and it takes numbers.
    let steps = zone.on_instructions(8_100, by_number(&[("all", 5, 0.25)], true));
    assert_eq!(sent_to_host(&steps, "a"), [("all".into(), 0, 0.25)]);
    let steps = zone.on_report(9_001, 1, report("a", 8, 120, 0));
    assert_eq!(entries(forwards(&steps)[0]), [(1, "", "", 120)]);
    // By number alone, its names go on to the host; a number never named is skipped.
    let steps = zone.on_instructions(9_100, by_number(&[("", 5, 0.5), ("", 6, 0.9)], true));
    assert_eq!(sent_to_host(&steps, "a"), [("all".into(), 0, 0.5)]);
    assert_eq!(zone.unbound_ids(), 1);
    // A new stream: every name again, both ways.
    zone.upstream_closed();
    zone.upstream_opened();
    let steps = zone.on_report(10_001, 1, report("a", 9, 80, 0));
    let lost = forwards(&steps)[0].clone();
    assert_eq!(entries(&lost), [(1, "api", "all", 80)]);
    let steps = zone.on_instructions(10_100, by_number(&[("", 5, 0.5)], true));
    assert!(
        sent_to_host(&steps, "a").is_empty(),
        "the old stream's number"
    );
    assert_eq!(zone.unbound_ids(), 2);
    // A report that could not be sent: the names it carried go again with the next one.
    zone.forward_failed(&lost);
    let steps = zone.on_report(11_001, 1, report("a", 10, 90, 0));
    assert_eq!(entries(forwards(&steps)[0]), [(1, "api", "all", 90)]);
    let steps = zone.on_report(12_001, 1, report("a", 11, 70, 0));
    assert_eq!(entries(forwards(&steps)[0]), [(1, "", "", 70)]);
}

#[test]
fn a_zone_that_does_not_number_names_every_bucket_every_time() {
    let mut zone = zone();
    for (sequence, at) in [(7, 8_001), (8, 9_001)] {
        zone.on_report(at, 1, report("a", sequence, 100, 0));
        let steps = zone.on_report(at + 1, 2, report("b", sequence, 100, 0));
        let report = forwards(&steps)[0];
        assert!(!report.bucket_ids);
        assert_eq!(entries(report), [(0, "api", "all", 200)]);
        // A controller that takes numbers changes nothing.
        zone.on_instructions(at + 100, by_number(&[("all", 1, 0.1)], true));
    }
}

/// An answer to surge reports (`from_rates_now`) of `ratio` for bucket `all`.
fn answer(ratio: f64) -> v1::ZoneInstructions {
    let mut message = of_epoch(0, ratio);
    if let Some(i) = &mut message.instructions {
        i.from_rates_now = true;
        i.provisional = true;
    }
    message
}

fn hosts_sent(steps: &[ZoneStep]) -> Vec<&str> {
    steps
        .iter()
        .filter_map(|s| match s {
            ZoneStep::Send { host, .. } => Some(host.as_str()),
            ZoneStep::Forward(_) => None,
        })
        .collect()
}

#[test]
fn an_answer_that_moves_no_ratio_goes_only_to_the_hosts_whose_guard_engaged_lately() {
    let mut zone = zone();
    zone.join("c", 3);
    assert_eq!(
        hosts_sent(&zone.on_instructions(8_050, of_epoch(0, 0.9))),
        ["a", "b", "c"]
    );
    // c's guard engages in interval 8; the answer leaves the admitted part within 0.25%.
    zone.on_report(8_300, 3, surge_report("c", 8, 900));
    assert_eq!(
        hosts_sent(&zone.on_instructions(8_320, answer(0.9002))),
        ["c"]
    );
    // a's too: the answers go to both.
    zone.on_report(8_400, 1, surge_report("a", 8, 900));
    assert_eq!(
        hosts_sent(&zone.on_instructions(8_420, answer(0.9))),
        ["a", "c"]
    );
    assert_eq!(zone.answers_to_waiting(), 2);
    // An answer that moves the ratio goes to every host.
    assert_eq!(
        hosts_sent(&zone.on_instructions(8_500, answer(0.93))),
        ["a", "b", "c"]
    );
    // The guards engaged in interval 8 wait through the instructions of 8 and 9, and so do the
    // answers to them: compared with what every host was told last, 0.93.
    assert_eq!(
        hosts_sent(&zone.on_instructions(8_520, answer(0.9301))),
        ["a", "c"]
    );
    for (host, conn) in [("a", 1), ("b", 2), ("c", 3)] {
        zone.on_report(9_001, conn, report(host, 8, 900, 1));
    }
    assert_eq!(
        hosts_sent(&zone.on_instructions(9_050, of_epoch(0, 0.93))),
        ["a", "b", "c"]
    );
    assert_eq!(
        hosts_sent(&zone.on_instructions(9_100, answer(0.93))),
        ["a", "c"]
    );
    zone.on_report(9_300, 2, surge_report("b", 9, 900));
    assert_eq!(
        hosts_sent(&zone.on_instructions(9_320, answer(0.93))),
        ["a", "b", "c"]
    );
    // Once interval 9 closes, those of 8 no longer wait: b engaged in 9.
    for (host, conn) in [("a", 1), ("b", 2), ("c", 3)] {
        zone.on_report(10_001, conn, report(host, 9, 900, 1));
    }
    assert_eq!(
        hosts_sent(&zone.on_instructions(10_100, answer(0.93))),
        ["b"]
    );
    assert_eq!(zone.answers_to_waiting(), 6);
}
