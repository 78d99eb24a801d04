use super::*;
use crate::RulesMessage;
use spillway_core::config::load_str;

const DROP: &str = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 100/s }\n      - { name: local, match: { procedure: /a }, limit: 5/s, algorithm: token-bucket }\n";
const ADAPTIVE: &str = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 100/s }\n      - { name: shared, match: { procedure: /b }, limit: 50/s, algorithm: adaptive-token-bucket }\n";

fn core(yaml: &str) -> HostCore {
    let id = HostId {
        host_id: "h1".into(),
        region: "r1".into(),
        zone: "z1".into(),
    };
    HostCore::new(id, &load_str(yaml, "test").unwrap(), 3)
}

fn at(ms: u64) -> HostTime {
    HostTime {
        clock: ms * 1_000_000,
        unix_ns: ms * 1_000_000,
    }
}

fn offered(n: u64) -> Snapshot {
    Snapshot {
        allowed: n,
        ..Snapshot::default()
    }
}

fn instruction(bucket: &str, ratio: f64, share: Option<f64>) -> v1::BucketInstruction {
    v1::BucketInstruction {
        service: "api".into(),
        bucket: bucket.into(),
        drop_ratio: Ratio::from_f64(ratio).raw(),
        share: share.map(|s| Ratio::from_f64(s).raw()),
        scope_offered_rps: 0.0,
        scope_hosts: 1,
        tier_drop_ratio: Vec::new(),
        id: 0,
    }
}

fn instructions(buckets: Vec<v1::BucketInstruction>) -> v1::Instructions {
    v1::Instructions {
        issued_at_ms: 8_010,
        ttl_ms: 5_000,
        interval_ms: 1_000,
        sequence: 7,
        buckets,
        rules_version: 3,
        rules: None,
        provisional: false,
        from_rates_now: false,
        epoch: 0,
    }
}

#[test]
fn only_control_plane_buckets_are_tracked() {
    let core = core(DROP);
    assert_eq!(
        core.buckets().collect::<Vec<_>>(),
        [&BucketKey::new("api", "all")]
    );
}

#[test]
fn a_stream_opened_mid_interval_reports_at_the_boundary_with_its_tail() {
    let mut core = core(DROP);
    // Opened at 7.300 s with 40 requests counted before: those are not this interval's.
    core.start(at(7_300), &[offered(40)]);
    assert_eq!(
        core.deadline(),
        7_750,
        "the tail of interval 7 starts first"
    );
    assert_eq!(core.on_deadline(at(7_750), &[offered(40 + 45)]), None);
    assert_eq!(core.deadline(), 8_000);
    let report = core
        .on_deadline(at(8_000), &[offered(40 + 45 + 25)])
        .expect("the report of interval 7");
    assert_eq!(report.sequence, 7);
    assert_eq!(report.rules_version, 3);
    assert_eq!(report.host_id, "h1");
    // 70 requests in 700 ms is 100 per interval; 25 in the 250 ms tail is 25 per quarter.
    assert_eq!(report.buckets[0].offered, 100);
    assert_eq!(report.buckets[0].offered_tail, Some(25));
    assert_eq!(core.deadline(), 8_750);
}

#[test]
fn a_token_budgets_report_carries_the_squares_of_its_costs_scaled_with_its_counts() {
    let tokens = |offered: u64, squares: u64| Snapshot {
        allowed: offered,
        squares,
        ..Snapshot::default()
    };
    let mut core = core(DROP);
    // Opened at 7.500 s: half an interval, scaled to a whole one. Answers of 500 and 1,500
    // tokens before the tail, one of 1,000 in it.
    core.start(at(7_500), &[tokens(0, 0)]);
    assert_eq!(
        core.on_deadline(at(7_750), &[tokens(2_000, 2_500_000)]),
        None
    );
    let report = core
        .on_deadline(at(8_000), &[tokens(3_000, 3_500_000)])
        .expect("the report of interval 7");
    assert_eq!(report.buckets[0].offered, 6_000);
    assert_eq!(report.buckets[0].offered_squares, Some(7_000_000));
    // A bucket counted in requests says nothing: each unit one arrival.
    assert_eq!(
        core.on_deadline(at(8_750), &[tokens(3_050, 3_500_000)]),
        None
    );
    let report = core
        .on_deadline(at(9_000), &[tokens(3_100, 3_500_000)])
        .expect("the report of interval 8");
    assert_eq!(report.buckets[0].offered, 100);
    assert_eq!(report.buckets[0].offered_squares, None);
}

