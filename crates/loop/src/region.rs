//! The regional controller's state machine: sums its zones into region usage, exchanges the
//! sums of global buckets with the other regions' controllers, computes every bucket's drop ratio
//! (and adaptive token bucket shares) and hands them down to the zones once per interval, with the
//! rules when they changed.
//!
//! No controller leads: each sends its region's sums of global buckets to every peer each
//! interval, waits (at most half an interval past the end) for the sums of every live peer, and
//! computes from the same numbers with the same math as its peers, so all regions drop the same
//! share. A peer that sent neither an interval's sums nor the one's before is neither waited for
//! nor counted in it, until it sends again. Worked example: a global limit of 1,000/s, region A
//! offering 900/s and region B 600/s: both controllers see 1,500/s and send a drop ratio of 1/3,
//! so A admits 600/s and B 400/s.
//!
//! When this region's own zones show a global bucket's load rising clearly, the controller does
//! not wait for the peers: it instructs at once from an estimate of their sums (their last ones,
//! scaled by the rise its own zones saw), and again when their real sums are in
//! ([`RegionCore::provisional`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use spillway_core::algo::{Kind, Ratio};
use spillway_core::config::{Config, Scope};
use spillway_core::control::{Smoother, target_drop};
use spillway_core::criticality::shed_lowest_first;
use spillway_proto::v1;

use crate::interval::Interval;
use crate::rules::{RulesMessage, RulesSnapshot};
use crate::sums::{BucketKey, Counts, Intervals, Sums};

/// One bucket as the controller last computed it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketView {
    pub limit_rps: f64,
    /// Offered load over the bucket's scope as this controller sees it (for a zone-scoped
    /// bucket, the sum of the region's zones).
    pub observed_rps: f64,
    /// The ratio sent (for a zone-scoped bucket, the highest of its zones).
    pub drop_ratio: f64,
    /// What the hosts admitted over the same scope and interval, per second (after their ratios
    /// and surge guards).
    pub admitted_rps: f64,
}

/// A host as the controller knows it from its aggregators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    pub host_id: String,
    pub zone: String,
    pub rules_version: u64,
}

/// What the owner of a [`RegionCore`] sends.
#[derive(Debug, Clone, PartialEq)]
pub enum RegionStep {
    /// This region's sums of its global buckets, for every peer controller.
    Announce(v1::RegionSums),
    /// The instructions of one computed interval (and the rules, when the zone has not had
    /// them) for the zone on stream `member`.
    Send {
        member: u64,
        instructions: v1::ZoneInstructions,
    },
}

/// A peer region as this controller knows it.
#[derive(Debug, Clone)]
struct Peer {
    /// When its sums last arrived, in the owner's milliseconds.
    last_heard_ms: u64,
    sums: BTreeMap<u64, Sums>,
}

/// An aggregator with an open stream.
#[derive(Debug, Clone, Default)]
struct Zone {
    /// Its zone's name, once it reported (or as the owner knew it when it joined).
    name: String,
    /// Its hosts and the rules version each runs.
    hosts: HashMap<String, u64>,
    /// The rules version last sent to it.
    sent_rules: u64,
    /// Its sums of the last interval it reported, and that interval: they stand in for the
    /// next one should it be missing when the interval closes.
    last: Option<(u64, Sums)>,
    /// Its estimate of the open interval from its hosts' surge reports (`ZoneReport.surge`),
    /// and that interval.
    surge: Option<(u64, Sums)>,
}

