//! The zone aggregator's state machine: sums its hosts' reports per bucket and interval,
//! forwards each interval to the region's controller as soon as it is complete, and relays
//! instructions and rules back down to its hosts.
//!
//! An interval is complete when every connected host has reported it, or a grace of a quarter
//! interval after its end has passed: with 1 s reports and one silent host, the zone's sums
//! still leave at 250 ms past the second, and with all hosts healthy they leave the moment the
//! last report arrives, so the loop's delay is the network's, not a sum of timers. In a zone of
//! many hosts one report is often missing (2,000 hosts that each lose one message in 1,000 miss
//! one in most intervals), so a zone of [`QUORUM_HOSTS`] hosts or more closes an interval 10 ms
//! past its end when at most one host in 32 is silent; a silent host's counts of the interval
//! before stand in for its own, whenever an interval closes without it.
//!
//! Before it sums them, the aggregator bounds what each host's counts may say
//! ([`crate::plausible`]): a compromised proxy reporting `offered = 1e9` counts for at most the
//! bucket's limit (or a few times its zone's median host), and is held to what was counted.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use spillway_core::algo::Ratio;
use spillway_proto::v1;

use crate::fence::Fence;
use crate::interval::Interval;
use crate::plausible::{self, ClampCounts, CountClamp, Factors, PlausibleBounds};
use crate::region::tier_drop_ratios;
use crate::sums::{BucketKey, Counts, Intervals, Quorum, Sums};

mod ids;
mod relay;
use self::ids::StreamIds;
pub use self::relay::RELAY_MOVE;
use self::relay::Relayed;

/// A clamp worth a log line: the first of its host within [`NOTICE_EVERY_MS`], with how many of
/// that host's clamps went without one since the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClampNotice {
    pub clamp: CountClamp,
    pub unlogged: u64,
}

/// One host in this many may be missing when an interval closes early (see [`ZoneCore::poll`]):
/// zones of fewer hosts wait for every report, or the grace.
pub const QUORUM_HOSTS: usize = 32;

/// How long after its end, in fractions of the interval, a large zone waits for its last
/// reports before it closes an interval without a few of them: a hundredth (10 ms at 1 s), many
/// times a zone's network delay, and a hundredth of an interval added to enforcement (a
/// fiftieth left a 3x step over 2,000 small callers at 1.0-1.1 s in the simulator, 1.0 s with
/// a hundredth).
pub const QUORUM_WAIT: u64 = 100;

/// At most one [`ClampNotice`] per host in this long: 10 s, so a proxy that lies in every report
/// makes one warning line every ten seconds, not one per report.
pub const NOTICE_EVERY_MS: u64 = 10_000;

/// Notices held for an owner that does not take them (the simulator): the oldest are kept, the
/// rest are still counted in [`ZoneCore::clamped`].
const MAX_NOTICES: usize = 256;

/// What the owner of a [`ZoneCore`] sends.
#[derive(Debug, Clone, PartialEq)]
pub enum ZoneStep {
    /// The zone's sums of one closed interval, for the region's controller.
    Forward(v1::ZoneReport),
    /// Instructions (and rules, when the host runs other ones) for one host.
    Send {
        host: String,
        instructions: v1::Instructions,
    },
}

/// A host with an open stream.
#[derive(Debug)]
struct Host {
    /// The stream it reports on: a host that reconnects before its old stream ended is on the
    /// new one.
    conn: u64,
    rules_version: u64,
    /// Its counts in the last closed interval it reported, as they were counted.
    last: Sums,
    /// The interval those counts are of.
    last_sequence: Option<u64>,
    /// The rules version last sent to it.
    sent_rules: u64,
}

