//! One interval's instructions for many zones, kept as what every zone gets alike and what each
//! gets of its own, so the common part is built and encoded once per interval rather than once
//! per zone.
//!
//! A region-scoped or global drop-ratio bucket's instruction is the same for every zone that
//! takes buckets by number (its ratio, its scope's load, its number); only a zone-scoped bucket,
//! an adaptive bucket's share, a bucket whose names are due on the stream, or every bucket of an
//! aggregator older than the numbers differs. At 100 zones x 10,000 buckets, building and
//! encoding each zone's 10,000 instructions apart was half of a controller's CPU; the bytes of
//! [`SharedInstructions::encode`] are those prost writes for [`SharedInstructions::to_message`],
//! so the wire is unchanged.

use std::sync::{Arc, OnceLock};

use prost::Message;
use prost::bytes::BufMut;
use prost::encoding::{self as wire, WireType, encode_key, encode_varint, message, uint64};
use spillway_proto::v1;

/// `Instructions.buckets`' field number.
const BUCKETS_TAG: u32 = 5;
/// `ZoneInstructions.instructions`' field number.
const INSTRUCTIONS_TAG: u32 = 1;

/// The instructions every zone of one interval gets alike: one per computed bucket, in the
/// rules' order. At a bucket whose instruction differs per zone the entry is a stand-in that
/// every zone's own entry replaces.
#[derive(Debug, Default)]
pub(super) struct Common {
    buckets: Vec<v1::BucketInstruction>,
    /// The buckets encoded as `Instructions.buckets` entries, by the first zone stream that
    /// sends them.
    encoded: OnceLock<Encoded>,
}

impl Common {
    pub fn new(buckets: Vec<v1::BucketInstruction>) -> Self {
        Self {
            buckets,
            encoded: OnceLock::new(),
        }
    }

    pub fn buckets(&self) -> &[v1::BucketInstruction] {
        &self.buckets
    }

    fn encoded(&self) -> &Encoded {
        self.encoded.get_or_init(|| {
            let mut bytes = Vec::new();
            let mut ends = Vec::with_capacity(self.buckets.len());
            for b in &self.buckets {
                message::encode(BUCKETS_TAG, b, &mut bytes);
                ends.push(bytes.len());
            }
            Encoded { bytes, ends }
        })
    }
}

/// [`Common`]'s buckets as they go on the wire, each with its field key and length.
#[derive(Debug)]
struct Encoded {
    bytes: Vec<u8>,
    /// Where each bucket's bytes end (they start where the one's before end).
    ends: Vec<usize>,
}

impl Encoded {
    fn range(&self, from: usize, to: usize) -> &[u8] {
        let start = if from == 0 { 0 } else { self.ends[from - 1] };
        let end = if to == 0 { 0 } else { self.ends[to - 1] };
        &self.bytes[start..end]
    }
}

/// One zone stream's instructions of one interval: the message without its buckets, and its
/// buckets as the interval's [`Common`] ones with this zone's own in their places.
#[derive(Debug, Clone)]
pub struct SharedInstructions {
    head: v1::ZoneInstructions,
    /// The rules it carries, shared with the other zones' messages that carry them (the
    /// head's are left out: 10,000 buckets' rules are megabytes).
    rules: Option<Arc<v1::Rules>>,
    /// `None`: no bucket (a zone that has not reported yet).
    common: Option<Arc<Common>>,
    /// This zone's own buckets, by their place in the common ones, in order.
    own: Vec<(u32, v1::BucketInstruction)>,
}

impl PartialEq for SharedInstructions {
    fn eq(&self, other: &Self) -> bool {
        self.head == other.head && self.rules == other.rules && self.buckets().eq(other.buckets())
    }
}