/// The regional controller as a sans-IO state machine: zone reports and peer sums go in with the
/// time, [`RegionStep`]s come out. The gRPC server drives it with Unix milliseconds, the
/// simulator with simulated ones, so both run the same closing rules and the same drop-ratio math.
///
/// An interval closes when every zone reported it or two graces after its end (aggregators wait
/// up to one grace for their clients); its global sums are then announced to the peers, and it
/// is computed when every live peer's sums for it are in, or three graces after its end. With 1 s
/// intervals: interval 7 is computed at 8.750 s at the latest.
#[derive(Debug, Clone)]
pub struct RegionCore {
    region: String,
    rules: Arc<RulesSnapshot>,
    /// The aggregators by stream, in the order they joined.
    zones: BTreeMap<u64, Zone>,
    window: Intervals<u64, HashMap<String, Sums>>,
    /// Closed intervals waiting for the peers' sums, with their deadline (ms).
    awaiting: BTreeMap<u64, (HashMap<String, Sums>, u64)>,
    peers: HashMap<String, Peer>,
    smoothers: HashMap<(BucketKey, Option<String>), Smoother>,
    view: HashMap<BucketKey, BucketView>,
    computed: u64,
    provisional: u64,
    /// When the first zone estimate not yet answered came ([`RegionCore::answer_surges`]).
    surge_at: Option<u64>,
}