#[test]
fn a_host_that_moves_to_another_aggregator_never_reports_an_interval_twice() {
    let mut core = core(DROP);
    core.start(at(7_000), &[offered(0)]);
    assert_eq!(core.on_deadline(at(7_750), &[offered(75)]), None);
    let to_old = core
        .on_deadline(at(8_000), &[offered(100)])
        .expect("interval 7, delivered to the first aggregator");
    assert_eq!(to_old.sequence, 7);
    assert_eq!(to_old.buckets[0].offered, 100);
    // Its stream is lost at 8.200 s with 20 more counted; a stream to the zone's other
    // aggregator opens at 8.500 s with 50 counted: neither interval 7 nor the 50 requests
    // counted before the stream opened go to the new one.
    core.start(at(8_500), &[offered(150)]);
    assert_eq!(core.on_deadline(at(8_750), &[offered(175)]), None);
    let to_new = core
        .on_deadline(at(9_000), &[offered(200)])
        .expect("interval 8, to the new aggregator");
    assert_eq!(to_new.sequence, 8, "the next interval, never 7 again");
    // 50 requests in the 500 ms the stream was open: 100 per interval.
    assert_eq!(to_new.buckets[0].offered, 100);
}

#[test]
fn a_drop_ratio_goes_to_the_limiter_with_its_ttl_and_unknown_buckets_are_skipped() {
    let mut core = core(DROP);
    let steps = core.on_instructions(
        at(8_010),
        instructions(vec![
            instruction("all", 0.25, None),
            instruction("gone", 0.5, None),
        ]),
    );
    assert_eq!(
        steps,
        [
            HostStep::DropRatio {
                bucket: 0,
                ratio: Ratio::from_f64(0.25),
                tiers: uniform(Ratio::from_f64(0.25)),
                ttl: Duration::from_secs(5),
            },
            // The guard has counted nothing yet: its ratio is the instruction's.
            HostStep::Surge {
                bucket: 0,
                ratio: Ratio::from_f64(0.25),
                tiers: uniform(Ratio::from_f64(0.25)),
                until: at(8_110).clock,
            }
        ]
    );
    assert_eq!(core.last_instructions_ms(), 8_010);
}

#[test]
fn an_instructions_tiers_reach_the_limiter_and_the_guard_keeps_them() {
    let mut core = core(DROP);
    let third = Ratio::from_f64(1.0 / 3.0);
    let tiers = [0.0, 0.0, 0.0, 5.0 / 6.0].map(Ratio::from_f64);
    let mut message = instruction("all", 1.0 / 3.0, None);
    message.tier_drop_ratio = tiers.iter().map(|r| r.raw()).collect();
    let steps = core.on_instructions(at(8_010), instructions(vec![message]));
    assert!(
        matches!(steps[0], HostStep::DropRatio { tiers: t, ratio, .. } if t == tiers && ratio == third),
        "{steps:?}"
    );
    assert!(
        matches!(steps[1], HostStep::Surge { tiers: t, .. } if t == tiers),
        "{steps:?}"
    );
    // A message with tiers of another length drops the bucket's ratio from every tier.
    let mut odd = instruction("all", 1.0 / 3.0, None);
    odd.tier_drop_ratio = vec![0, 0];
    let steps = core.on_instructions(at(8_020), instructions(vec![odd]));
    assert!(
        matches!(steps[0], HostStep::DropRatio { tiers: t, .. } if t == uniform(third)),
        "{steps:?}"
    );
}

#[test]
fn instructions_with_new_rules_wait_until_the_rules_are_applied() {
    let mut core = core(DROP);
    let mut message = instructions(vec![instruction("shared", 0.0, Some(0.5))]);
    let rules = crate::RulesSnapshot::parse(4, ADAPTIVE, "new")
        .unwrap()
        .message();
    message.rules = Some(rules.clone());
    let steps = core.on_instructions(at(8_010), message.clone());
    assert_eq!(steps, [HostStep::Rules { version: 4, rules }]);
    // Refused: the host keeps version 3, and `shared` is no bucket of its rules.
    assert!(core.rules_refused(at(8_011)).is_empty());
    assert_eq!(core.rules_version(), 3);
    // Applied: the share reaches the bucket the new rules brought.
    core.on_instructions(at(8_020), message);
    let steps = core.rules_applied(at(8_021), 4, &load_str(ADAPTIVE, "new").unwrap());
    assert_eq!(core.rules_version(), 4);
    assert_eq!(
        steps,
        [HostStep::Share {
            bucket: 1,
            share: Ratio::from_f64(0.5)
        }]
    );
    assert_eq!(core.bucket(1), &BucketKey::new("api", "shared"));
}