impl SharedInstructions {
    /// `head` (whose buckets and rules are left empty) with `rules`, the `common` buckets and
    /// `own` in their places.
    pub(super) fn new(
        mut head: v1::ZoneInstructions,
        rules: Option<Arc<v1::Rules>>,
        common: Option<Arc<Common>>,
        own: Vec<(u32, v1::BucketInstruction)>,
    ) -> Self {
        if let Some(i) = &mut head.instructions {
            i.buckets.clear();
            i.rules = None;
        }
        debug_assert!(own.windows(2).all(|w| w[0].0 < w[1].0));
        debug_assert!(own.last().is_none_or(|&(at, _)| {
            common
                .as_ref()
                .is_some_and(|c| (at as usize) < c.buckets.len())
        }));
        Self {
            head,
            rules,
            common,
            own,
        }
    }

    /// `message` as one zone's alone: its buckets shared with no other.
    pub fn whole(mut message: v1::ZoneInstructions) -> Self {
        let (buckets, rules) = match message.instructions.as_mut() {
            Some(i) => (Some(std::mem::take(&mut i.buckets)), i.rules.take()),
            None => (None, None),
        };
        Self {
            head: message,
            rules: rules.map(Arc::new),
            common: buckets.map(|b| Arc::new(Common::new(b))),
            own: Vec::new(),
        }
    }

    /// The message without its buckets and rules.
    pub fn head(&self) -> &v1::ZoneInstructions {
        &self.head
    }

    /// The rules it carries, if any.
    pub fn rules(&self) -> Option<&v1::Rules> {
        self.rules.as_deref()
    }

    /// Every bucket's instruction, in order.
    pub fn buckets(&self) -> impl Iterator<Item = &v1::BucketInstruction> {
        let common = self.common.as_deref().map_or(&[][..], Common::buckets);
        let mut own = self.own.iter().peekable();
        common.iter().enumerate().map(move |(at, b)| {
            match own.next_if(|(place, _)| *place as usize == at) {
                Some((_, mine)) => mine,
                None => b,
            }
        })
    }

    /// The buckets this zone got of its own (names due on its stream among them).
    pub fn own(&self) -> impl Iterator<Item = &v1::BucketInstruction> {
        self.own.iter().map(|(_, b)| b)
    }

