//! What the controller keeps for its dashboard beside what its core computes: a few minutes of
//! each bucket's figures ([`History`]), the virtual drops its zones and peers report, when each
//! zone and peer was last heard from and each zone last instructed, and since when each host runs
//! its rules version.
//!
//! The driver feeds it the messages it already handles, under the same lock; nothing here runs
//! on a proxy. Everything is bounded: the buckets are those of the rules, the hosts those the
//! open streams reported (as the core keeps them), and the zones, peers and intervals waiting for
//! their sample are capped.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use spillway_loop::{BucketKey, RegionCore};
use spillway_proto::v1;

use super::history::{History, Sample};

/// Zones remembered, connected or not; a region has far fewer.
const MAX_ZONES: usize = 1024;
/// Peer regions remembered.
const MAX_PEERS: usize = 256;
/// Rules versions whose arrival time is remembered.
const MAX_VERSIONS: usize = 16;

/// A zone as its aggregators' streams show it.
#[derive(Debug, Clone, Default)]
pub(super) struct ZoneHealth {
    /// Aggregator streams open for it now (one, or two while one replaces the other).
    pub streams: u32,
    /// When its last report arrived (Unix ms), and the interval it covered.
    pub last_report_ms: Option<u64>,
    pub last_sequence: u64,
    /// Each open stream's clients as its last report gave them: a zone's two aggregators each
    /// count their own hosts ([`ZoneHealth::clients`]).
    parts: BTreeMap<u64, u32>,
    /// When instructions last went down its stream.
    pub last_instructions_ms: Option<u64>,
    /// Instructions its stream could not take (full: a slow aggregator).
    pub missed: u64,
    /// When its last stream ended, while none is open.
    pub left_ms: Option<u64>,
}

impl ZoneHealth {
    /// The clients of all its aggregators' last reports.
    pub fn clients(&self) -> u32 {
        self.parts.values().sum()
    }
}

/// A host's rules version as its zone's reports gave it.
#[derive(Debug, Clone, Copy)]
struct HostSeen {
    version: u64,
    since_ms: u64,
    member: u64,
}

/// The dashboard's record; see the module's documentation.
#[derive(Debug)]
pub(super) struct Record {
    history: HashMap<BucketKey, History>,
    zones: BTreeMap<String, ZoneHealth>,
    /// The zone of each aggregator stream, once it reported.
    members: HashMap<u64, String>,
    /// When each peer region's sums last arrived.
    peers: BTreeMap<String, u64>,
    /// Each host's rules version, since when it runs it, and the stream that reported it.
    hosts: HashMap<String, HostSeen>,
    /// When this controller got each of its last rules versions.
    versions: VecDeque<(u64, u64)>,
    /// The core's count of computed intervals at the last sample, and when that was.
    computed: u64,
    last_computed_ms: Option<u64>,
}

impl Record {
    pub(super) fn new(rules_version: u64, now_ms: u64) -> Self {
        Self {
            history: HashMap::new(),
            zones: BTreeMap::new(),
            members: HashMap::new(),
            peers: BTreeMap::new(),
            hosts: HashMap::new(),
            versions: VecDeque::from([(rules_version, now_ms)]),
            computed: 0,
            last_computed_ms: None,
        }
    }

    /// A zone's report on stream `member`, before the core takes it.
    pub(super) fn on_zone_report(&mut self, member: u64, report: &v1::ZoneReport, now_ms: u64) {
        if self.members.get(&member) != Some(&report.zone) {
            if let Some(old) = self.members.remove(&member) {
                self.stream_ended(&old, member, now_ms);
            }
            if self.zone_entry(&report.zone).is_some() {
                self.members.insert(member, report.zone.clone());
                if let Some(zone) = self.zones.get_mut(&report.zone) {
                    zone.streams += 1;
                    zone.left_ms = None;
                }
            }
        }
        if let Some(zone) = self.zones.get_mut(&report.zone) {
            zone.last_report_ms = Some(now_ms);
            zone.last_sequence = report.sequence;
            zone.parts.insert(member, report.clients);
        }
        for host in &report.hosts {
            match self.hosts.get_mut(&host.host_id) {
                // Reported again (a new stream of its aggregator): the same version since then.
                Some(seen) if seen.version == host.rules_version => seen.member = member,
                _ => {
                    let seen = HostSeen {
                        version: host.rules_version,
                        since_ms: now_ms,
                        member,
                    };
                    self.hosts.insert(host.host_id.clone(), seen);
                }
            }
        }
        for gone in &report.gone {
            self.hosts.remove(gone);
        }
    }

