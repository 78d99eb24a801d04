//! The regional controller's state machine: sums its zones into region usage, exchanges the
//! sums of global buckets with the other regions' controllers, computes every bucket's drop ratio
//! (and adaptive token bucket shares) and hands them down to the zones once per interval, with the
//! rules when they changed.
//!
//! No controller leads: each sends its region's sums of global buckets to every peer each
//! interval, waits (at most half an interval past the end) for the sums of every live peer, and
//! computes from the same numbers with the same math as its peers, so all regions drop the same
//! share. A peer that sent neither an interval's sums nor the one's before is not waited for,
//! and once it missed three its last sums are held against the load this controller still sees
//! (a partition leaves each side at its part of the limit, a lost region's load failed over is
//! not counted twice: [`RegionCore::held`]) for at most [`PARTITION_HOLD`] intervals, until it
//! sends again. Worked example: a global limit of 1,000/s, region A
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

use crate::bucket_ids::{Named, Told};
use crate::interval::Interval;
use crate::rules::{RulesMessage, RulesSnapshot};
use crate::sums::{BucketKey, Counts, Intervals, Sums};

mod compute;
mod ids;
mod indexed;
mod partition;
mod provisional;
mod shared;
mod table;
#[cfg(test)]
mod tests;
use self::compute::{PerZone, Sent};
pub use self::compute::{global_sums, tier_drop_ratios};
use self::ids::Dictionary;
use self::indexed::IndexedSums;
pub use self::partition::{HOLD_NOISE, PARTITION_HOLD};
use self::provisional::Scale;
pub use self::provisional::{LATE_ZONE_WAIT, PROVISIONAL_RISE, PROVISIONAL_STEP, SURGE_WAIT};
pub use self::shared::SharedInstructions;
use self::table::{Index, Table};

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
    /// The same as [`RegionStep::Send`], its buckets shared with the other zones' of the
    /// interval, when the owner asked for them so ([`RegionCore::share_instructions`]).
    SendShared {
        member: u64,
        instructions: SharedInstructions,
    },
}

/// A peer region as this controller knows it.
#[derive(Debug, Clone)]
struct Peer {
    /// When its sums last arrived, in the owner's milliseconds.
    last_heard_ms: u64,
    sums: BTreeMap<u64, IndexedSums>,
    /// Where its sums have each bucket.
    names: Dictionary,
}

/// An aggregator with an open stream. A zone may have several (its hosts split between them,
/// or moving from one to another): each is a part of its zone's sums, and the zone's sums of an
/// interval are its parts' sum.
#[derive(Debug, Clone, Default)]
struct Zone {
    /// Its zone's name, once it reported (or as the owner knew it when it joined).
    name: String,
    /// Its hosts and the rules version each runs.
    hosts: HashMap<String, u64>,
    /// The rules version last sent to it.
    sent_rules: u64,
    /// Its own part of the last interval it reported, and that interval: it stands in for the
    /// next one should it be missing when the interval closes, unless a host of it has since
    /// moved to another aggregator (whose part counts that host now).
    last: Option<(u64, Arc<IndexedSums>)>,
    /// Its estimate of the open interval from its hosts' surge reports (`ZoneReport.surge`),
    /// and that interval.
    surge: Option<(u64, Arc<IndexedSums>)>,
    /// What its reports' bucket numbers stand for, and where its reports have each bucket.
    names: Dictionary,
    /// Which of the buckets' numbers its instructions named to it.
    told: Told,
}

impl Zone {
    /// Instructions to it were lost: the rules (when they carried them) and the names of
    /// `buckets` go again.
    fn forget<'a>(
        &mut self,
        rules: bool,
        buckets: impl IntoIterator<Item = &'a v1::BucketInstruction>,
    ) {
        if rules {
            self.sent_rules = 0;
        }
        for b in buckets {
            if b.id != 0 && !b.bucket.is_empty() {
                self.told.forget(b.id);
            }
        }
    }
}

