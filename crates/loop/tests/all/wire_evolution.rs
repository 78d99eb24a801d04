//! Wire evolution: control-plane messages of the previous shape still decode and apply,
//! and what a newer controller sends still works for an older host, so a fleet upgrades one
//! process at a time.
//!
//! `old` below copies the messages as `control.proto` defined them before `Rules.json` (rules as
//! data) was added; `RECORDED` holds the bytes of one such message as an older controller sent
//! them, so neither copy can drift from what was really on the wire.

use prost::Message;
use spillway_core::algo::Ratio;
use spillway_core::config::{self, Config};
use spillway_loop::{
    DecodeRules, HostCore, HostId, HostStep, HostTime, LinkRules, RegionCore, RegionStep,
    RulesMessage, RulesSnapshot, ZoneCore, ZoneStep,
};
use spillway_proto::v1;

/// The messages before rules travelled as data.
mod old {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Rules {
        #[prost(uint64, tag = "1")]
        pub version: u64,
        #[prost(string, tag = "2")]
        pub yaml: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BucketInstruction {
        #[prost(string, tag = "1")]
        pub service: String,
        #[prost(string, tag = "2")]
        pub bucket: String,
        #[prost(uint64, tag = "3")]
        pub drop_ratio: u64,
        #[prost(uint64, optional, tag = "4")]
        pub share: Option<u64>,
        #[prost(double, tag = "5")]
        pub scope_offered_rps: f64,
        #[prost(uint64, tag = "6")]
        pub scope_hosts: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Instructions {
        #[prost(uint64, tag = "1")]
        pub issued_at_ms: u64,
        #[prost(uint64, tag = "2")]
        pub ttl_ms: u64,
        #[prost(uint64, tag = "3")]
        pub interval_ms: u64,
        #[prost(uint64, tag = "4")]
        pub sequence: u64,
        #[prost(message, repeated, tag = "5")]
        pub buckets: Vec<BucketInstruction>,
        #[prost(uint64, tag = "6")]
        pub rules_version: u64,
        #[prost(message, optional, tag = "7")]
        pub rules: Option<Rules>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ZoneInstructions {
        #[prost(message, optional, tag = "1")]
        pub instructions: Option<Instructions>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct BucketCounts {
        #[prost(string, tag = "1")]
        pub service: String,
        #[prost(string, tag = "2")]
        pub bucket: String,
        #[prost(uint64, tag = "3")]
        pub offered: u64,
        #[prost(uint64, tag = "4")]
        pub allowed: u64,
        #[prost(uint64, tag = "5")]
        pub shadow_dropped: u64,
        #[prost(uint64, optional, tag = "6")]
        pub offered_tail: Option<u64>,
        #[prost(uint64, optional, tag = "7")]
        pub hosts: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Report {
        #[prost(string, tag = "1")]
        pub host_id: String,
        #[prost(string, tag = "2")]
        pub zone: String,
        #[prost(string, tag = "3")]
        pub region: String,
        #[prost(uint64, tag = "4")]
        pub rules_version: u64,
        #[prost(uint64, tag = "5")]
        pub sequence: u64,
        #[prost(uint64, tag = "6")]
        pub interval_ms: u64,
        #[prost(message, repeated, tag = "7")]
        pub buckets: Vec<BucketCounts>,
    }

    /// A zone's sums before buckets went by number on the controller's stream (its hosts,
    /// `gone` and `surge` left out: they did not change).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ZoneReport {
        #[prost(string, tag = "1")]
        pub zone: String,
        #[prost(string, tag = "2")]
        pub region: String,
        #[prost(uint64, tag = "3")]
        pub sequence: u64,
        #[prost(uint64, tag = "4")]
        pub interval_ms: u64,
        #[prost(message, repeated, tag = "5")]
        pub buckets: Vec<BucketCounts>,
        #[prost(uint32, tag = "6")]
        pub clients: u32,
    }
}

/// A controller's file as an older controller sent it, word for word: a comment and a `redis`
/// section with a password in its URL.
const CONTROLLER_FILE: &str = "# secret comment\nversion: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 100/s }\nredis: { url: \"redis://:hunter2@10.0.0.1:6379\" }\n";

/// `old::Rules { version: 7, yaml: CONTROLLER_FILE }` as an older controller encoded it.
const RECORDED: &str = "0807128f01232073656372657420636f6d6d656e740a76657273696f6e3a20310a73657276696365733a0a20206170693a0a202020206275636b6574733a0a2020202020202d207b206e616d653a20616c6c2c206c696d69743a203130302f73207d0a72656469733a207b2075726c3a202272656469733a2f2f3a68756e746572324031302e302e302e313a3633373922207d0a";

/// The host's own file: its own identity and its own Redis, and no services yet.
const HOST_FILE: &str =
    "version: 1\nidentity:\n  user: header:x-account\nredis: { url: redis://127.0.0.1:6390 }\n";

const NOW_MS: u64 = 1_800_000_000_000;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn at(ms: u64) -> HostTime {
    HostTime {
        clock: ms * 1_000_000,
        unix_ns: ms * 1_000_000,
    }
}

fn host(own: &Config) -> HostCore {
    let id = HostId {
        host_id: "h1".into(),
        region: "r1".into(),
        zone: "r1z1".into(),
    };
    let mut core = HostCore::new(id, own, 0);
    core.start(at(NOW_MS), &[]);
    core
}

/// Instructions of the previous shape: half of `api/all` dropped, with the controller's rules.
fn old_instructions(rules: old::Rules) -> old::Instructions {
    old::Instructions {
        issued_at_ms: NOW_MS,
        ttl_ms: 5_000,
        interval_ms: 1_000,
        sequence: NOW_MS / 1_000 - 1,
        buckets: vec![old::BucketInstruction {
            service: "api".into(),
            bucket: "all".into(),
            drop_ratio: Ratio::from_f64(0.5).raw(),
            share: None,
            scope_offered_rps: 200.0,
            scope_hosts: 1,
        }],
        rules_version: rules.version,
        rules: Some(rules),
    }
}

/// What a new host does with instructions: rules first, run with its own settings.
fn apply(core: &mut HostCore, own: &Config, message: v1::Instructions) -> (Config, Vec<HostStep>) {
    let steps = core.on_instructions(at(NOW_MS + 10), message);
    let [HostStep::Rules { version, rules }] = steps.as_slice() else {
        panic!("rules first, alone: {steps:?}");
    };
    let config = LinkRules::decode(rules)
        .and_then(|r| r.with_own(own, "control-plane rules"))
        .unwrap();
    let more = core.rules_applied(at(NOW_MS + 11), *version, &config);
    (config, more)
}

#[test]
fn the_recorded_bytes_are_the_old_definition() {
    let rules = old::Rules {
        version: 7,
        yaml: CONTROLLER_FILE.into(),
    };
    assert_eq!(hex(&rules.encode_to_vec()), RECORDED);
}

#[test]
fn rules_of_the_previous_shape_decode_and_a_new_host_runs_their_services_with_its_own_settings() {
    let own = config::load_str(HOST_FILE, "host.yaml").unwrap();
    let rules = old::Rules::decode(unhex(RECORDED).as_slice()).unwrap();
    let bytes = old_instructions(rules).encode_to_vec();

    // The new code reads the old bytes: no `json`, the file in `yaml`.
    let message = v1::Instructions::decode(bytes.as_slice()).unwrap();
    let carried = message.rules.as_ref().unwrap();
    assert_eq!((carried.version, carried.json.as_str()), (7, ""));

    let mut core = host(&own);
    let (config, more) = apply(&mut core, &own, message);
    // The services came from the controller; identity and Redis stayed the host's own.
    assert_eq!(
        config.services,
        config::load_str(CONTROLLER_FILE, "c").unwrap().services
    );
    assert_eq!(config.identity, own.identity);
    assert_eq!(config.redis, own.redis);
    assert!(!format!("{config:?}").contains("hunter2"));
    assert_eq!(core.rules_version(), 7);
    // And the instructions that came with them apply to the bucket they brought.
    assert!(
        more.iter().any(|s| matches!(
            s,
            HostStep::DropRatio { bucket: 0, ratio, .. } if (ratio.as_f64() - 0.5).abs() < 1e-6
        )),
        "{more:?}"
    );
}

#[test]
fn instructions_through_an_older_aggregator_lose_the_data_field_and_still_apply() {
    // A new controller's rules, relayed by an aggregator that predates `json`: prost drops the
    // field it does not know, and what reaches the host is the rendered `yaml` alone.
    let snapshot = RulesSnapshot::parse(8, CONTROLLER_FILE, "rules.yaml").unwrap();
    let mut instructions = old_instructions(old::Rules::default());
    instructions.rules = None;
    let mut new = v1::Instructions::decode(instructions.encode_to_vec().as_slice()).unwrap();
    new.rules_version = 8;
    new.rules = Some(snapshot.message());
    let relayed = old::ZoneInstructions::decode(
        v1::ZoneInstructions {
            instructions: Some(new),
            bucket_ids: false,
        }
        .encode_to_vec()
        .as_slice(),
    )
    .unwrap();
    let bytes = relayed.instructions.unwrap().encode_to_vec();
    let message = v1::Instructions::decode(bytes.as_slice()).unwrap();
    assert!(message.rules.as_ref().unwrap().json.is_empty());

    let own = config::load_str(HOST_FILE, "host.yaml").unwrap();
    let mut core = host(&own);
    let (config, _) = apply(&mut core, &own, message);
    assert_eq!(config.services, snapshot.config.services);
    assert_eq!(config.redis, own.redis);
    assert_eq!(core.rules_version(), 8);
}

#[test]
fn an_older_host_runs_what_a_new_controller_sends_and_sees_no_comment_nor_redis() {
    let snapshot = RulesSnapshot::parse(9, CONTROLLER_FILE, "rules.yaml").unwrap();
    let bytes = snapshot.message().encode_to_vec();
    // The older host decodes the field it knows and, as it always did, loads it as a file.
    let seen = old::Rules::decode(bytes.as_slice()).unwrap();
    assert_eq!(seen.version, 9);
    assert!(!seen.yaml.contains("secret comment"), "{}", seen.yaml);
    assert!(!seen.yaml.contains("hunter2"), "{}", seen.yaml);
    assert!(!seen.yaml.contains("redis"), "{}", seen.yaml);
    let config = config::load_str(&seen.yaml, "control-plane rules version 9").unwrap();
    assert_eq!(config.services, snapshot.config.services);
    assert_eq!(config.control, snapshot.config.control);
    assert_eq!(config.identity, snapshot.config.identity);
}

#[test]
fn a_report_of_the_previous_shape_is_summed() {
    let report = old::Report {
        host_id: "h1".into(),
        zone: "r1z1".into(),
        region: "r1".into(),
        rules_version: 7,
        sequence: NOW_MS / 1_000,
        interval_ms: 1_000,
        buckets: vec![old::BucketCounts {
            service: "api".into(),
            bucket: "all".into(),
            offered: 120,
            allowed: 100,
            shadow_dropped: 0,
            offered_tail: Some(30),
            hosts: None,
        }],
    };
    let message = v1::Report::decode(report.encode_to_vec().as_slice()).unwrap();
    let mut zone = ZoneCore::new("r1", "r1z1", NOW_MS);
    let mut steps = zone.on_report(NOW_MS + 1_000, 1, message);
    steps.extend(zone.poll(NOW_MS + 3_000));
    let forwarded: Vec<&v1::ZoneReport> = steps
        .iter()
        .filter_map(|s| match s {
            ZoneStep::Forward(r) => Some(r),
            _ => None,
        })
        .collect();
    // Only the reported interval: the next one closes without the host, which its counts of
    // this one stand in for (one interval, `ZoneCore::poll`).
    let counted: u64 = forwarded
        .iter()
        .filter(|r| r.sequence == NOW_MS / 1_000)
        .flat_map(|r| &r.buckets)
        .filter(|b| b.bucket == "all")
        .map(|b| b.offered)
        .sum();
    assert_eq!(counted, 120, "{forwarded:?}");
    assert!(forwarded.iter().any(|r| r.clients == 1), "{forwarded:?}");
}

/// A zone's report of `api/all` at `offered` for the interval before `now_ms`, as an aggregator
/// older than the bucket numbers sent it.
fn old_zone_report(now_ms: u64, offered: u64) -> old::ZoneReport {
    old::ZoneReport {
        zone: "r1z1".into(),
        region: "r1".into(),
        sequence: now_ms / 1_000 - 1,
        interval_ms: 1_000,
        buckets: vec![old::BucketCounts {
            service: "api".into(),
            bucket: "all".into(),
            offered,
            allowed: offered,
            hosts: Some(1),
            ..Default::default()
        }],
        clients: 1,
    }
}

#[test]
fn an_older_aggregator_is_summed_by_name_and_instructed_by_name_every_interval() {
    let rules = RulesSnapshot::parse(1, CONTROLLER_FILE, "rules.yaml").unwrap();
    let mut region = RegionCore::new("r1", rules.into(), NOW_MS);
    region.join(1, "r1z1");
    for (interval, offered) in [(1, 150), (2, 300)] {
        let now = NOW_MS + interval * 1_000 + 1;
        let bytes = old_zone_report(now, offered).encode_to_vec();
        let report = v1::ZoneReport::decode(bytes.as_slice()).unwrap();
        let steps = region.on_zone_report(1, report, now);
        let sent: Vec<old::ZoneInstructions> = steps
            .iter()
            .filter_map(|s| match s {
                RegionStep::Send { instructions, .. } => Some(instructions.encode_to_vec()),
                _ => None,
            })
            .map(|bytes| old::ZoneInstructions::decode(bytes.as_slice()).unwrap())
            .collect();
        let [sent] = sent.as_slice() else {
            panic!("one zone, one message: {sent:?}");
        };
        let buckets = &sent.instructions.as_ref().unwrap().buckets;
        let [bucket] = buckets.as_slice() else {
            panic!("one bucket: {buckets:?}");
        };
        assert_eq!(
            (bucket.service.as_str(), bucket.bucket.as_str()),
            ("api", "all")
        );
        let expected = 1.0 - 100.0 / offered as f64;
        assert!((Ratio::from_raw(bucket.drop_ratio).as_f64() - expected).abs() < 0.01);
    }
    assert_eq!(region.unbound_ids(), 0);
}

#[test]
fn a_numbering_aggregator_names_every_bucket_to_an_older_controller() {
    let mut zone = ZoneCore::new("r1", "r1z1", NOW_MS);
    zone.number_buckets();
    zone.upstream_opened();
    zone.join("h1", 1);
    for interval in 1..=3 {
        let now = NOW_MS + interval * 1_000 + 1;
        let report = v1::Report {
            host_id: "h1".into(),
            zone: "r1z1".into(),
            region: "r1".into(),
            sequence: now / 1_000 - 1,
            interval_ms: 1_000,
            buckets: vec![v1::BucketCounts {
                service: "api".into(),
                bucket: "all".into(),
                offered: 100,
                allowed: 100,
                ..Default::default()
            }],
            ..Default::default()
        };
        let steps = zone.on_report(now, 1, report);
        let [ZoneStep::Forward(forward)] = steps.as_slice() else {
            panic!("the interval forwarded: {steps:?}");
        };
        let seen = old::ZoneReport::decode(forward.encode_to_vec().as_slice()).unwrap();
        let names: Vec<(&str, &str)> = seen
            .buckets
            .iter()
            .map(|b| (b.service.as_str(), b.bucket.as_str()))
            .collect();
        assert_eq!(names, [("api", "all")], "interval {interval}");
        // The older controller's instructions, by name, say nothing of numbers.
        let mut instructions = old_instructions(old::Rules::default());
        instructions.rules = None;
        let message = old::ZoneInstructions {
            instructions: Some(instructions),
        };
        let message = v1::ZoneInstructions::decode(message.encode_to_vec().as_slice()).unwrap();
        assert!(!message.bucket_ids);
        let steps = zone.on_instructions(now + 50, message);
        assert!(
            steps
                .iter()
                .any(|s| matches!(s, ZoneStep::Send { instructions, .. }
                if instructions.buckets.iter().any(|b| b.bucket == "all"))),
            "{steps:?}"
        );
    }
    assert_eq!(zone.unbound_ids(), 0);
}