#[test]
fn a_share_expires_with_its_ttl() {
    let mut core = core(ADAPTIVE);
    core.on_instructions(
        at(8_000),
        instructions(vec![instruction("shared", 0.0, Some(0.5))]),
    );
    assert!(core.expire_shares(at(12_999).clock).is_empty());
    assert_eq!(
        core.expire_shares(at(13_000).clock),
        [HostStep::ShareExpired { bucket: 1 }]
    );
    assert!(core.expire_shares(at(20_000).clock).is_empty(), "once");
}

#[test]
fn the_surge_guard_starts_counting_at_its_first_tick_and_can_be_turned_off() {
    let mut core = core(DROP);
    assert!(core.guard_tick(at(0).clock, &[offered(0)]).is_empty());
    let steps = core.guard_tick(at(50).clock, &[offered(10)]);
    assert!(
        matches!(steps.as_slice(), [HostStep::Surge { bucket: 0, until, .. }] if *until == at(150).clock),
        "{steps:?}"
    );
    let off = DROP.replace(
        "version: 1\n",
        "version: 1\ncontrol:\n  surge_guard: false\n",
    );
    core.set_rules(&load_str(&off, "off").unwrap());
    assert!(core.guard_tick(at(100).clock, &[offered(20)]).is_empty());
}

#[test]
fn a_bucket_recreated_with_counters_at_zero_counts_from_zero() {
    let mut core = core(DROP);
    core.start(at(7_000), &[offered(500)]);
    core.on_deadline(at(7_750), &[offered(600)]);
    // A reload recreated the bucket: its totals restarted below what was reported.
    let report = core.on_deadline(at(8_000), &[offered(30)]).unwrap();
    assert_eq!(report.buckets[0].offered, 130);
}

#[test]
fn instructions_of_an_older_epoch_give_no_step() {
    let mut core = core(DROP);
    let newer = v1::Instructions {
        epoch: 5,
        ..instructions(vec![instruction("all", 0.25, None)])
    };
    let older = v1::Instructions {
        epoch: 4,
        ..instructions(vec![instruction("all", 0.0, None)])
    };
    assert!(!core.on_instructions(at(8_010), newer.clone()).is_empty());
    assert!(core.on_instructions(at(8_020), older.clone()).is_empty());
    assert_eq!(
        core.last_instructions_ms(),
        8_010,
        "a dropped set is not heard"
    );
    assert_eq!(core.fence().dropped(), 1);
    // Even carrying rules: the older epoch's rules are not asked for.
    let older_rules = v1::Instructions {
        rules: Some(v1::Rules {
            version: 9,
            ..Default::default()
        }),
        ..older
    };
    assert!(core.on_instructions(at(8_030), older_rules).is_empty());
    assert!(!core.on_instructions(at(9_010), newer).is_empty());
    assert_eq!(core.fence().epoch(), 5);
}

#[test]
fn a_hello_names_the_host_and_counts_nothing_of_the_interval_in_progress() {
    let mut core = core(DROP);
    core.start(at(8_300), &[offered(40)]);
    let hello = core.hello();
    assert_eq!((hello.host_id.as_str(), hello.sequence), ("h1", 7));
    assert!(hello.buckets.is_empty());
    assert_eq!(core.on_deadline(at(8_750), &[offered(85)]), None);
    let report = core.on_deadline(at(9_000), &[offered(110)]).unwrap();
    assert_eq!(report.sequence, 8);
}