/// The regional controller as a sans-IO state machine: zone reports and peer sums go in with the
/// time, [`RegionStep`]s come out. The gRPC server drives it with Unix milliseconds, the
/// simulator with simulated ones, so both run the same closing rules and the same drop-ratio math.
///
/// Each aggregator's sums are a part of its zone's, kept apart per stream ([`Parts`]) and summed
/// per zone when an interval closes, so two aggregators of one zone add up, and a host
/// reports each interval to one aggregator only (`spillway_loop::HostCore`), so a host that
/// moved between them counts once.
///
/// An interval closes when every zone reported it or two graces after its end (aggregators wait
/// up to one grace for their clients); its global sums are then announced to the peers, and it
/// is computed when every live peer's sums for it are in, or three graces after its end. With 1 s
/// intervals: interval 7 is computed at 8.750 s at the latest.
///
/// Inside, a bucket is a number ([`table`]): the sums it keeps are arrays by that number,
/// shared between the intervals that hold them rather than copied, and a zone's report is
/// added without a key built, hashed or freed per entry.
#[derive(Debug, Clone)]
pub struct RegionCore {
    region: String,
    rules: Arc<RulesSnapshot>,
    /// The rules' buckets by index.
    table: Table,
    /// The aggregators by stream, in the order they joined.
    zones: BTreeMap<u64, Zone>,
    window: Intervals<u64, Parts>,
    /// Closed intervals waiting for the peers' sums, with their deadline (ms).
    awaiting: BTreeMap<u64, (Parts, u64)>,
    peers: HashMap<String, Peer>,
    /// The global sums each computed interval counted (this region's and its peers'), kept from
    /// the last interval every peer heard within [`PARTITION_HOLD`] sent: what a partition
    /// holds the silent peers' load against ([`RegionCore::held`]).
    totals: BTreeMap<u64, IndexedSums>,
    /// The smoothing of each region-scoped and global bucket's ratio, by index.
    smoothers: Vec<Smoother>,
    /// The smoothing of each zone-scoped bucket's ratio, by zone, then index.
    zone_smoothers: HashMap<String, HashMap<Index, Smoother, Fast>>,
    /// [`RegionCore::view`], and the same by index.
    view: HashMap<BucketKey, BucketView>,
    views: Vec<Option<BucketView>>,
    computed: u64,
    provisional: u64,
    /// When the first zone estimate not yet answered came ([`RegionCore::answer_surges`]).
    surge_at: Option<u64>,
    /// Per closed interval, the global buckets whose load this region's median zone saw rise
    /// clearly into it ([`provisional::rising`]), while the region has peers: what scales a
    /// late peer's older sums ([`RegionCore::peer_sums`]).
    rose: BTreeMap<u64, Vec<(Index, f64)>>,
    /// The last open interval instructed before a late zone's report of it
    /// ([`RegionCore::instruct_without_late_zones`]).
    early: Option<u64>,
    /// The controller lease's epoch its instructions carry (0: no lease).
    epoch: u64,
    /// Hosts that one aggregator reported and another had reported before.
    moved: u64,
    /// Zone report entries whose bucket number their stream never named (skipped).
    unbound_ids: u64,
    /// Whether instructions go out as [`RegionStep::SendShared`].
    shares_instructions: bool,
}

type Fast = foldhash::fast::RandomState;

/// Each aggregator's part of one interval, by stream: its zone and its sums.
pub(crate) type Parts = BTreeMap<u64, (String, Arc<IndexedSums>)>;

/// Each zone's sums of one interval, by zone.
pub(crate) type ZoneSums = BTreeMap<String, Arc<IndexedSums>>;

/// The zones' sums of `parts`: each zone's parts added up (a zone of one aggregator shares its
/// part's sums).
pub(crate) fn by_zone(parts: &Parts) -> ZoneSums {
    let mut zones = ZoneSums::new();
    for (zone, sums) in parts.values() {
        match zones.get_mut(zone) {
            Some(sum) => Arc::make_mut(sum).add(sums),
            None => {
                zones.insert(zone.clone(), sums.clone());
            }
        }
    }
    zones
}