    /// How many buckets it instructs.
    pub fn len(&self) -> usize {
        self.common.as_ref().map_or(0, |c| c.buckets.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole message, as a [`RegionStep::Send`](super::RegionStep::Send) carries it.
    pub fn to_message(&self) -> v1::ZoneInstructions {
        let mut message = self.head.clone();
        if let Some(i) = &mut message.instructions {
            i.buckets = self.buckets().cloned().collect();
            i.rules = self.rules.as_deref().cloned();
        }
        message
    }

    /// The length of the `Instructions` message's buckets, encoded.
    fn buckets_len(&self) -> usize {
        let Some(common) = &self.common else {
            return 0;
        };
        let encoded = common.encoded();
        let mut len = encoded.bytes.len();
        for (at, b) in &self.own {
            let at = *at as usize;
            len -= encoded.range(at, at + 1).len();
            len += message::encoded_len(BUCKETS_TAG, b);
        }
        len
    }

    /// Writes the message as prost writes [`SharedInstructions::to_message`]'s, the common
    /// buckets copied from their encoding of the interval (encoded by the first zone's call).
    pub fn encode(&self, buf: &mut impl BufMut) {
        let Some(i) = &self.head.instructions else {
            self.head.encode_raw(buf);
            return;
        };
        let rules = self.rules.as_deref();
        let inner = before_len(i) + self.buckets_len() + after_len(i, rules);
        encode_key(INSTRUCTIONS_TAG, WireType::LengthDelimited, buf);
        encode_varint(inner as u64, buf);
        encode_before(i, buf);
        if let Some(common) = &self.common {
            let encoded = common.encoded();
            let mut from = 0;
            for (at, b) in &self.own {
                let at = *at as usize;
                buf.put_slice(encoded.range(from, at));
                message::encode(BUCKETS_TAG, b, buf);
                from = at + 1;
            }
            buf.put_slice(encoded.range(from, common.buckets.len()));
        }
        encode_after(i, rules, buf);
        if self.head.bucket_ids {
            wire::bool::encode(2, &true, buf);
        }
    }

    /// [`SharedInstructions::encode`]'s bytes.
    pub fn encode_to_vec(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        self.encode(&mut bytes);
        bytes
    }
}

// `Instructions`' fields before its buckets (1 to 4) and after them (6 to 10), written as
// prost writes them: in number order, a field at its default left out. The test
// `a_whole_message_encodes_as_prost_encodes_it` names every field, so a new one is caught there.

fn before_len(i: &v1::Instructions) -> usize {
    [
        (1, i.issued_at_ms),
        (2, i.ttl_ms),
        (3, i.interval_ms),
        (4, i.sequence),
    ]
    .iter()
    .filter(|&&(_, v)| v != 0)
    .map(|&(tag, v)| uint64::encoded_len(tag, &v))
    .sum()
}

fn encode_before(i: &v1::Instructions, buf: &mut impl BufMut) {
    for (tag, v) in [
        (1, i.issued_at_ms),
        (2, i.ttl_ms),
        (3, i.interval_ms),
        (4, i.sequence),
    ] {
        if v != 0 {
            uint64::encode(tag, &v, buf);
        }
    }
}

fn after_len(i: &v1::Instructions, rules: Option<&v1::Rules>) -> usize {
    let mut len = 0;
    if i.rules_version != 0 {
        len += uint64::encoded_len(6, &i.rules_version);
    }
    if let Some(rules) = rules {
        len += message::encoded_len(7, rules);
    }
    if i.provisional {
        len += wire::bool::encoded_len(8, &true);
    }
    if i.from_rates_now {
        len += wire::bool::encoded_len(9, &true);
    }
    if i.epoch != 0 {
        len += uint64::encoded_len(10, &i.epoch);
    }
    len
}

fn encode_after(i: &v1::Instructions, rules: Option<&v1::Rules>, buf: &mut impl BufMut) {
    if i.rules_version != 0 {
        uint64::encode(6, &i.rules_version, buf);
    }
    if let Some(rules) = rules {
        message::encode(7, rules, buf);
    }
    if i.provisional {
        wire::bool::encode(8, &true, buf);
    }
    if i.from_rates_now {
        wire::bool::encode(9, &true, buf);
    }
    if i.epoch != 0 {
        uint64::encode(10, &i.epoch, buf);
    }
}

#[cfg(test)]
mod tests {
    use spillway_core::algo::Ratio;

    use super::super::{RegionCore, RegionStep};
    use super::*;
    use crate::rules::RulesSnapshot;

    /// A region-scoped drop-ratio bucket (`r`, the same for every zone), a zone-scoped one
    /// (`z`), an adaptive one (`a`, each zone its share) and another region-scoped one (`s`).
    const RULES: &str = "version: 1\ncontrol:\n  report_interval: 1s\nservices:\n  api:\n    buckets:\n      - { name: r, match: { procedure: /r }, limit: 100/s, scope: region }\n      - { name: z, match: { procedure: /z }, limit: 50/s, scope: zone }\n      - { name: a, match: { procedure: /a }, limit: 10/s, algorithm: adaptive-token-bucket, scope: region }\n      - { name: s, match: { procedure: /s }, limit: 100/s, scope: region }\n";

    fn core(share: bool) -> RegionCore {
        let rules = Arc::new(RulesSnapshot::parse(1, RULES, "rules.yaml").unwrap());
        let mut core = RegionCore::new("r1", rules, 7_000);
        core.share_instructions(share);
        core
    }

    /// Zone `zone`'s report of `sequence`: every bucket named (with a number when `ids`, which
    /// also says it takes numbers), `scale` times a base load.
    fn report(zone: &str, sequence: u64, ids: bool, scale: u64) -> v1::ZoneReport {
        let buckets = ["r", "z", "a", "s"]
            .iter()
            .zip(1u32..)
            .map(|(bucket, id)| v1::BucketCounts {
                service: "api".into(),
                bucket: (*bucket).into(),
                id: if ids { id } else { 0 },
                offered: 60 * scale * u64::from(id),
                allowed: 50 * scale,
                hosts: Some(2),
                tier_offered: if *bucket == "s" {
                    vec![10 * scale, 20 * scale, 30 * scale, 180 * scale]
                } else {
                    Vec::new()
                },
                ..Default::default()
            })
            .collect();
        v1::ZoneReport {
            zone: zone.into(),
            region: "r1".into(),
            sequence,
            interval_ms: 1_000,
            buckets,
            bucket_ids: ids,
            clients: 2,
            ..Default::default()
        }
    }

    /// Streams: 1 and 2 the two aggregators of zone z1 (numbers), 3 of z2 (numbers), 4 of z3
    /// (older than the numbers: names every time, none taken).
    fn drive(core: &mut RegionCore) -> Vec<RegionStep> {
        let streams = [
            (1, "z1", true, 1),
            (2, "z1", true, 3),
            (3, "z2", true, 2),
            (4, "z3", false, 5),
        ];
        for (member, zone, _, _) in streams {
            core.join(member, zone);
        }
        let mut steps = Vec::new();
        for sequence in 7..10 {
            let now = (sequence + 1) * 1_000;
            for (member, zone, ids, scale) in streams {
                let report = report(zone, sequence, ids, scale);
                steps.extend(core.on_zone_report(member, report, now + member));
            }
            steps.extend(core.poll(now + 600));
        }
        steps
    }

    #[test]
    fn shared_instructions_are_the_whole_ones_and_encode_to_the_same_bytes() {
        let (mut whole, mut shared) = (core(false), core(true));
        let (whole, shared) = (drive(&mut whole), drive(&mut shared));
        assert_eq!(whole.len(), shared.len());
        let mut sent = 0;
        for (w, s) in whole.iter().zip(&shared) {
            match (w, s) {
                (
                    RegionStep::Send {
                        member,
                        instructions,
                    },
                    RegionStep::SendShared {
                        member: m,
                        instructions: i,
                    },
                ) => {
                    assert_eq!(member, m);
                    assert_eq!(instructions, &i.to_message());
                    assert_eq!(instructions.encode_to_vec(), i.encode_to_vec());
                    sent += 1;
                }
                (RegionStep::Announce(a), RegionStep::Announce(b)) => assert_eq!(a, b),
                _ => panic!("different steps: {w:?} and {s:?}"),
            }
        }
        assert_eq!(sent, 3 * 4, "three intervals, four streams");
    }

    #[test]
    fn zones_share_the_common_buckets_and_get_their_own_share_and_names() {
        let steps = drive(&mut core(true));
        let last: Vec<&SharedInstructions> = steps
            .iter()
            .rev()
            .filter_map(|s| match s {
                RegionStep::SendShared { instructions, .. } => Some(instructions),
                _ => None,
            })
            .take(4)
            .collect();
        let by_member = |n: usize| last[3 - n];
        let (z1a, z1b, z2, z3) = (by_member(0), by_member(1), by_member(2), by_member(3));
        // The common buckets are one allocation, encoded once for every stream.
        let common = |s: &SharedInstructions| s.common.clone().unwrap();
        assert!(Arc::ptr_eq(&common(z1a), &common(z2)));
        assert!(Arc::ptr_eq(&common(z1a), &common(z3)));
        // `r` and `s` come the same to every stream that takes numbers, byte for byte.
        let bucket = |s: &SharedInstructions, name: &str| -> v1::BucketInstruction {
            let at = ["r", "z", "a", "s"]
                .iter()
                .position(|b| *b == name)
                .unwrap();
            s.buckets().nth(at).unwrap().clone()
        };
        for name in ["r", "s"] {
            assert_eq!(
                bucket(z1a, name).encode_to_vec(),
                bucket(z2, name).encode_to_vec()
            );
            assert!(bucket(z1a, name).bucket.is_empty(), "named before");
        }
        assert!(!bucket(z1a, "s").tier_drop_ratio.is_empty());
        // Own: the adaptive share of each zone, split between z1's two aggregators by their
        // load (1 to 3); the zone-scoped bucket's ratio of each zone.
        let share =
            |s: &SharedInstructions| Ratio::from_raw(bucket(s, "a").share.unwrap()).as_f64();
        assert!((share(z1a) * 3.0 - share(z1b)).abs() < 1e-6);
        assert!(
            (share(z1a) + share(z1b) - share(z2) * 2.0).abs() < 1e-6,
            "z1: 4 parts, z2: 2"
        );
        assert_ne!(bucket(z1a, "z").drop_ratio, bucket(z3, "z").drop_ratio);
        // The stream older than the numbers gets every bucket by name, without a number.
        assert!(z3.buckets().all(|b| b.id == 0 && !b.bucket.is_empty()));
        assert_eq!(z3.own().count(), 4);
        assert_eq!(z2.own().count(), 2, "z and a only");
    }

    /// The first shared message among `steps`.
    fn first_shared(steps: &[RegionStep]) -> SharedInstructions {
        steps
            .iter()
            .find_map(|s| match s {
                RegionStep::SendShared { instructions, .. } => Some(instructions.clone()),
                _ => None,
            })
            .expect("a shared message among the steps")
    }

    #[test]
    fn a_lost_message_names_its_buckets_again() {
        let mut core = core(true);
        core.join(1, "z1");
        let mut steps = core.on_zone_report(1, report("z1", 7, true, 1), 8_001);
        steps.extend(core.poll(8_600));
        let first = first_shared(&steps);
        assert!(
            first.buckets().all(|b| !b.bucket.is_empty()),
            "named the first time"
        );
        core.shared_send_failed(1, &first);
        let mut steps = core.on_zone_report(1, report("z1", 8, true, 1), 9_001);
        steps.extend(core.poll(9_600));
        let again = first_shared(&steps);
        assert!(again.buckets().all(|b| !b.bucket.is_empty()), "named again");
        let rules = |s: &SharedInstructions| s.rules().is_some();
        assert!(rules(&first) && rules(&again), "the rules go again too");
    }

    #[test]
    fn a_whole_message_encodes_as_prost_encodes_it() {
        // Every field named, none left to `Default`: a field added to `Instructions` or
        // `ZoneInstructions` stops this test from compiling until `encode` writes it too.
        let message = v1::ZoneInstructions {
            instructions: Some(v1::Instructions {
                issued_at_ms: 5,
                ttl_ms: 4_000,
                interval_ms: 1_000,
                sequence: 3,
                buckets: vec![
                    v1::BucketInstruction {
                        id: 1,
                        drop_ratio: 7,
                        ..Default::default()
                    },
                    v1::BucketInstruction {
                        service: "api".into(),
                        bucket: "b".into(),
                        share: Some(0),
                        ..Default::default()
                    },
                ],
                rules_version: 2,
                rules: Some(v1::Rules {
                    version: 2,
                    yaml: "version: 2".into(),
                    json: "{}".into(),
                }),
                provisional: true,
                from_rates_now: true,
                epoch: 9,
            }),
            bucket_ids: true,
        };
        let whole = SharedInstructions::whole(message.clone());
        assert_eq!(whole.encode_to_vec(), message.encode_to_vec());
        assert_eq!(whole.to_message(), message);
        let empty = v1::ZoneInstructions::default();
        assert_eq!(
            SharedInstructions::whole(empty.clone()).encode_to_vec(),
            empty.encode_to_vec()
        );
    }
}