/// A zone aggregator: host reports, controller instructions and time in, [`ZoneStep`]s out. The
/// gRPC server drives it with Unix milliseconds, the simulator with simulated ones.
#[derive(Debug)]
pub struct ZoneCore {
    region: String,
    zone: String,
    /// The controller's interval once it spoke; before that, the hosts'.
    interval: Interval,
    interval_from_controller: bool,
    /// Every host's name by its slot, the number it goes by in the tables below (a report finds
    /// its host with one hash of its name, and the open intervals hold no names). A slot stays
    /// taken while its host has a stream or counts in an open interval, and is then reused.
    names: Vec<String>,
    /// Hashed with foldhash: the names are the hosts' own, hashed once per report.
    slots: HashMap<String, u32, foldhash::fast::RandomState>,
    /// The hosts with an open stream, by slot.
    hosts: Vec<Option<Host>>,
    /// Their slots in name order, so what is sent to them goes out in the same order every run.
    order: Vec<u32>,
    /// Slots whose host left, to free once no open interval holds counts of theirs; and free
    /// slots.
    leaving: Vec<u32>,
    free: Vec<u32>,
    /// Each host's counts of the intervals still open, by the reporting host's slot.
    window: Intervals<u32, BTreeMap<u32, Sums>>,
    rules: Option<v1::Rules>,
    /// What a host's counts may say, from the controller's rules.
    bounds: PlausibleBounds,
    /// The hosts clamped against their peers in the last closed interval, and how much of
    /// their load was counted: their drop ratios are raised to match.
    factors: Factors,
    clamped: ClampCounts,
    notices: Vec<ClampNotice>,
    /// Per host, when its last notice was taken and how many clamps went unlogged since.
    noticed: HashMap<String, (u64, u64)>,
    /// The zone's sums of the last closed interval, to split shares among hosts.
    last_sums: Sums,
    /// The interval length and sequence of the last forwarded interval: should the length
    /// change and come back, intervals it already forwarded are not forwarded again.
    last_forwarded: Option<(u64, u64)>,
    /// Hosts and rules versions the controller knows from this zone, while a stream to it is
    /// open (`None`: no stream).
    told: Option<HashMap<String, u64>>,
    late_reports: u64,
    forwarded: u64,
    /// Hosts whose surge guard engaged in the open interval, with their rates as counts of one
    /// interval (`v1::Report::surge`); forgotten when an interval closes, which counted them.
    surging: BTreeMap<String, Sums>,
    /// Hosts that left, with what they count for in the last closed interval's sums (their
    /// counts of it, or of the one before when they left before it closed): their rate now is
    /// nothing, whatever they offered before. Forgotten like `surging`.
    left: BTreeMap<String, Sums>,
    /// A surge report came since the zone last forwarded its estimate.
    surge_due: bool,
    /// Hosts whose guard engaged in the open interval or the one before (their surge report
    /// came then), by name, with that interval: where an answer to surge reports that moves no
    /// bucket goes ([`relay`]).
    waiting: BTreeMap<String, u64>,
    /// What the zone last relayed to every host.
    relayed: Relayed,
    /// The controller epoch whose instructions this zone follows.
    fence: Fence,
    /// Whether its reports number their buckets ([`ZoneCore::number_buckets`]).
    numbered: bool,
    /// The bucket numbers of the stream to the controller, both ways.
    ids: StreamIds,
    /// Instruction entries skipped because their stream never named their number.
    unbound_ids: u64,
    /// Answers to surge reports relayed only to the `waiting` hosts.
    answers_to_waiting: u64,
}

impl ZoneCore {
    /// Zone `zone` of region `region` at `now_ms`, reporting at 1 s until told otherwise.
    pub fn new(region: impl Into<String>, zone: impl Into<String>, now_ms: u64) -> Self {
        let interval = Interval::new(Duration::from_secs(1));
        Self {
            region: region.into(),
            zone: zone.into(),
            interval,
            interval_from_controller: false,
            names: Vec::new(),
            slots: HashMap::default(),
            hosts: Vec::new(),
            order: Vec::new(),
            leaving: Vec::new(),
            free: Vec::new(),
            window: Intervals::new(interval.sequence_at(now_ms).saturating_sub(1)),
            rules: None,
            bounds: PlausibleBounds::default(),
            factors: Factors::default(),
            clamped: ClampCounts::default(),
            notices: Vec::new(),
            noticed: HashMap::new(),
            last_sums: Sums::default(),
            last_forwarded: None,
            told: None,
            late_reports: 0,
            forwarded: 0,
            surging: BTreeMap::new(),
            left: BTreeMap::new(),
            surge_due: false,
            waiting: BTreeMap::new(),
            relayed: Relayed::default(),
            fence: Fence::default(),
            numbered: false,
            ids: StreamIds::default(),
            unbound_ids: 0,
            answers_to_waiting: 0,
        }
    }

    /// Numbers the buckets on the stream to the controller ([`crate::bucket_ids`]): each report
    /// names a bucket the first time, then, once the controller said it takes numbers, sends
    /// its number alone, and asks for instructions by number. For a driver whose stream
    /// delivers every message, in order (gRPC); a zone that is not told names every bucket.
    pub fn number_buckets(&mut self) {
        self.numbered = true;
    }