impl RegionCore {
    /// The controller of `region` running `rules`, started at `now_ms`.
    pub fn new(region: impl Into<String>, rules: Arc<RulesSnapshot>, now_ms: u64) -> Self {
        let interval = Interval::new(rules.config.control.report_interval);
        let region = region.into();
        let table = Table::new(&rules.config, &region);
        Self {
            smoothers: vec![Smoother::default(); table.len()],
            views: vec![None; table.len()],
            table,
            region,
            rules,
            zones: BTreeMap::new(),
            window: Intervals::new(interval.sequence_at(now_ms).saturating_sub(1)),
            awaiting: BTreeMap::new(),
            peers: HashMap::new(),
            totals: BTreeMap::new(),
            zone_smoothers: HashMap::default(),
            view: HashMap::new(),
            computed: 0,
            provisional: 0,
            surge_at: None,
            rose: BTreeMap::new(),
            early: None,
            epoch: 0,
            moved: 0,
            unbound_ids: 0,
            shares_instructions: false,
        }
    }

    /// From now on, sends instructions as [`RegionStep::SendShared`]: the buckets every zone
    /// gets alike are built once per interval and shared, for an owner that encodes them once
    /// for every zone stream (a controller of many zones) rather than once per zone.
    pub fn share_instructions(&mut self, share: bool) {
        self.shares_instructions = share;
    }