    /// Stream `member` ended, and the hosts it reported with it (as the core forgets them).
    pub(super) fn on_leave(&mut self, member: u64, now_ms: u64) {
        if let Some(zone) = self.members.remove(&member) {
            self.stream_ended(&zone, member, now_ms);
        }
        self.hosts.retain(|_, seen| seen.member != member);
    }

    /// A peer's sums, before the core takes them.
    pub(super) fn on_peer_sums(&mut self, core: &RegionCore, sums: &v1::RegionSums, now_ms: u64) {
        if sums.region.is_empty() || sums.region == core.region() {
            return;
        }
        if self.peers.len() < MAX_PEERS || self.peers.contains_key(&sums.region) {
            self.peers.insert(sums.region.clone(), now_ms);
        }
    }

    /// Instructions went down stream `member` (`sent`), or its stream was full.
    pub(super) fn on_instructions(&mut self, member: u64, sent: bool, now_ms: u64) {
        let Some(zone) = self
            .members
            .get(&member)
            .and_then(|z| self.zones.get_mut(z))
        else {
            return;
        };
        if sent {
            zone.last_instructions_ms = Some(now_ms);
        } else {
            zone.missed += 1;
        }
    }

    /// The controller now runs rules `version`.
    pub(super) fn on_rules(&mut self, version: u64, now_ms: u64) {
        if self.versions.back().is_some_and(|&(v, _)| v == version) {
            return;
        }
        if self.versions.len() == MAX_VERSIONS {
            self.versions.pop_front();
        }
        self.versions.push_back((version, now_ms));
    }

    /// After the core's steps: when it computed an interval since the last call (`sequence`,
    /// if its instructions said which), one sample per bucket of its view.
    pub(super) fn after_steps(&mut self, core: &RegionCore, sequence: Option<u64>, now_ms: u64) {
        if core.computed() == self.computed {
            return;
        }
        self.computed = core.computed();
        self.last_computed_ms = Some(now_ms);
        let interval = core.interval();
        // Without a zone to instruct, the interval computed is the one before the current.
        let sequence = sequence.unwrap_or_else(|| interval.sequence_at(now_ms).saturating_sub(1));
        let at_ms = interval.end_of(sequence);
        let config = &core.rules().config;
        // The shadow buckets, looked up per bucket of the view: a search of the rules per
        // bucket was quadratic, most of a controller's time at 10,000 buckets.
        let shadows: HashSet<(&str, &str)> = config
            .buckets()
            .filter(|(_, b)| b.mode == spillway_core::config::Mode::Shadow)
            .map(|(s, b)| (s.name.as_str(), b.name.as_str()))
            .collect();
        for (key, view) in core.view() {
            // What was offered and not admitted, from the same sums: a shadow bucket's virtual
            // drops (it drops nothing for real), an enforcing bucket's real ones.
            let not_admitted = (view.observed_rps - view.admitted_rps).max(0.0);
            let shadow = shadows.contains(&(key.service.as_str(), key.bucket.as_str()));
            let (real_drop_rps, shadow_drop_rps) = if shadow {
                (0.0, not_admitted)
            } else {
                (not_admitted, 0.0)
            };
            let sample = Sample {
                limit_rps: view.limit_rps,
                offered_rps: view.observed_rps,
                admitted_rps: view.admitted_rps,
                drop_ratio: view.drop_ratio,
                real_drop_rps,
                shadow_drop_rps,
            };
            // The same buckets interval after interval: a key is cloned only for a new one.
            match self.history.get_mut(key) {
                Some(history) => history.push(at_ms, interval.ms(), sample),
                None => {
                    let mut history = History::new();
                    history.push(at_ms, interval.ms(), sample);
                    self.history.insert(key.clone(), history);
                }
            }
        }
        // Buckets that left the rules take their history with them.
        if self.history.len() > core.view().len() {
            self.history.retain(|key, _| core.view().contains_key(key));
        }
    }

    /// A bucket's figures, if the core computed it.
    pub(super) fn history(&self, key: &BucketKey) -> Option<&History> {
        self.history.get(key)
    }

    pub(super) fn zones(&self) -> &BTreeMap<String, ZoneHealth> {
        &self.zones
    }

    /// Peer regions and when their sums last arrived.
    pub(super) fn peers(&self) -> &BTreeMap<String, u64> {
        &self.peers
    }

    /// Since when `host` runs `version`, as far as this controller saw.
    pub(super) fn host_since(&self, host: &str, version: u64) -> Option<u64> {
        self.hosts
            .get(host)
            .and_then(|seen| (seen.version == version).then_some(seen.since_ms))
    }