    /// Answers to surge reports relayed so far only to the hosts whose guard engaged in the
    /// open interval or the one before, moving no bucket by over [`RELAY_MOVE`].
    pub fn answers_to_waiting(&self) -> u64 {
        self.answers_to_waiting
    }

    /// Instruction entries skipped so far because the stream never named their number: each a
    /// fault of the controller that sent it.
    pub fn unbound_ids(&self) -> u64 {
        self.unbound_ids
    }

    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The interval in force.
    pub fn interval(&self) -> Interval {
        self.interval
    }

    /// Hosts with an open stream.
    pub fn hosts(&self) -> usize {
        self.order.len()
    }

    /// The slot of `host`, taken when it has none.
    fn slot(&mut self, host: &str) -> u32 {
        if let Some(&slot) = self.slots.get(host) {
            return slot;
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.names[slot as usize] = host.to_owned();
                slot
            }
            None => {
                self.names.push(host.to_owned());
                self.hosts.push(None);
                u32::try_from(self.names.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.slots.insert(host.to_owned(), slot);
        slot
    }

    /// Takes the host of `name` out: its stream ended.
    fn remove(&mut self, name: &str) -> Option<Host> {
        let slot = *self.slots.get(name)?;
        let host = self.hosts[slot as usize].take()?;
        self.order.retain(|&s| s != slot);
        self.leaving.push(slot);
        Some(host)
    }

    /// The host of `name` with an open stream.
    fn host(&self, name: &str) -> Option<&Host> {
        let slot = *self.slots.get(name)?;
        self.hosts[slot as usize].as_ref()
    }

    fn host_mut(&mut self, name: &str) -> Option<&mut Host> {
        let slot = *self.slots.get(name)?;
        self.hosts[slot as usize].as_mut()
    }

    /// The hosts with an open stream, in name order, with their names.
    fn named_hosts(&self) -> impl Iterator<Item = (&str, &Host)> + '_ {
        self.order.iter().filter_map(|&slot| {
            let host = self.hosts[slot as usize].as_ref()?;
            Some((self.names[slot as usize].as_str(), host))
        })
    }

    /// Frees the slots of hosts that left once no open interval holds counts of theirs.
    fn free_slots(&mut self) {
        if self.leaving.is_empty() {
            return;
        }
        let leaving = std::mem::take(&mut self.leaving);
        for slot in leaving {
            let index = slot as usize;
            if self.hosts[index].is_some() {
                continue; // it came back
            }
            if self.window.pending().any(|p| p.contains_key(&slot)) {
                self.leaving.push(slot);
                continue;
            }
            let name = std::mem::take(&mut self.names[index]);
            self.slots.remove(&name);
            self.free.push(slot);
        }
    }

    /// The rules the controller sent last, as they came: what a host that joins now runs.
    pub fn rules(&self) -> Option<&v1::Rules> {
        self.rules.as_ref()
    }

    /// The version of the rules the controller sends down (0: none yet).
    pub fn rules_version(&self) -> u64 {
        self.rules.as_ref().map_or(0, |r| r.version)
    }

    /// The controller epoch followed, and the instructions dropped for an older one.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Reports that arrived after their interval was forwarded (or of another interval length).
    pub fn late_reports(&self) -> u64 {
        self.late_reports
    }

    /// Zone sums handed out for the controller.
    pub fn forwarded(&self) -> u64 {
        self.forwarded
    }

    /// Counts lowered so far, by reason ([`crate::plausible`]).
    pub fn clamped(&self) -> &ClampCounts {
        &self.clamped
    }

    /// The clamps to log since the last call: at most one per host per [`NOTICE_EVERY_MS`].
    pub fn take_notices(&mut self) -> Vec<ClampNotice> {
        std::mem::take(&mut self.notices)
    }

    /// The bounds in force (the defaults until the controller's rules came).
    pub fn bounds(&self) -> &PlausibleBounds {
        &self.bounds
    }

    /// A host opened stream `conn` before reporting (the simulator's hosts are linked from the
    /// start); a server learns the host from its first report instead.
    pub fn join(&mut self, host: &str, conn: u64) {
        self.join_slot(host, conn);
    }

    /// [`ZoneCore::join`], returning the host's slot.
    fn join_slot(&mut self, host: &str, conn: u64) -> u32 {
        let slot = self.slot(host);
        if self.hosts[slot as usize].is_none() {
            self.hosts[slot as usize] = Some(Host {
                conn,
                rules_version: 0,
                last: Sums::default(),
                last_sequence: None,
                sent_rules: 0,
            });
            let names = &self.names;
            let at = self
                .order
                .partition_point(|&s| names[s as usize].as_str() < host);
            self.order.insert(at, slot);
        }
        slot
    }

    /// A report from `report.host_id` on stream `conn`, at `now_ms`.
    pub fn on_report(&mut self, now_ms: u64, conn: u64, mut report: v1::Report) -> Vec<ZoneStep> {
        if report.surge {
            self.on_surge_report(now_ms, conn, report);
            return Vec::new();
        }
        let mut steps = Vec::new();
        if !self.interval_from_controller && report.interval_ms > 0 {
            self.adopt(Interval::from_ms(report.interval_ms), now_ms);
        }
        let counted_any = !report.buckets.is_empty();
        let sums = self.bounded(now_ms, &report.host_id, std::mem::take(&mut report.buckets));
        let slot = self.join_slot(&report.host_id, conn);
        let Some(host) = self.hosts[slot as usize].as_mut() else {
            return steps;
        };
        if host.conn != conn {
            host.conn = conn;
            host.sent_rules = 0;
        }
        host.rules_version = report.rules_version;
        // A host that joins between two instruction sets gets the rules at once.
        if let Some(rules) = &self.rules
            && rules.version != report.rules_version
            && host.sent_rules != rules.version
        {
            host.sent_rules = rules.version;
            steps.push(ZoneStep::Send {
                host: report.host_id.clone(),
                instructions: v1::Instructions {
                    rules_version: rules.version,
                    rules: Some(rules.clone()),
                    interval_ms: self.interval.ms(),
                    ..Default::default()
                },
            });
        }
        let accepted = report.interval_ms == self.interval.ms()
            && self
                .window
                .accept(report.sequence, slot)
                .map(|pending| match pending.entry(slot) {
                    Entry::Vacant(entry) => {
                        entry.insert(sums.normalized());
                    }
                    Entry::Occupied(mut entry) => entry.get_mut().add(&sums),
                })
                .is_some();
        if !accepted {
            // A report of nothing for a closed interval is a host's hello
            // (`HostCore::hello`): it joined, and was late for nothing.
            if counted_any {
                self.late_reports += 1;
            }
            return steps;
        }
        steps.extend(self.poll(now_ms));
        steps
    }

    /// A surge report (`v1::Report::surge`) of a host linked on `conn`: kept, bounded like any
    /// report, for the zone's estimate of the open interval, which [`ZoneCore::poll`] forwards.
    fn on_surge_report(&mut self, now_ms: u64, conn: u64, report: v1::Report) {
        if report.interval_ms != self.interval.ms()
            || self.host(&report.host_id).is_none_or(|h| h.conn != conn)
        {
            return;
        }
        let sums = self.bounded(now_ms, &report.host_id, report.buckets);
        match self.waiting.get_mut(&report.host_id) {
            Some(at) => *at = report.sequence,
            None => {
                self.waiting.insert(report.host_id.clone(), report.sequence);
            }
        }
        self.surging.insert(report.host_id, sums);
        self.surge_due = true;
    }

    /// The counts of `host`'s report, each bounded by what a host's counts may say
    /// ([`crate::plausible`]), the clamps noted.
    fn bounded(&mut self, now_ms: u64, host: &str, buckets: Vec<v1::BucketCounts>) -> Sums {
        let mut sums = Sums::from_wire_owned(buckets);
        let mut lowered = Vec::new();
        plausible::check_report(
            &mut sums,
            &self.bounds,
            self.interval,
            |key, reason, from, to| {
                lowered.push((key.clone(), reason, from, to));
            },
        );
        for (bucket, reason, reported, counted) in lowered {
            self.note(
                now_ms,
                CountClamp {
                    host: host.to_owned(),
                    bucket,
                    reason,
                    reported,
                    counted,
                },
            );
        }
        sums
    }

    /// The zone's estimate of the open interval from its surge reports: the last closed
    /// interval's sums, each surging host's counts there replaced by its rates now, and those
    /// of each host that left since taken out (a stopped host offers nothing now).
    fn surge_estimate(&mut self, now_ms: u64) -> v1::ZoneReport {
        let mut estimate = self.last_sums.clone();
        for (name, now) in &self.surging {
            let before = self.host(name).map(|h| &h.last);
            for (key, counts) in &now.0 {
                let was = before.map(|b| b.counts(key)).unwrap_or_default();
                let entry = replace_counts(&mut estimate, key, was, *counts);
                if was.hosts == 0 {
                    entry.hosts += counts.hosts;
                }
                entry.fit_tiers();
            }
        }
        for last in self.left.values() {
            for (key, was) in &last.0 {
                let entry = replace_counts(&mut estimate, key, *was, Counts::default());
                entry.hosts = entry.hosts.saturating_sub(was.hosts);
                entry.fit_tiers();
            }
        }
        v1::ZoneReport {
            zone: self.zone.clone(),
            region: self.region.clone(),
            sequence: self.interval.sequence_at(now_ms),
            interval_ms: self.interval.ms(),
            buckets: self.wire(&estimate),
            clients: u32::try_from(self.order.len()).unwrap_or(u32::MAX),
            hosts: Vec::new(),
            gone: Vec::new(),
            surge: true,
            bucket_ids: self.numbered,
        }
    }

    /// Stream `conn` of `host` ended at `now_ms`: the interval no longer waits for it (unless it
    /// already reports on a newer stream).
    pub fn on_stream_end(&mut self, now_ms: u64, host: &str, conn: u64) -> Vec<ZoneStep> {
        if self.host(host).is_some_and(|h| h.conn == conn) {
            if let Some(gone) = self.remove(host) {
                self.surging.remove(host);
                // Its counts are in the last closed interval's sums when it reported that
                // interval, or the one before, which then stood in for it.
                let closed = self.window.closed_through();
                if gone.last_sequence.is_some_and(|last| last + 1 >= closed) {
                    self.left.insert(host.to_owned(), gone.last);
                }
            }
            return self.poll(now_ms);
        }
        Vec::new()
    }

    /// Closes, in order, every interval that every host reported or whose grace passed at
    /// `now_ms`, and forwards each; an interval with no report at all is still forwarded, so the
    /// controller keeps answering.
    ///
    /// A zone of [`QUORUM_HOSTS`] hosts or more also closes an interval [`QUORUM_WAIT`] of an
    /// interval after its end (10 ms at 1 s) when at most one host in [`QUORUM_HOSTS`] has not reported
    /// it. Whenever an interval closes without a host that reported the one before, that host's
    /// counts of the one before stand in for its own ([`ZoneCore::estimate_missing`]).
    pub fn poll(&mut self, now_ms: u64) -> Vec<ZoneStep> {
        let grace = self.interval.grace_ms();
        let quorum = Quorum {
            wait_ms: (self.interval.ms() / QUORUM_WAIT).max(1),
            missing: self.order.len() / QUORUM_HOSTS,
        };
        let closed =
            self.window
                .close_ready_quorum(now_ms, self.interval, grace, self.order.iter(), quorum);
        if let Some(&(last, _, _)) = closed.last() {
            // A guard engaged in interval `last - 1` waits for the instructions of `last - 1`
            // and `last`; those of `last` follow its close within milliseconds.
            self.waiting.retain(|_, at| *at >= last);
        }
        if !closed.is_empty() {
            self.surging.clear();
            self.left.clear();
            self.surge_due = false;
        }
        let mut steps: Vec<ZoneStep> = closed
            .into_iter()
            .map(|(sequence, mut hosts, reported)| {
                let estimated = self.estimate_missing(sequence, &mut hosts);
                let sums = self.bound(now_ms, sequence, hosts, &estimated);
                ZoneStep::Forward(self.forward(sequence, sums, reported))
            })
            .collect();
        if !steps.is_empty() {
            self.free_slots();
        }
        if std::mem::take(&mut self.surge_due) && self.told.is_some() {
            steps.push(ZoneStep::Forward(self.surge_estimate(now_ms)));
        }
        steps
    }

    /// Puts in `hosts` (the reports of interval `sequence`) the counts of every connected host
    /// that did not report it but did report the interval before, as that host's estimate:
    /// a report lost or late costs the sums one interval's change of one host, where leaving
    /// the host out would count its whole load as gone (at 1.5x the limit, one silent host of
    /// 33 lowers the ratio enough to admit 5% over the limit for an interval). A host silent
    /// for two intervals is left out. Returns the hosts estimated.
    fn estimate_missing(&self, sequence: u64, hosts: &mut BTreeMap<u32, Sums>) -> Vec<u32> {
        let mut estimated = Vec::new();
        for &slot in &self.order {
            let Some(host) = &self.hosts[slot as usize] else {
                continue;
            };
            if !hosts.contains_key(&slot)
                && host.last_sequence.is_some_and(|last| last + 1 == sequence)
            {
                hosts.insert(slot, host.last.clone());
                estimated.push(slot);
            }
        }
        estimated
    }

    /// Bounds the hosts of a closed interval against each other and sums them: what each host
    /// that reported counted for becomes its last counts (for its adaptive share, and its
    /// estimate should its next report be missing), and the part of each clamped host's load
    /// that was counted, its drop ratio's factor.
    fn bound(
        &mut self,
        now_ms: u64,
        sequence: u64,
        hosts: BTreeMap<u32, Sums>,
        estimated: &[u32],
    ) -> Sums {
        let mut lowered = Vec::new();
        let mut hosts = self.in_name_order(hosts);
        let names = &self.names;
        let live = &self.hosts;
        let held = plausible::bound_peers_by(
            &mut hosts,
            &self.bounds,
            self.interval,
            |&slot, key, r, a, b| {
                lowered.push(CountClamp {
                    host: names[slot as usize].clone(),
                    bucket: key.clone(),
                    reason: r,
                    reported: a,
                    counted: b,
                });
            },
            |&slot| live[slot as usize].is_some(),
        );
        self.factors = Factors::default();
        for (slot, key, counted) in held {
            self.factors
                .insert(self.names[slot as usize].clone(), key, counted);
        }
        for clamp in lowered {
            self.note(now_ms, clamp);
        }
        self.noticed
            .retain(|_, (at, _)| now_ms.saturating_sub(*at) < NOTICE_EVERY_MS);
        let mut zone = Sums::default();
        for (slot, sums) in hosts {
            zone.add(&sums);
            match self.hosts[slot as usize].as_mut() {
                Some(host) if !estimated.contains(&slot) => {
                    host.last = sums;
                    host.last_sequence = Some(sequence);
                }
                Some(_) => {}
                // It left after its last report: what it counted is in these sums, and is to be
                // taken out of an estimate of the interval now open.
                None => {
                    self.left.insert(self.names[slot as usize].clone(), sums);
                }
            }
        }
        zone
    }

    /// The reports of a closed interval in their hosts' name order, as the clamps are noted:
    /// those of hosts with a stream in the order kept of them, without comparing a name; a host
    /// that left since is put in its place by name.
    fn in_name_order(&self, mut hosts: BTreeMap<u32, Sums>) -> Vec<(u32, Sums)> {
        let mut sorted = Vec::with_capacity(hosts.len());
        for &slot in &self.order {
            if let Some(sums) = hosts.remove(&slot) {
                sorted.push((slot, sums));
            }
        }
        if !hosts.is_empty() {
            sorted.extend(hosts);
            sorted.sort_by(|a, b| self.names[a.0 as usize].cmp(&self.names[b.0 as usize]));
        }
        sorted
    }

    /// Counts a clamp, and keeps it as a notice when its host has had none for a while.
    fn note(&mut self, now_ms: u64, clamp: CountClamp) {
        self.clamped.add(clamp.reason);
        let due = self
            .noticed
            .get(&clamp.host)
            .is_none_or(|(at, _)| now_ms.saturating_sub(*at) >= NOTICE_EVERY_MS);
        if due {
            let unlogged = self.noticed.remove(&clamp.host).map_or(0, |(_, n)| n);
            self.noticed.insert(clamp.host.clone(), (now_ms, 0));
            if self.notices.len() < MAX_NOTICES {
                self.notices.push(ClampNotice { clamp, unlogged });
            }
        } else if let Some((_, unlogged)) = self.noticed.get_mut(&clamp.host) {
            *unlogged += 1;
        }
    }

    /// A stream to the controller opened: it knows none of this zone's hosts yet.
    pub fn upstream_opened(&mut self) {
        self.told = Some(HashMap::new());
        self.ids = StreamIds::default();
    }

    /// The stream to the controller is gone, and its bucket numbers with it.
    pub fn upstream_closed(&mut self) {
        self.told = None;
        self.ids = StreamIds::default();
    }

    /// The [`ZoneStep::Forward`] of `report` could not be sent: what it told the controller about
    /// hosts, and the buckets' names it gave with their numbers, are told again with the next
    /// one.
    pub fn forward_failed(&mut self, report: &v1::ZoneReport) {
        self.ids.lost(&report.buckets);
        if report.surge {
            return;
        }
        if let Some(told) = &mut self.told {
            for h in &report.hosts {
                told.remove(&h.host_id);
            }
            for h in &report.gone {
                told.insert(h.clone(), 0);
            }
            self.forwarded = self.forwarded.saturating_sub(1);
        }
    }

    /// A [`ZoneStep::Send`] carrying rules could not be sent to `host`: send them again.
    pub fn send_failed(&mut self, host: &str) {
        if let Some(h) = self.host_mut(host) {
            h.sent_rules = 0;
        }
    }

    /// The controller's instructions at `now_ms`: relayed to every host, with each host's share
    /// of the zone's share for adaptive token buckets, and the rules to hosts that run another
    /// version. Instructions of an older controller epoch than the newest seen within its TTL
    /// are dropped ([`Fence`]). An answer to surge reports that moves no bucket clearly from
    /// what every host was last told goes only to the hosts whose guard engaged in the open
    /// interval or the one before ([`relay`]).
    pub fn on_instructions(
        &mut self,
        now_ms: u64,
        zone_instructions: v1::ZoneInstructions,
    ) -> Vec<ZoneStep> {
        let mut steps = Vec::with_capacity(self.hosts.len());
        self.on_instructions_with(now_ms, zone_instructions, |host, instructions| {
            steps.push(ZoneStep::Send {
                host: host.to_owned(),
                instructions: Arc::unwrap_or_clone(instructions),
            });
        });
        steps
    }

    /// [`ZoneCore::on_instructions`], each host's instructions handed to `send` in name order
    /// instead of returned: hosts whose instructions are the zone's own (no share of their own,
    /// no count held, no rules to send) share one message, so an owner that need not copy them
    /// (the simulator's 100,000 hosts) does not.
    pub fn on_instructions_with(
        &mut self,
        now_ms: u64,
        zone_instructions: v1::ZoneInstructions,
        mut send: impl FnMut(&str, Arc<v1::Instructions>),
    ) {
        let Some(mut instructions) = zone_instructions.instructions else {
            return;
        };
        // Named before the fence: numbers bound by instructions it drops still hold.
        self.ids
            .set_takes_ids(self.numbered && zone_instructions.bucket_ids);
        let unbound = self.ids.unbound;
        self.ids.name(&mut instructions.buckets);
        self.unbound_ids += self.ids.unbound - unbound;
        if !self
            .fence
            .admit(instructions.epoch, instructions.ttl_ms, now_ms)
        {
            return;
        }
        if instructions.interval_ms > 0 {
            self.adopt(Interval::from_ms(instructions.interval_ms), now_ms);
            self.interval_from_controller = true;
        }
        if let Some(rules) = instructions.rules.take() {
            if self.rules_version() != rules.version
                && let Some(bounds) = PlausibleBounds::from_rules(&rules)
            {
                self.bounds = bounds;
            }
            self.rules = Some(rules);
        }
        let count = self.order.len();
        let shares = instructions.buckets.iter().any(|b| b.share.is_some());
        let waiting: Option<Vec<u32>> =
            if instructions.from_rates_now && !self.relayed.moved_by(&instructions.buckets) {
                self.answers_to_waiting += 1;
                Some(
                    self.waiting
                        .keys()
                        .filter_map(|name| self.slots.get(name).copied())
                        .collect(),
                )
            } else {
                self.relayed.set(&instructions.buckets);
                None
            };
        let shared = Arc::new(instructions);
        for &slot in waiting.as_deref().unwrap_or(&self.order) {
            let (Some(host), name) = (
                self.hosts[slot as usize].as_mut(),
                self.names[slot as usize].as_str(),
            ) else {
                continue;
            };
            let held = !self.factors.is_empty() && self.factors.holds(name);
            let rules = self.rules.as_ref().filter(|rules| {
                host.rules_version != rules.version && host.sent_rules != rules.version
            });
            if !(shares || held || rules.is_some()) {
                send(name, shared.clone());
                continue;
            }
            let mut message = v1::Instructions::clone(&shared);
            host_shares(&mut message.buckets, &self.last_sums, &host.last, count);
            if held {
                hold_to_counted(&mut message.buckets, &self.factors, name, &host.last);
            }
            if let Some(rules) = rules {
                message.rules = Some(rules.clone());
                host.sent_rules = rules.version;
            }
            send(name, Arc::new(message));
        }
    }

    /// A new interval length: the open intervals meant something else, start afresh, after
    /// the last interval of this length already forwarded (a host ahead of the clock may have
    /// closed one the clock has not reached).
    fn adopt(&mut self, interval: Interval, now_ms: u64) {
        if interval != self.interval {
            self.interval = interval;
            let mut start = interval.sequence_at(now_ms).saturating_sub(1);
            if let Some((ms, sequence)) = self.last_forwarded
                && ms == interval.ms()
            {
                start = start.max(sequence);
            }
            self.window.reset(start);
        }
    }

    /// `sums` as a report's entries: numbered, when the zone numbers its buckets.
    fn wire(&mut self, sums: &Sums) -> Vec<v1::BucketCounts> {
        if self.numbered {
            self.ids.entries(sums)
        } else {
            sums.to_wire()
        }
    }

    fn forward(&mut self, sequence: u64, sums: Sums, reported: usize) -> v1::ZoneReport {
        let mut report = v1::ZoneReport {
            zone: self.zone.clone(),
            region: self.region.clone(),
            sequence,
            interval_ms: self.interval.ms(),
            buckets: self.wire(&sums),
            clients: u32::try_from(reported).unwrap_or(u32::MAX),
            hosts: Vec::new(),
            gone: Vec::new(),
            surge: false,
            bucket_ids: self.numbered,
        };
        self.last_sums = sums;
        self.last_forwarded = Some((self.interval.ms(), sequence));
        if let Some(mut told) = self.told.take() {
            for (name, host) in self.named_hosts() {
                if told.get(name) != Some(&host.rules_version) {
                    report.hosts.push(v1::HostStatus {
                        host_id: name.to_owned(),
                        rules_version: host.rules_version,
                    });
                    told.insert(name.to_owned(), host.rules_version);
                }
            }
            let mut gone: Vec<String> = if told.len() > self.order.len() {
                told.keys()
                    .filter(|h| self.host(h).is_none())
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            };
            gone.sort();
            for h in &gone {
                told.remove(h);
            }
            report.gone = gone;
            self.forwarded += 1;
            self.told = Some(told);
        }
        report
    }
}

/// Raises the drop ratios of a host clamped against its peers so it admits what the controller
/// planned for the load it was counted at ([`Factors::hold`]). Adaptive shares already follow
/// what was counted ([`host_shares`] splits by counted load). A raised ratio is split per tier
/// by the host's own last counts, since it is the host's alone.
fn hold_to_counted(
    buckets: &mut [v1::BucketInstruction],
    factors: &Factors,
    host: &str,
    host_last: &Sums,
) {
    for b in buckets.iter_mut().filter(|b| b.share.is_none()) {
        let key = BucketKey::new(&b.service, &b.bucket);
        let ratio = Ratio::from_raw(b.drop_ratio).as_f64();
        let held = factors.hold(host, &key, ratio);
        if held > ratio {
            b.drop_ratio = Ratio::from_f64(held).raw();
            b.tier_drop_ratio = tier_drop_ratios(held, &host_last.counts(&key));
        }
    }
}

/// Splits the zone's adaptive-token-bucket shares among its hosts, in place: each host gets the
/// zone's share times its part of the zone's offered load in the last closed interval (an equal
/// part of `hosts` when the zone offered nothing). Drop ratios pass through unchanged.
///
/// A zone holding 0.5 of a global bucket, whose 400 req/s came 300 from host A and 100 from host
/// B, gives A a share of 0.375 and B 0.125.
pub fn host_shares(
    buckets: &mut [v1::BucketInstruction],
    zone_last: &Sums,
    host_last: &Sums,
    hosts: usize,
) {
    let hosts = hosts.max(1) as f64;
    for b in buckets {
        if let Some(zone_share) = b.share {
            let key = BucketKey::new(&b.service, &b.bucket);
            let zone_share = Ratio::from_raw(zone_share).as_f64();
            let zone_offered = zone_last.offered(&key) as f64;
            let share = if zone_offered > 0.0 {
                zone_share * host_last.offered(&key) as f64 / zone_offered
            } else {
                zone_share / hosts
            };
            b.share = Some(Ratio::from_f64(share).raw());
        }
    }
}

/// In the zone's sums `estimate`, one host's counts `was` of `key` replaced by `now` (the host
/// count and tiers are the caller's to mend).
fn replace_counts<'a>(
    estimate: &'a mut Sums,
    key: &BucketKey,
    was: Counts,
    now: Counts,
) -> &'a mut Counts {
    let entry = estimate.0.entry(key.clone()).or_default();
    // Before `offered` changes: a count that does not say counts each unit as one arrival.
    entry.offered_squares = (entry.squares() + now.squares()).saturating_sub(was.squares());
    entry.offered = (entry.offered + now.offered).saturating_sub(was.offered);
    entry.allowed = (entry.allowed + now.allowed).saturating_sub(was.allowed);
    entry.offered_tail = (entry.offered_tail + now.offered_tail).saturating_sub(was.offered_tail);
    entry
}

#[cfg(test)]
mod tests;