#[test]
fn a_token_budgets_guard_counts_requests_worth_of_tokens_and_takes_no_burst_of_sizes_for_a_surge() {
    const TOKENS: &str =
        "version: 1\nservices:\n  llm:\n    buckets:\n      - { name: tokens, limit: 10000/s }\n";
    // 7,500 tokens a second against a part of 10,000: three answers of 1,000 tokens together
    // every 400 ms. Counted in tokens as if they were requests, a tick's 3,000 looks like a
    // surge; counted in requests of 1,000 tokens it is three requests, well within the spread.
    let engaged = |unit: f64| {
        let mut core = core(TOKENS);
        core.set_units(&[unit]);
        let mut instruction = instruction("tokens", 0.0, None);
        instruction.service = "llm".into();
        instruction.scope_offered_rps = 7_500.0;
        core.on_instructions(at(8_010), instructions(vec![instruction]));
        let mut total = 0;
        let mut engaged = false;
        for tick in 0..60u64 {
            if tick % 8 == 7 {
                total += 3_000;
            }
            for step in core.guard_tick(at(8_050 + 50 * tick).clock, &[offered(total)]) {
                if let HostStep::Surge { ratio, .. } = step {
                    engaged |= ratio > Ratio::ZERO;
                }
            }
        }
        engaged
    };
    assert!(
        engaged(1.0),
        "counted as requests, the sizes' burst engages"
    );
    assert!(
        !engaged(1_000.0),
        "counted in requests of 1,000 tokens, it does not"
    );
}

#[test]
fn a_quiet_guard_tick_cannot_engage_and_gives_the_same_steps_when_run_later() {
    // One host ticked every 50 ms, a copy that skips the ticks `guard_quiet` calls quiet and
    // runs them, with the same instants and totals, just before its next arrival or instruction,
    // and a second copy that runs each such run of quiet ticks in one call.
    let mut rng = fastrand::Rng::with_seed(7);
    let (mut eager, mut lazy, mut batched) = (core(DROP), core(DROP), core(DROP));
    let mut instruction = instruction("all", 0.0, None);
    instruction.scope_offered_rps = 40.0;
    instruction.scope_hosts = 4;
    let mut total = 0;
    let mut late: Vec<Nanos> = Vec::new();
    let catch_up =
        |lazy: &mut HostCore, batched: &mut HostCore, late: &mut Vec<Nanos>, total: u64| {
            let mut at_once = Vec::new();
            if let Some(&first) = late.first() {
                batched.guard_quiet_ticks_into(
                    first,
                    late.len() as u64,
                    &[offered(total)],
                    &mut at_once,
                );
                assert_eq!(batched.take_surge_report(), None);
            }
            let mut last = Vec::new();
            for now in late.drain(..) {
                last = lazy.guard_tick(now, &[offered(total)]);
                assert_eq!(lazy.take_surge_report(), None);
            }
            assert_eq!(at_once, last, "a run of quiet ticks at once");
            last
        };
    let (mut quiet, mut engaged, mut runs) = (0, 0, 0);
    for tick in 0..200u64 {
        let now = at(7_000 + 50 * tick).clock;
        let is_quiet = eager.guard_quiet(&[offered(total)]);
        let eager_last = eager.guard_tick(now, &[offered(total)]);
        let report = eager.take_surge_report();
        if is_quiet {
            assert_eq!(report, None, "a quiet tick engaged at {now}");
            quiet += 1;
            late.push(now);
        } else {
            runs += usize::from(late.len() > 1);
            catch_up(&mut lazy, &mut batched, &mut late, total);
            assert_eq!(lazy.guard_tick(now, &[offered(total)]), eager_last);
            assert_eq!(batched.guard_tick(now, &[offered(total)]), eager_last);
            assert_eq!(lazy.take_surge_report(), report);
            assert_eq!(batched.take_surge_report(), report);
            engaged += usize::from(report.is_some());
        }
        if tick == 20 {
            // An instruction 10 ms after the tick.
            runs += usize::from(late.len() > 1);
            let last = catch_up(&mut lazy, &mut batched, &mut late, total);
            assert!(last.is_empty() || last == eager_last);
            let set = instructions(vec![instruction.clone()]);
            let steps = eager.on_instructions(at(8_010), set.clone());
            assert_eq!(lazy.on_instructions(at(8_010), set.clone()), steps);
            assert_eq!(batched.on_instructions(at(8_010), set), steps);
        }
        // Calm: one request in a tick now and then; from 5 s to 7 s, a surge of 20 a tick.
        let n = if (100..140).contains(&tick) {
            15 + rng.u64(0..10)
        } else {
            u64::from(rng.u8(..) < 12)
        };
        if n > 0 {
            runs += usize::from(late.len() > 1);
            let last = catch_up(&mut lazy, &mut batched, &mut late, total);
            assert!(last.is_empty() || last == eager_last);
            total += n;
        }
    }
    assert!(quiet > 100, "{quiet} quiet ticks");
    assert!(runs > 5, "{runs} runs of several quiet ticks");
    assert!(engaged > 0, "the surge engaged the guard");
}