    /// When this controller got rules `version`, if it is one of the last few.
    pub(super) fn rules_since(&self, version: u64) -> Option<u64> {
        self.versions
            .iter()
            .rev()
            .find(|&&(v, _)| v == version)
            .map(|&(_, at)| at)
    }

    /// When the core last computed an interval.
    pub(super) fn last_computed_ms(&self) -> Option<u64> {
        self.last_computed_ms
    }

    /// The zone's entry, made if there is room (a disconnected zone left longest ago gives its
    /// place); `None` when every place holds a connected zone.
    fn zone_entry(&mut self, zone: &str) -> Option<&mut ZoneHealth> {
        if !self.zones.contains_key(zone) && self.zones.len() >= MAX_ZONES {
            let oldest = self
                .zones
                .iter()
                .filter_map(|(name, z)| Some((z.left_ms?, name.clone())))
                .min()?;
            self.zones.remove(&oldest.1);
        }
        Some(self.zones.entry(zone.to_owned()).or_default())
    }

    fn stream_ended(&mut self, zone: &str, member: u64, now_ms: u64) {
        if let Some(z) = self.zones.get_mut(zone) {
            z.streams = z.streams.saturating_sub(1);
            z.parts.remove(&member);
            if z.streams == 0 {
                z.left_ms = Some(now_ms);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use spillway_loop::RulesSnapshot;

    use super::*;

    const RULES: &str = "version: 1\ncontrol:\n  report_interval: 1s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 100/s, mode: shadow }\n";

    fn core(now_ms: u64) -> RegionCore {
        let rules = RulesSnapshot::parse(3, RULES, "rules.yaml").unwrap();
        RegionCore::new("r1", Arc::new(rules), now_ms)
    }

    fn report(sequence: u64, offered: u64, allowed: u64, shadow: u64) -> v1::ZoneReport {
        v1::ZoneReport {
            surge: false,
            zone: "z1".into(),
            region: "r1".into(),
            sequence,
            interval_ms: 1000,
            buckets: vec![v1::BucketCounts {
                service: "api".into(),
                bucket: "all".into(),
                offered,
                allowed,
                shadow_dropped: shadow,
                offered_tail: None,
                offered_squares: None,
                hosts: Some(2),
                tier_offered: Vec::new(),
                id: 0,
            }],
            clients: 2,
            hosts: vec![
                v1::HostStatus {
                    host_id: "h1".into(),
                    rules_version: 3,
                },
                v1::HostStatus {
                    host_id: "h2".into(),
                    rules_version: 2,
                },
            ],
            gone: vec![],
            bucket_ids: false,
        }
    }

    /// Feeds `report` to both the record and the core, as the service does, and samples.
    fn feed(record: &mut Record, core: &mut RegionCore, report: v1::ZoneReport, now_ms: u64) {
        record.on_zone_report(1, &report, now_ms);
        let steps = core.on_zone_report(1, report, now_ms);
        let sequence = steps.iter().find_map(|s| match s {
            spillway_loop::RegionStep::Send { instructions, .. } => {
                instructions.instructions.as_ref().map(|i| i.sequence)
            }
            _ => None,
        });
        record.on_instructions(1, true, now_ms);
        record.after_steps(core, sequence, now_ms);
    }

    #[test]
    fn a_shadow_buckets_virtual_drops_are_sampled_with_its_interval_and_are_not_real_drops() {
        let start = 100_000;
        let mut core = core(start);
        let mut record = Record::new(3, start);
        core.join(1, "");
        // Interval 100 (100.0 s to 101.0 s): 150 offered, 100 allowed, 50 would have dropped.
        feed(&mut record, &mut core, report(100, 150, 100, 50), 101_010);
        let history = record.history(&BucketKey::new("api", "all")).unwrap();
        let latest = history.latest();
        assert_eq!(latest.offered_rps, 150.0);
        assert_eq!(latest.admitted_rps, 100.0);
        assert_eq!(latest.shadow_drop_rps, 50.0);
        assert_eq!(latest.real_drop_rps, 0.0);
        assert_eq!(latest.limit_rps, 100.0);
        let points: Vec<_> = history.points().collect();
        assert_eq!(points.len(), 1);
        assert_eq!(points[0].0, 101_000, "the interval's end");
    }

    #[test]
    fn a_zones_clients_are_those_of_all_its_aggregators() {
        let mut record = Record::new(3, 100_000);
        let mut core = core(100_000);
        core.join(1, "");
        core.join(2, "");
        let mut two = report(100, 10, 10, 0);
        two.hosts.clear();
        two.clients = 3;
        record.on_zone_report(1, &report(100, 10, 10, 0), 101_010);
        record.on_zone_report(2, &two, 101_012);
        assert_eq!(record.zones()["z1"].streams, 2);
        assert_eq!(
            record.zones()["z1"].clients(),
            5,
            "2 on one aggregator, 3 on the other"
        );
        // The next report of the first counts once, not added again.
        record.on_zone_report(1, &report(101, 10, 10, 0), 102_010);
        assert_eq!(record.zones()["z1"].clients(), 5);
        // One aggregator gone: its hosts are no longer the zone's until they report elsewhere.
        record.on_leave(2, 102_500);
        assert_eq!(record.zones()["z1"].clients(), 2);
    }

    #[test]
    fn a_zone_is_known_by_its_reports_instructions_and_streams() {
        let mut core = core(100_000);
        let mut record = Record::new(3, 100_000);
        core.join(1, "");
        feed(&mut record, &mut core, report(100, 10, 10, 0), 101_010);
        let zone = &record.zones()["z1"];
        assert_eq!(zone.streams, 1);
        assert_eq!(zone.last_report_ms, Some(101_010));
        assert_eq!(zone.last_sequence, 100);
        assert_eq!(zone.clients(), 2);
        assert_eq!(zone.last_instructions_ms, Some(101_010));
        assert_eq!(zone.left_ms, None);
        record.on_instructions(1, false, 101_500);
        assert_eq!(record.zones()["z1"].missed, 1);
        record.on_leave(1, 102_000);
        let zone = &record.zones()["z1"];
        assert_eq!((zone.streams, zone.left_ms), (0, Some(102_000)));
        assert_eq!(zone.clients(), 0, "no stream, no clients");
    }

    #[test]
    fn a_host_keeps_the_time_it_took_its_version_until_it_changes_or_its_stream_ends() {
        let mut core = core(100_000);
        let mut record = Record::new(3, 100_000);
        core.join(1, "");
        feed(&mut record, &mut core, report(100, 10, 10, 0), 101_010);
        assert_eq!(record.host_since("h1", 3), Some(101_010));
        assert_eq!(record.host_since("h2", 2), Some(101_010));
        assert_eq!(record.host_since("h2", 3), None);
        let mut next = report(101, 10, 10, 0);
        next.hosts.retain(|h| h.host_id == "h2");
        next.hosts[0].rules_version = 3;
        feed(&mut record, &mut core, next, 102_010);
        assert_eq!(record.host_since("h1", 3), Some(101_010), "unchanged");
        assert_eq!(record.host_since("h2", 3), Some(102_010));
        record.on_rules(4, 103_000);
        assert_eq!(record.rules_since(3), Some(100_000));
        assert_eq!(record.rules_since(4), Some(103_000));
        // The aggregator's stream is replaced: h1 comes again on the new one, h2 does not.
        let mut again = report(102, 10, 10, 0);
        again.hosts.retain(|h| h.host_id == "h1");
        record.on_zone_report(2, &again, 103_500);
        record.on_leave(1, 103_600);
        assert_eq!(record.host_since("h1", 3), Some(101_010), "the same since");
        assert_eq!(record.host_since("h2", 3), None, "gone with its stream");
    }

    #[test]
    fn zones_are_bounded_and_a_full_record_forgets_the_zone_that_left_first() {
        let mut core = core(100_000);
        let mut record = Record::new(3, 100_000);
        for member in 0..MAX_ZONES as u64 {
            let mut r = report(100, 0, 0, 0);
            r.zone = format!("z{member}");
            record.on_zone_report(member, &r, 100_500);
        }
        record.on_leave(7, 100_600);
        record.on_leave(3, 100_700);
        let mut r = report(100, 0, 0, 0);
        r.zone = "new".into();
        record.on_zone_report(5000, &r, 100_800);
        assert_eq!(record.zones().len(), MAX_ZONES);
        assert!(record.zones().contains_key("new"));
        assert!(!record.zones().contains_key("z7"), "left first, forgotten");
        assert!(record.zones().contains_key("z3"));
        // Every place held by a connected zone: the newcomer is not recorded, nothing breaks.
        let _ = core.poll(100_900);
        let mut r = report(100, 0, 0, 0);
        r.zone = "another".into();
        record.on_zone_report(5001, &r, 100_900);
        record.on_zone_report(
            5002,
            &{
                let mut r = report(100, 0, 0, 0);
                r.zone = "yet-another".into();
                r
            },
            100_900,
        );
        assert!(record.zones().contains_key("another"), "took z3's place");
        assert!(!record.zones().contains_key("yet-another"));
    }
}