    /// The controller lease's epoch the instructions carry from now on: this controller's own
    /// while it leads.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The epoch the instructions carry.
    pub fn epoch(&self) -> u64 {
        self.epoch
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
        self.renumber();
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

    /// The `instructions` of a [`RegionStep::Send`] could not be sent: what they carried for the
    /// first time on the stream (the rules, buckets' names for their numbers) goes again next
    /// time.
    pub fn send_failed(&mut self, member: u64, instructions: &v1::ZoneInstructions) {
        let Some(zone) = self.zones.get_mut(&member) else {
            return;
        };
        let Some(instructions) = &instructions.instructions else {
            return;
        };
        zone.forget(instructions.rules.is_some(), &instructions.buckets);
    }

    /// As [`RegionCore::send_failed`], for a [`RegionStep::SendShared`].
    pub fn shared_send_failed(&mut self, member: u64, instructions: &SharedInstructions) {
        let Some(zone) = self.zones.get_mut(&member) else {
            return;
        };
        zone.forget(instructions.rules().is_some(), instructions.buckets());
    }

    /// Zone report entries skipped so far because their stream never named their bucket's
    /// number: each a fault of the aggregator that sent it.
    pub fn unbound_ids(&self) -> u64 {
        self.unbound_ids
    }

    /// The service and bucket names of `entry`, of a report on stream `member`: its own, or those
    /// its number stands for on that stream (for what keeps counts by name, like the history).
    pub fn bucket_names<'a>(
        &'a self,
        member: u64,
        entry: &'a v1::BucketCounts,
    ) -> Option<(&'a str, &'a str)> {
        match self.zones.get(&member) {
            Some(zone) => zone.names.names(&self.table, entry),
            None => match Named::of(&entry.service, &entry.bucket, entry.id) {
                Named::Names {
                    service, bucket, ..
                } => Some((service, bucket)),
                Named::Id(_) => None,
            },
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
            if let Some(zone) = self.zones.get_mut(&member) {
                zone.told.set_takes_ids(report.bucket_ids);
                let mut sums = IndexedSums::default();
                let unbound = zone.names.unbound;
                sums.add_wire(&self.table, &mut zone.names, false, &report.buckets);
                self.unbound_ids += zone.names.unbound - unbound;
                if open {
                    zone.surge = Some((report.sequence, Arc::new(sums)));
                    self.surge_at.get_or_insert(now_ms);
                }
            }
            return self.poll(now_ms);
        }
        // A host this aggregator reports for the first time that another one had: it moved, and
        // is counted here from now on. The other's last part counted it, so it no longer stands
        // in for a missing interval of the other (the host would count twice).
        for h in &report.hosts {
            for (&other, zone) in &mut self.zones {
                if other != member && zone.hosts.remove(&h.host_id).is_some() {
                    zone.last = None;
                    self.moved += 1;
                }
            }
        }
        let interval_ms = self.interval().ms();
        let zone = self.zones.entry(member).or_default();
        zone.name.clone_from(&report.zone);
        zone.told.set_takes_ids(report.bucket_ids);
        let unbound = zone.names.unbound;
        for h in &report.hosts {
            zone.hosts.insert(h.host_id.clone(), h.rules_version);
        }
        for h in &report.gone {
            zone.hosts.remove(h);
        }
        if report.interval_ms == interval_ms
            && let Some(parts) = self.window.accept(report.sequence, member)
        {
            let (_, sums) = parts
                .entry(member)
                .or_insert_with(|| (report.zone, Arc::default()));
            Arc::make_mut(sums).add_wire(&self.table, &mut zone.names, true, &report.buckets);
        } else if report
            .buckets
            .iter()
            .any(|b| b.id != 0 && !b.bucket.is_empty())
        {
            // Too late to count, but the numbers it names are bound for the reports after.
            IndexedSums::default().add_wire(&self.table, &mut zone.names, false, &report.buckets);
        }
        self.unbound_ids += zone.names.unbound - unbound;
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
            names: Dictionary::default(),
        });
        peer.last_heard_ms = now_ms;
        // Sums of intervals the clock has not reached are bogus; kept, they would push the
        // peer's real ones out of its window.
        let current = interval.sequence_at(now_ms);
        if sums.interval_ms == interval.ms() && sums.sequence <= current.saturating_add(1) {
            let mut counts = IndexedSums::default();
            counts.add_wire(&self.table, &mut peer.names, true, &sums.buckets);
            peer.sums.insert(sums.sequence, counts);
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
        for (sequence, mut parts, _) in
            self.window
                .close_ready(now_ms, interval, 2 * grace, self.zones.keys())
        {
            for zone in self.zones.values_mut() {
                if zone.surge.as_ref().is_some_and(|(s, _)| *s <= sequence) {
                    zone.surge = None;
                }
            }
            let before = self.zones_before(sequence);
            self.estimate_missing(sequence, &mut parts, &before);
            let zone_sums = by_zone(&parts);
            self.record_rises(sequence, &zone_sums, &before);
            steps.push(RegionStep::Announce(v1::RegionSums {
                region: self.region.clone(),
                sequence,
                interval_ms: interval.ms(),
                buckets: self.own_global(&zone_sums).to_wire(&self.table),
            }));
            let waits = self
                .peers
                .values()
                .any(|p| is_awaited(p, sequence, now_ms, ttl) && !p.sums.contains_key(&sequence));
            if waits
                && let Some(per_zone) =
                    self.provisional(config, sequence, &zone_sums, now_ms, interval)
            {
                self.provisional += 1;
                self.instruct(
                    &mut steps,
                    sequence,
                    per_zone,
                    &parts,
                    now_ms,
                    Sent::Provisional,
                );
            }
            self.awaiting.insert(
                sequence,
                (parts, interval.end_of(sequence).saturating_add(3 * grace)),
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
            let Some((sequence, (parts, _))) = self.awaiting.pop_first() else {
                break;
            };
            let mut zone_sums = by_zone(&parts);
            for zone in self.zones.values().filter(|z| !z.name.is_empty()) {
                if !zone_sums.contains_key(&zone.name) {
                    zone_sums.insert(zone.name.clone(), Arc::default());
                }
            }
            let own = self.own_global(&zone_sums);
            let scale = Scale {
                rises: self.rose.get(&sequence).map_or(&[][..], Vec::as_slice),
                kind: None,
            };
            let peers = self.peer_sums(sequence, now_ms, ttl, scale, &own);
            self.record_total(sequence, own, &peers);
            let (per_zone, _) = self.compute(&zone_sums, &peers, interval, true);
            self.instruct(
                &mut steps,
                sequence,
                per_zone,
                &parts,
                now_ms,
                Sent::Computed,
            );
        }
        self.instruct_without_late_zones(config, &mut steps, now_ms, interval);
        self.answer_surges(config, &mut steps, now_ms, interval);
        steps
    }

    /// Hosts that moved from one aggregator to another so far (a zone's hosts failing over to
    /// its other aggregator).
    pub fn moved_hosts(&self) -> u64 {
        self.moved
    }

    /// Provisional instructions sent so far ([`RegionCore::provisional`]).
    pub fn provisionals(&self) -> u64 {
        self.provisional
    }
}