impl RegionCore {
    /// The controller of `region` running `rules`, started at `now_ms`.
    pub fn new(region: impl Into<String>, rules: Arc<RulesSnapshot>, now_ms: u64) -> Self {
        let interval = Interval::new(rules.config.control.report_interval);
        Self {
            region: region.into(),
            rules,
            zones: BTreeMap::new(),
            window: Intervals::new(interval.sequence_at(now_ms).saturating_sub(1)),
            awaiting: BTreeMap::new(),
            peers: HashMap::new(),
            smoothers: HashMap::new(),
            view: HashMap::new(),
            computed: 0,
            provisional: 0,
            surge_at: None,
        }
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// The rules in force.
    pub fn rules(&self) -> &Arc<RulesSnapshot> {
        &self.rules
    }

    /// The interval of the rules in force.
    pub fn interval(&self) -> Interval {
        Interval::new(self.rules.config.control.report_interval)
    }

    /// Every control-plane bucket as last computed.
    pub fn view(&self) -> &HashMap<BucketKey, BucketView> {
        &self.view
    }

    /// Aggregators with an open stream.
    pub fn zones(&self) -> usize {
        self.zones.len()
    }

    /// Intervals computed so far.
    pub fn computed(&self) -> u64 {
        self.computed
    }

    /// The hosts of this region with the rules version each runs, by host name.
    pub fn hosts(&self) -> Vec<HostView> {
        let mut hosts: Vec<HostView> = self
            .zones
            .values()
            .flat_map(|z| {
                z.hosts.iter().map(|(host, version)| HostView {
                    host_id: host.clone(),
                    zone: z.name.clone(),
                    rules_version: *version,
                })
            })
            .collect();
        hosts.sort_by(|a, b| a.host_id.cmp(&b.host_id));
        hosts
    }

    /// Peer regions heard from within the instruction TTL of `now_ms`, sorted.
    pub fn live_peers(&self, now_ms: u64) -> Vec<String> {
        let ttl = self.rules.config.control.instruction_ttl;
        let mut live: Vec<String> = self
            .peers
            .iter()
            .filter(|(_, p)| is_live(p, now_ms, ttl))
            .map(|(r, _)| r.clone())
            .collect();
        live.sort();
        live
    }

    /// New rules at `now_ms`: sent down with the next instructions. A new interval length
    /// forgets every open interval, whose sequence numbers meant something else.
    pub fn set_rules(&mut self, rules: Arc<RulesSnapshot>, now_ms: u64) {
        let old = self.interval();
        self.rules = rules;
        let new = self.interval();
        if old != new {
            self.window.reset(new.sequence_at(now_ms).saturating_sub(1));
            self.awaiting.clear();
        }
    }

    /// An aggregator opened stream `member`; `zone` is its zone's name when the owner knows it
    /// (a server learns it from the first report).
    pub fn join(&mut self, member: u64, zone: &str) {
        self.zones.entry(member).or_default().name = zone.to_owned();
    }

    /// Stream `member` ended at `now_ms`: the region no longer waits for it.
    pub fn leave(&mut self, member: u64, now_ms: u64) -> Vec<RegionStep> {
        self.zones.remove(&member);
        self.poll(now_ms)
    }

    /// A [`RegionStep::Send`] carrying rules could not be sent: send them again next time.
    pub fn send_failed(&mut self, member: u64) {
        if let Some(zone) = self.zones.get_mut(&member) {
            zone.sent_rules = 0;
        }
    }

    /// A zone's report on stream `member` at `now_ms`: its hosts, and its sums of one interval
    /// (ignored when that interval is already closed or of another length); then moves
    /// intervals along.
    pub fn on_zone_report(
        &mut self,
        member: u64,
        report: v1::ZoneReport,
        now_ms: u64,
    ) -> Vec<RegionStep> {
        if report.surge {
            let open = report.interval_ms == self.interval().ms()
                && report.sequence > self.window.closed_through();
            if let Some(zone) = self.zones.get_mut(&member)
                && open
            {
                zone.surge = Some((report.sequence, Sums::from_wire(&report.buckets)));
                self.surge_at.get_or_insert(now_ms);
            }
            return self.poll(now_ms);
        }
        let zone = self.zones.entry(member).or_default();
        zone.name.clone_from(&report.zone);
        for h in &report.hosts {
            zone.hosts.insert(h.host_id.clone(), h.rules_version);
        }
        for h in &report.gone {
            zone.hosts.remove(h);
        }
        if report.interval_ms == self.interval().ms()
            && let Some(zones) = self.window.accept(report.sequence, member)
        {
            zones
                .entry(report.zone)
                .or_default()
                .add_wire(&report.buckets);
        }
        self.poll(now_ms)
    }

    /// A peer's sums, at `now_ms`. Keeps enough intervals per peer to cover the TTL.
    pub fn on_peer_sums(&mut self, sums: v1::RegionSums, now_ms: u64) -> Vec<RegionStep> {
        if sums.region == self.region || sums.region.is_empty() {
            return Vec::new();
        }
        let interval = self.interval();
        let ttl = self.rules.config.control.instruction_ttl;
        let keep = (ttl.as_millis() as u64 / interval.ms()).max(1) + 2;
        let peer = self.peers.entry(sums.region).or_insert_with(|| Peer {
            last_heard_ms: now_ms,
            sums: BTreeMap::new(),
        });
        peer.last_heard_ms = now_ms;
        // Sums of intervals the clock has not reached are bogus; kept, they would push the
        // peer's real ones out of its window.
        let current = interval.sequence_at(now_ms);
        if sums.interval_ms == interval.ms() && sums.sequence <= current.saturating_add(1) {
            peer.sums
                .insert(sums.sequence, Sums::from_wire(&sums.buckets));
            while peer.sums.len() as u64 > keep {
                peer.sums.pop_first();
            }
        }
        self.poll(now_ms)
    }

    /// Moves intervals along at `now_ms`: closes the region's intervals that every zone reported
    /// or that are overdue (announcing their global sums), then computes those whose live peers'
    /// sums are all in or whose deadline passed, and instructs every zone, even one that
    /// reported nothing.
    pub fn poll(&mut self, now_ms: u64) -> Vec<RegionStep> {
        let rules = self.rules.clone();
        let config = &rules.config;
        let interval = self.interval();
        let grace = interval.grace_ms();
        let mut steps = Vec::new();
        let ttl = config.control.instruction_ttl;
        for (sequence, mut zone_sums, _) in
            self.window
                .close_ready(now_ms, interval, 2 * grace, self.zones.keys())
        {
            for zone in self.zones.values_mut() {
                if zone.surge.as_ref().is_some_and(|(s, _)| *s <= sequence) {
                    zone.surge = None;
                }
            }
            let before = self.zones_before(sequence);
            self.estimate_missing(sequence, &mut zone_sums);
            steps.push(RegionStep::Announce(v1::RegionSums {
                region: self.region.clone(),
                sequence,
                interval_ms: interval.ms(),
                buckets: global_sums(config, &zone_sums).to_wire(),
            }));
            let waits = self
                .peers
                .values()
                .any(|p| is_awaited(p, sequence, now_ms, ttl) && !p.sums.contains_key(&sequence));
            if waits
                && let Some(per_zone) =
                    self.provisional(config, sequence, &zone_sums, &before, now_ms, interval)
            {
                self.provisional += 1;
                self.instruct(&mut steps, sequence, per_zone, now_ms, Sent::Provisional);
            }
            self.awaiting.insert(
                sequence,
                (
                    zone_sums,
                    interval.end_of(sequence).saturating_add(3 * grace),
                ),
            );
        }
        while let Some((&sequence, &(_, deadline))) = self.awaiting.first_key_value() {
            let all_in = self
                .peers
                .values()
                .filter(|p| is_awaited(p, sequence, now_ms, ttl))
                .all(|p| p.sums.contains_key(&sequence));
            if !(all_in || now_ms >= deadline) {
                break;
            }
            let Some((sequence, (mut zone_sums, _))) = self.awaiting.pop_first() else {
                break;
            };
            for zone in self.zones.values().filter(|z| !z.name.is_empty()) {
                zone_sums.entry(zone.name.clone()).or_default();
            }
            let peers = self.peer_sums(sequence, now_ms, ttl, &HashMap::new());
            let per_zone = self.compute(config, &zone_sums, &peers, interval);
            self.instruct(&mut steps, sequence, per_zone, now_ms, Sent::Computed);
        }
        self.answer_surges(config, &mut steps, now_ms, interval);
        steps
    }

    /// Instructions from the zones' estimates of the open interval (their hosts' surge reports,
    /// `ZoneReport.surge`), [`SURGE_WAIT`] of an interval after the first came so the zones of
    /// a fleet-wide surge are in together: each zone's estimate, or its last interval where it
    /// sent none; each live peer's last sums, scaled by the median zone's rise as for
    /// [`RegionCore::provisional`]. They carry the hosts' rates now (`from_rates_now`), so a
    /// host whose guard holds it to its part of the limit gets a part that counts its burst:
    /// one host's burst that fits the scope's headroom is let go a few milliseconds after its
    /// guard engaged, where it was held until the interval's report had counted the burst.
    fn answer_surges(
        &mut self,
        config: &Config,
        steps: &mut Vec<RegionStep>,
        now_ms: u64,
        interval: Interval,
    ) {
        let wait = (interval.ms() / SURGE_WAIT).max(1);
        if self.surge_at.is_none_or(|at| now_ms < at + wait) {
            return;
        }
        self.surge_at = None;
        let sequence = self.window.closed_through();
        let mut zone_sums = HashMap::new();
        let mut before = HashMap::new();
        for zone in self.zones.values().filter(|z| !z.name.is_empty()) {
            let last = zone.last.as_ref().filter(|(s, _)| *s == sequence);
            if let Some((_, sums)) = last {
                before.insert(zone.name.clone(), sums.clone());
            }
            match (&zone.surge, last) {
                (Some((_, sums)), _) | (None, Some((_, sums))) => {
                    zone_sums.insert(zone.name.clone(), sums.clone());
                }
                (None, None) => {}
            }
        }
        if zone_sums.is_empty() {
            return;
        }
        // The open interval's estimate: the peers' sums of the intervals before it, scaled.
        let rises = rising(config, &zone_sums, &before, None);
        let ttl = config.control.instruction_ttl;
        let peers = self.peer_sums(sequence + 1, now_ms, ttl, &rises);
        let (per_zone, _) = self.compute_aside(config, &zone_sums, &peers, interval);
        self.provisional += 1;
        self.instruct(steps, sequence, per_zone, now_ms, Sent::FromRatesNow);
    }

    /// Puts in `zone_sums` (the zones' sums of interval `sequence`) the sums of every zone
    /// that did not report it but did report the interval before, as that zone's estimate, and
    /// keeps what the others reported for the next interval. A zone report lost or late would
    /// otherwise count the zone's whole load as gone for an interval: at 1.5x the limit over 9
    /// zones the ratio fell from 1/3 to 0.24 and the fleet admitted 14% over its limit until the
    /// next interval. A zone silent for two intervals is left out.
    fn estimate_missing(&mut self, sequence: u64, zone_sums: &mut HashMap<String, Sums>) {
        for zone in self.zones.values_mut().filter(|z| !z.name.is_empty()) {
            match zone_sums.get(&zone.name) {
                Some(sums) => zone.last = Some((sequence, sums.clone())),
                None => {
                    if let Some((last, sums)) = &zone.last
                        && last + 1 == sequence
                    {
                        zone_sums.insert(zone.name.clone(), sums.clone());
                    }
                }
            }
        }
    }

    /// The zones' sums of the interval before `sequence`, by zone, as they reported them.
    fn zones_before(&self, sequence: u64) -> HashMap<String, Sums> {
        self.zones
            .values()
            .filter_map(|z| match &z.last {
                Some((last, sums)) if last + 1 == sequence && !z.name.is_empty() => {
                    Some((z.name.clone(), sums.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// Instructions for interval `sequence` before the peers' sums are in, when this region's
    /// own zones show a global bucket's load rising clearly ([`PROVISIONAL_RISE`]): each live
    /// peer's sums of the interval before stand in for its missing ones, scaled by the rise
    /// this region's zones saw (the median zone's, so one zone's burst is not taken for the
    /// fleet's). They go out only when they raise some global bucket's ratio by more than
    /// [`PROVISIONAL_STEP`] over the one in force; the smoothing state and the view are left as
    /// they were, for the instructions computed from the peers' real sums.
    ///
    /// The peers' sums cross regions (30 ms and more each way) and the last region to close
    /// an interval holds every controller up: a 3x step over 2,000 small callers was enforced
    /// 50-60 ms after the interval's end, about 12% over the limit in the second after the
    /// first; this region's own zones are in a millisecond or two after they close.
    fn provisional(
        &mut self,
        config: &Config,
        sequence: u64,
        zone_sums: &HashMap<String, Sums>,
        before: &HashMap<String, Sums>,
        now_ms: u64,
        interval: Interval,
    ) -> Option<HashMap<String, Vec<v1::BucketInstruction>>> {
        let rises = rising(config, zone_sums, before, Some(Kind::DropRatio));
        if rises.is_empty() {
            return None;
        }
        let ttl = config.control.instruction_ttl;
        let peers = self.peer_sums(sequence, now_ms, ttl, &rises);
        let (per_zone, computed) = self.compute_aside(config, zone_sums, &peers, interval);
        let raised = rises.keys().any(|k| {
            let old = self.view.get(k).map_or(0.0, |v| v.drop_ratio);
            computed
                .get(k)
                .is_some_and(|v| v.drop_ratio > old + PROVISIONAL_STEP)
        });
        raised.then_some(per_zone)
    }

    /// The live peers' sums for interval `target`: each peer's sums of it, or else the latest
    /// of its two before (the peer was late, or one of its messages was lost), scaled by
    /// `rises` per bucket (a rise this region's own zones saw since). A peer silent for longer,
    /// whose region was lost and whose load has failed over to the others, counts for nothing.
    fn peer_sums(
        &self,
        target: u64,
        now_ms: u64,
        ttl: Duration,
        rises: &HashMap<BucketKey, f64>,
    ) -> Sums {
        let mut peers = Sums::default();
        for peer in self.peers.values().filter(|p| is_live(p, now_ms, ttl)) {
            if let Some(sums) = peer.sums.get(&target) {
                peers.add(sums);
            } else if let Some((_, sums)) = peer
                .sums
                .range(target.saturating_sub(2)..target)
                .next_back()
            {
                let mut scaled = sums.clone();
                for (key, counts) in &mut scaled.0 {
                    if let Some(&rise) = rises.get(key) {
                        *counts = counts.scaled(rise);
                    }
                }
                peers.add(&scaled);
            }
        }
        peers
    }

    /// [`RegionCore::compute`] on the side, for instructions that estimate (provisional ones,
    /// answers to surges): the instructions and the view they give, with the smoothing state
    /// and the view left as they were for the instructions computed from the real sums.
    fn compute_aside(
        &mut self,
        config: &Config,
        zone_sums: &HashMap<String, Sums>,
        peers: &Sums,
        interval: Interval,
    ) -> (
        HashMap<String, Vec<v1::BucketInstruction>>,
        HashMap<BucketKey, BucketView>,
    ) {
        let (smoothers, view) = (self.smoothers.clone(), self.view.clone());
        let per_zone = self.compute(config, zone_sums, peers, interval);
        self.smoothers = smoothers;
        let computed = std::mem::replace(&mut self.view, view);
        (per_zone, computed)
    }

    /// Provisional instructions sent so far ([`RegionCore::provisional`]).
    pub fn provisionals(&self) -> u64 {
        self.provisional
    }

    /// One [`RegionStep::Send`] per zone with its part of `per_zone`, the rules to zones that
    /// have not had them.
    fn instruct(
        &mut self,
        steps: &mut Vec<RegionStep>,
        sequence: u64,
        per_zone: HashMap<String, Vec<v1::BucketInstruction>>,
        now_ms: u64,
        sent: Sent,
    ) {
        let rules = &self.rules;
        let ttl_ms =
            u64::try_from(rules.config.control.instruction_ttl.as_millis()).unwrap_or(u64::MAX);
        let interval_ms = Interval::new(rules.config.control.report_interval).ms();
        for (&member, zone) in &mut self.zones {
            let send_rules = zone.sent_rules != rules.version;
            if send_rules {
                zone.sent_rules = rules.version;
            }
            let buckets = per_zone.get(&zone.name).cloned().unwrap_or_default();
            steps.push(RegionStep::Send {
                member,
                instructions: v1::ZoneInstructions {
                    instructions: Some(v1::Instructions {
                        issued_at_ms: now_ms,
                        ttl_ms,
                        interval_ms,
                        sequence,
                        buckets,
                        rules_version: rules.version,
                        // The rules as data, never the source's text.
                        rules: send_rules.then(|| rules.message()),
                        provisional: sent != Sent::Computed,
                        from_rates_now: sent == Sent::FromRatesNow,
                    }),
                },
            });
        }
        self.computed += u64::from(sent == Sent::Computed);
    }

    /// One interval's instructions per zone from the zones' sums and the live peers' sums: a
    /// smoothed drop ratio per bucket and scope, and each zone's share of the scope's load
    /// for adaptive token buckets.
    ///
    /// The ratio's target comes from the scope's offered load, or from its tail when that shows
    /// a surge that started within the interval ([`crate::sums::Counts::offered_for_rise`]): the first
    /// instruction after the surge already carries its whole ratio, one interval earlier than
    /// the offered count alone would give it. Shares and the offered load sent down stay the
    /// interval's own.
    fn compute(
        &mut self,
        config: &Config,
        zone_sums: &HashMap<String, Sums>,
        peers: &Sums,
        interval: Interval,
    ) -> HashMap<String, Vec<v1::BucketInstruction>> {
        let secs = interval.secs();
        let mut region = Sums::default();
        for sums in zone_sums.values() {
            region.add(sums);
        }
        let mut per_zone: HashMap<String, Vec<v1::BucketInstruction>> = HashMap::new();
        let mut view = HashMap::new();
        let mut live_keys = HashSet::new();
        for (service, bucket) in config.buckets() {
            if !matches!(
                bucket.algorithm,
                Kind::DropRatio | Kind::AdaptiveTokenBucket
            ) {
                continue;
            }
            let key = BucketKey::new(&service.name, &bucket.name);
            // A region-scoped bucket may have a limit of this region's own.
            let limit = bucket.limit_in(&self.region).per_second();
            let adaptive = bucket.algorithm == Kind::AdaptiveTokenBucket;
            // `tiers`: the scope's load per criticality tier, which the ratio is split by so the
            // lowest tiers absorb it first.
            let mut instruction =
                |zone: &str, ratio: f64, share: f64, scope: &Counts, scope_offered: f64| {
                    per_zone
                        .entry(zone.to_owned())
                        .or_default()
                        .push(v1::BucketInstruction {
                            service: key.service.clone(),
                            bucket: key.bucket.clone(),
                            drop_ratio: if adaptive {
                                0
                            } else {
                                Ratio::from_f64(ratio).raw()
                            },
                            share: adaptive.then(|| Ratio::from_f64(share).raw()),
                            scope_offered_rps: scope_offered,
                            scope_hosts: scope.hosts,
                            tier_drop_ratio: if adaptive {
                                Vec::new()
                            } else {
                                tier_drop_ratios(ratio, scope)
                            },
                        });
                };
            // `count`: the requests the target was computed from, so a clear fall is taken at
            // once (`Smoother::update_counted`).
            let mut smoother = |zone: Option<&str>, target: f64, count: u64| {
                live_keys.insert((key.clone(), zone.map(str::to_owned)));
                self.smoothers
                    .entry((key.clone(), zone.map(str::to_owned)))
                    .or_default()
                    .update_counted(target, count as f64)
            };
            let zones_count = zone_sums.len().max(1) as f64;
            match bucket.scope {
                Scope::Zone => {
                    let mut observed = 0.0;
                    let mut admitted = 0.0;
                    let mut highest: f64 = 0.0;
                    for (zone, sums) in zone_sums {
                        let counts = sums.counts(&key);
                        let offered = counts.offered as f64 / secs;
                        admitted += counts.allowed as f64 / secs;
                        let rise = counts.offered_for_rise() as f64 / secs;
                        let ratio = smoother(Some(zone), target_drop(limit, rise), counts.offered);
                        instruction(zone, ratio, 1.0, &counts, offered);
                        observed += offered;
                        highest = highest.max(ratio);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: observed,
                            drop_ratio: highest,
                            admitted_rps: admitted,
                        },
                    );
                }
                Scope::Region | Scope::Global => {
                    let mut counts = region.counts(&key);
                    if bucket.scope == Scope::Global {
                        counts += peers.counts(&key);
                    }
                    let scope = counts.offered as f64 / secs;
                    let rise = counts.offered_for_rise() as f64 / secs;
                    let ratio = smoother(None, target_drop(limit, rise), counts.offered);
                    for (zone, sums) in zone_sums {
                        let share = if scope > 0.0 {
                            sums.offered(&key) as f64 / secs / scope
                        } else {
                            1.0 / zones_count
                        };
                        instruction(zone, ratio, share, &counts, scope);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: scope,
                            drop_ratio: ratio,
                            admitted_rps: counts.allowed as f64 / secs,
                        },
                    );
                }
            }
        }
        // Buckets that left the rules take their smoothing state with them.
        self.smoothers.retain(|k, _| live_keys.contains(k));
        self.view = view;
        per_zone
    }
}

/// `ratio` split per criticality tier by the tiers of `counts`, for the wire: none when every
/// tier drops `ratio` ([`shed_lowest_first`]).
pub fn tier_drop_ratios(ratio: f64, counts: &Counts) -> Vec<u64> {
    shed_lowest_first(ratio, &counts.tier_offered())
        .map(|tiers| tiers.iter().map(|&r| Ratio::from_f64(r).raw()).collect())
        .unwrap_or_default()
}

/// What an instruction set is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// A closed interval and the peers' sums of it.
    Computed,
    /// A closed interval and an estimate of the peers' sums ([`RegionCore::provisional`]).
    Provisional,
    /// The zones' estimates of the open interval ([`RegionCore::answer_surges`]).
    FromRatesNow,
}

/// How long after the first zone estimate of a surge the controller answers, in fractions of
/// the interval: a hundredth (10 ms at 1 s), so the zones of a fleet-wide surge, whose guards
/// engage at the same tick, are in together.
pub const SURGE_WAIT: u64 = 100;

/// How much this region's load of a global bucket must have risen, in its median zone, before
/// the controller instructs from an estimate of the peers' sums ([`RegionCore::provisional`]):
/// 1.25 times, as for an interval's tail ([`crate::sums::TAIL_RISE`]).
pub const PROVISIONAL_RISE: f64 = 1.25;

/// And by how much the estimate must raise the bucket's ratio: 0.02.
pub const PROVISIONAL_STEP: f64 = 0.02;

/// Zones whose previous interval offered fewer requests of a bucket than this say nothing
/// about its rise.
const RISE_MIN_REQUESTS: u64 = 10;

/// Per global bucket of `config` (of algorithm `kind` only, when given), the median zone's rise
/// from `before` to `now` ([`median_rise`]), when it is at least [`PROVISIONAL_RISE`].
fn rising(
    config: &Config,
    now: &HashMap<String, Sums>,
    before: &HashMap<String, Sums>,
    kind: Option<Kind>,
) -> HashMap<BucketKey, f64> {
    config
        .buckets()
        .filter(|(_, b)| b.scope == Scope::Global && kind.is_none_or(|k| b.algorithm == k))
        .filter_map(|(service, bucket)| {
            let key = BucketKey::new(&service.name, &bucket.name);
            let rise = median_rise(&key, now, before)?;
            (rise >= PROVISIONAL_RISE).then_some((key, rise))
        })
        .collect()
}

/// The median over the zones of `now` that also reported `before` of how much one bucket's load
/// rose (`offered_for_rise` now over `offered` before); `None` when no zone had enough load
/// before to tell ([`RISE_MIN_REQUESTS`]).
fn median_rise(
    key: &BucketKey,
    now: &HashMap<String, Sums>,
    before: &HashMap<String, Sums>,
) -> Option<f64> {
    let mut rises: Vec<f64> = now
        .iter()
        .filter_map(|(zone, sums)| {
            let was = before.get(zone)?.offered(key);
            (was >= RISE_MIN_REQUESTS)
                .then(|| sums.counts(key).offered_for_rise() as f64 / was as f64)
        })
        .collect();
    if rises.is_empty() {
        return None;
    }
    rises.sort_by(f64::total_cmp);
    let mid = rises.len() / 2;
    Some(if rises.len() % 2 == 1 {
        rises[mid]
    } else {
        (rises[mid - 1] + rises[mid]) / 2.0
    })
}

fn is_live(peer: &Peer, now_ms: u64, ttl: Duration) -> bool {
    (now_ms.saturating_sub(peer.last_heard_ms) as u128) < ttl.as_millis()
}

/// Whether interval `sequence` waits for `peer`'s sums: a live peer that sent the interval's
/// sums or the one's before. A peer whose region was lost is not waited for once an interval's
/// sums of it are missing, and not counted once two are (see [`RegionCore::poll`]), so its load,
/// now failed over to the other regions, counts twice for one interval, not until the TTL
/// (region-loss admitted 6,300-8,000/s of 10,000 for 3 s that way, and every interval waited
/// three graces for the lost peer).
fn is_awaited(peer: &Peer, sequence: u64, now_ms: u64, ttl: Duration) -> bool {
    is_live(peer, now_ms, ttl)
        && peer
            .sums
            .range(sequence.saturating_sub(1)..)
            .next()
            .is_some()
}

/// The region's sums of its global buckets only: what peers need, and all they get.
pub fn global_sums(config: &Config, zones: &HashMap<String, Sums>) -> Sums {
    let mut region = Sums::default();
    for sums in zones.values() {
        region.add(sums);
    }
    let global: HashSet<BucketKey> = config
        .buckets()
        .filter(|(_, b)| b.scope == Scope::Global)
        .map(|(s, b)| BucketKey::new(&s.name, &b.name))
        .collect();
    region.0.retain(|k, _| global.contains(k));
    region
}