impl RegionCore {
    /// Numbers the buckets of the rules now in force, and renumbers what is kept by the old
    /// numbers: the open and awaited intervals' sums, the zones' last ones and estimates, the
    /// peers' sums, the totals, the smoothing state and the view. A bucket that left the rules
    /// takes its counts and smoothing with it; one that stays keeps them, wherever it moved.
    fn renumber(&mut self) {
        let next = Table::new(&self.rules.config, &self.region);
        if self.table.same_buckets(&next) {
            self.table = next;
            return;
        }
        let moves = self.table.moves_to(&next);
        let remap = |sums: &mut Arc<IndexedSums>| *sums = Arc::new(sums.remap(&moves));
        for parts in self.window.pending_mut() {
            parts.values_mut().for_each(|(_, sums)| remap(sums));
        }
        for (parts, _) in self.awaiting.values_mut() {
            parts.values_mut().for_each(|(_, sums)| remap(sums));
        }
        for zone in self.zones.values_mut() {
            zone.names.renumber(&self.table, &next, &moves);
            // Instructions number buckets by index: every number now stands for another bucket.
            zone.told.forget_all();
            for (_, sums) in zone.last.iter_mut().chain(zone.surge.iter_mut()) {
                remap(sums);
            }
        }
        for peer in self.peers.values_mut() {
            peer.names.renumber(&self.table, &next, &moves);
            for sums in peer.sums.values_mut() {
                *sums = sums.remap(&moves);
            }
        }
        for sums in self.totals.values_mut() {
            *sums = sums.remap(&moves);
        }
        for rises in self.rose.values_mut() {
            *rises = rises
                .iter()
                .filter_map(|&(i, rise)| Some((moves[i as usize]?, rise)))
                .collect();
            rises.sort_by_key(|&(i, _)| i);
        }
        // Smoothing state follows its bucket while it keeps a scope it is kept for.
        let kept = |old: usize, zone: bool| {
            let new = moves[old]?;
            let spec = next.spec(new);
            (spec.computed() && (spec.scope == Scope::Zone) == zone).then_some(new as usize)
        };
        let mut smoothers = vec![Smoother::default(); next.len()];
        let mut views = vec![None; next.len()];
        for (old, moved) in moves.iter().enumerate() {
            if let Some(new) = kept(old, false) {
                smoothers[new] = self.smoothers[old];
            }
            if let Some(new) = moved {
                views[*new as usize] = self.views[old];
            }
        }
        for by_bucket in self.zone_smoothers.values_mut() {
            *by_bucket = by_bucket
                .iter()
                .filter_map(|(&old, &s)| Some((kept(old as usize, true)? as Index, s)))
                .collect();
        }
        self.smoothers = smoothers;
        self.views = views;
        self.table = next;
    }

    /// The region's sums of its global buckets only, from its zones' sums: what peers need,
    /// and all they get.
    fn own_global(&self, zones: &ZoneSums) -> IndexedSums {
        let mut global = IndexedSums::default();
        if self.table.global().is_empty() {
            return global;
        }
        for sums in zones.values() {
            global.add(&sums.filtered(|i| self.table.is_global(i)));
        }
        global
    }
}

fn is_live(peer: &Peer, now_ms: u64, ttl: Duration) -> bool {
    (now_ms.saturating_sub(peer.last_heard_ms) as u128) < ttl.as_millis()
}

/// Whether interval `sequence` waits for `peer`'s sums: a live peer that sent the interval's
/// sums or the one's before. A peer whose region was lost is not waited for once an interval's
/// sums of it are missing, and its own sums no longer count once two are (see
/// [`RegionCore::poll`]): from then its last sums are held only as far as the load this
/// controller still sees did not rise to take them over ([`RegionCore::held`]), so its load,
/// failed over to the other regions, counts twice for one interval, not until the TTL
/// (region-loss admitted 6,300-8,000/s of 10,000 for 3 s when its last sums stood in until the
/// TTL, and every interval waited three graces for the lost peer).
fn is_awaited(peer: &Peer, sequence: u64, now_ms: u64, ttl: Duration) -> bool {
    is_live(peer, now_ms, ttl)
        && peer
            .sums
            .range(sequence.saturating_sub(1)..)
            .next()
            .is_some()
}
