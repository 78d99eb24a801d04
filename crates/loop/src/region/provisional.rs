//! Answers that do not wait for the peers: a surge its own zones report (instructions from their
//! rates now, [`SURGE_WAIT`] after the first estimate) and a global bucket whose load in this
//! region rises clearly (instructions from an estimate of the peers' sums, [`PROVISIONAL_RISE`]).

use std::borrow::Cow;

use super::*;

impl RegionCore {
    /// Instructions from the zones' estimates of the open interval (their hosts' surge reports,
    /// `ZoneReport.surge`), [`SURGE_WAIT`] of an interval after the first came so the zones of
    /// a fleet-wide surge are in together: each zone's estimate, or its last interval where it
    /// sent none; each live peer's last sums, scaled by the median zone's rise as for
    /// [`RegionCore::provisional`]. They carry the hosts' rates now (`from_rates_now`), so a
    /// host whose guard holds it to its part of the limit gets a part that counts its burst:
    /// one host's burst that fits the scope's headroom is let go a few milliseconds after its
    /// guard engaged, where it was held until the interval's report had counted the burst.
    pub(super) fn answer_surges(
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
        // Per aggregator, then summed per zone: a zone's aggregators are each a part of it.
        let mut now = Parts::new();
        let mut was = Parts::new();
        for (&member, zone) in self.zones.iter().filter(|(_, z)| !z.name.is_empty()) {
            let last = zone.last.as_ref().filter(|(s, _)| *s == sequence);
            if let Some((_, sums)) = last {
                was.insert(member, (zone.name.clone(), sums.clone()));
            }
            match (&zone.surge, last) {
                (Some((_, sums)), _) | (None, Some((_, sums))) => {
                    now.insert(member, (zone.name.clone(), sums.clone()));
                }
                (None, None) => {}
            }
        }
        if now.is_empty() {
            return;
        }
        let (zone_sums, before) = (by_zone(&now), by_zone(&was));
        // The open interval's estimate: the peers' sums of the intervals before it, scaled.
        let rises = rising(&self.table, &zone_sums, &before, None);
        let ttl = config.control.instruction_ttl;
        let own = self.own_global(&zone_sums);
        let scale = Scale {
            rises: &rises,
            kind: None,
        };
        let peers = self.peer_sums(sequence + 1, now_ms, ttl, scale, &own);
        let (per_zone, _) = self.compute(&zone_sums, &peers, interval, false);
        self.provisional += 1;
        self.instruct(steps, sequence, per_zone, &now, now_ms, Sent::FromRatesNow);
    }

    /// Puts in `parts` (the aggregators' parts of interval `sequence`) the part of every
    /// aggregator that did not report it but did report the interval before, as its estimate,
    /// and keeps what the others reported for the next interval. A zone report lost or late
    /// would otherwise count the aggregator's whole load as gone for an interval: at 1.5x the
    /// limit over 9 zones the ratio fell from 1/3 to 0.24 and the fleet admitted 14% over its
    /// limit until the next interval. An aggregator silent for two intervals is left out, and
    /// so is one whose hosts (some of them) moved to another since its last part
    /// ([`RegionCore::on_zone_report`]): they count in the other's part now. An aggregator that
    /// is gone (its stream ended) stands in for nothing: its hosts report to another.
    ///
    /// A part that stands in is scaled by the rise the zones that reported saw since `before`
    /// ([`rising`]): a zone report lost in a step's interval otherwise counted that zone at its
    /// load before the step, and the instructions of the interval let a third of a 1.5x
    /// overload's excess through for a second.
    pub(super) fn estimate_missing(&mut self, sequence: u64, parts: &mut Parts, before: &ZoneSums) {
        for (&member, zone) in self.zones.iter_mut().filter(|(_, z)| !z.name.is_empty()) {
            if let Some((_, sums)) = parts.get(&member) {
                zone.last = Some((sequence, sums.clone()));
            }
        }
        // After the reported parts are kept: a part that stands in is no aggregator's last.
        if self.missing(parts).next().is_some() {
            let rises = rising(&self.table, &by_zone(parts), before, None);
            self.stand_in_missing(sequence, parts, &rises);
        }
    }

    /// Puts in `parts` (of interval `sequence`) the part of the interval before of every
    /// aggregator missing from them that has one, scaled by `rises`.
    fn stand_in_missing(&self, sequence: u64, parts: &mut Parts, rises: &[(Index, f64)]) {
        let stand_ins: Vec<(u64, String, Arc<IndexedSums>)> = self
            .missing(parts)
            .filter_map(|(&member, zone)| match &zone.last {
                Some((last, sums)) if last + 1 == sequence => {
                    Some((member, zone.name.clone(), scaled_by(sums, rises)))
                }
                _ => None,
            })
            .collect();
        for (member, name, sums) in stand_ins {
            parts.insert(member, (name, sums));
        }
    }

    /// The aggregators (with a zone) that have no part in `parts`.
    fn missing<'a>(&'a self, parts: &'a Parts) -> impl Iterator<Item = (&'a u64, &'a Zone)> {
        self.zones
            .iter()
            .filter(|(member, z)| !z.name.is_empty() && !parts.contains_key(member))
    }

    /// Provisional instructions for the open interval that ended a [`LATE_ZONE_WAIT`] ago when
    /// some zone has not reported it but those that did show a drop-ratio bucket's load rising
    /// clearly ([`PROVISIONAL_RISE`]): each missing zone's part of the interval before, and each
    /// peer's sums, scaled by that rise, as [`RegionCore::provisional`] does for the peers. An
    /// interval waits two graces for a lost zone report (500 ms at 1 s); a lost report of a
    /// step's interval left the step enforced up to half a second late, 6-11% over the limit in
    /// the second after the first. Once per interval.
    pub(super) fn instruct_without_late_zones(
        &mut self,
        config: &Config,
        steps: &mut Vec<RegionStep>,
        now_ms: u64,
        interval: Interval,
    ) {
        let sequence = self.window.closed_through() + 1;
        let wait = (interval.ms() / LATE_ZONE_WAIT).max(1);
        if self.early.is_some_and(|s| s >= sequence)
            || now_ms < interval.end_of(sequence).saturating_add(wait)
        {
            return;
        }
        let Some(reported) = self.window.pending_of(sequence) else {
            return;
        };
        if self.missing(reported).next().is_none() {
            return;
        }
        self.early = Some(sequence);
        let before = self.zones_before(sequence);
        let rises = rising(
            &self.table,
            &by_zone(reported),
            &before,
            Some(Kind::DropRatio),
        );
        if rises.is_empty() {
            return;
        }
        let mut parts = reported.clone();
        self.stand_in_missing(sequence, &mut parts, &rises);
        let zone_sums = by_zone(&parts);
        let ttl = config.control.instruction_ttl;
        let own = self.own_global(&zone_sums);
        let scale = Scale {
            rises: &rises,
            kind: Some(Kind::DropRatio),
        };
        let peers = self.peer_sums(sequence, now_ms, ttl, scale, &own);
        let (per_zone, computed) = self.compute(&zone_sums, &peers, interval, false);
        if self.raises(&rises, &computed) {
            self.provisional += 1;
            self.instruct(steps, sequence, per_zone, &parts, now_ms, Sent::Provisional);
        }
    }

    /// The zones' sums of the interval before `sequence`, by zone, as their aggregators
    /// reported them.
    pub(super) fn zones_before(&self, sequence: u64) -> ZoneSums {
        let parts: Parts = self
            .zones
            .iter()
            .filter_map(|(&member, z)| match &z.last {
                Some((last, sums)) if last + 1 == sequence && !z.name.is_empty() => {
                    Some((member, (z.name.clone(), sums.clone())))
                }
                _ => None,
            })
            .collect();
        by_zone(&parts)
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
    ///
    /// The rises are those [`RegionCore::record_rises`] kept for the interval.
    pub(super) fn provisional(
        &mut self,
        config: &Config,
        sequence: u64,
        zone_sums: &ZoneSums,
        now_ms: u64,
        interval: Interval,
    ) -> Option<PerZone> {
        let kind = Some(Kind::DropRatio);
        let rises: Vec<(Index, f64)> = self
            .rose
            .get(&sequence)
            .into_iter()
            .flatten()
            .filter(|&&(i, _)| kind == Some(self.table.spec(i).kind))
            .copied()
            .collect();
        if rises.is_empty() {
            return None;
        }
        let ttl = config.control.instruction_ttl;
        let own = self.own_global(zone_sums);
        let scale = Scale {
            rises: &rises,
            kind,
        };
        let peers = self.peer_sums(sequence, now_ms, ttl, scale, &own);
        let (per_zone, computed) = self.compute(zone_sums, &peers, interval, false);
        self.raises(&rises, &computed).then_some(per_zone)
    }

    /// Whether `computed` raises the ratio of some bucket of `rises` by more than
    /// [`PROVISIONAL_STEP`] over the one in force: what an estimate must do to go out.
    fn raises(&self, rises: &[(Index, f64)], computed: &[Option<BucketView>]) -> bool {
        rises.iter().any(|&(i, _)| {
            let old = self.views[i as usize].map_or(0.0, |v| v.drop_ratio);
            computed[i as usize].is_some_and(|v| v.drop_ratio > old + PROVISIONAL_STEP)
        })
    }

    /// Keeps, for interval `sequence` as it closes with `zone_sums`, the global buckets whose
    /// median zone's load rose clearly since `before` ([`rising`]), while the region has peers
    /// (a region alone never scales a peer's sums): the intervals a late peer's sums may be
    /// from are the two before the one estimated.
    pub(super) fn record_rises(&mut self, sequence: u64, zone_sums: &ZoneSums, before: &ZoneSums) {
        if self.peers.is_empty() || self.table.global().is_empty() {
            self.rose.clear();
            return;
        }
        let rises = rising(&self.table, zone_sums, before, None);
        self.rose.insert(sequence, rises);
        while self.rose.len() > 3 {
            self.rose.pop_first();
        }
    }

    /// The peers' sums for interval `target`: each live peer's sums of it, or else the latest
    /// of its two before (the peer was late, or one of its messages was lost), scaled by the
    /// rises since ([`Scale`]); and for the peers silent longer, their last sums held as
    /// [`RegionCore::held`] says, given `own`, this region's global sums of `target`.
    pub(super) fn peer_sums(
        &self,
        target: u64,
        now_ms: u64,
        ttl: Duration,
        scale: Scale<'_>,
        own: &IndexedSums,
    ) -> IndexedSums {
        let mut peers = IndexedSums::default();
        let mut silent = Vec::new();
        for peer in self.peers.values() {
            let live = is_live(peer, now_ms, ttl);
            if let Some(sums) = peer.sums.get(&target).filter(|_| live) {
                peers.add(sums);
            } else if let Some((&at, sums)) = peer
                .sums
                .range(target.saturating_sub(2)..target)
                .next_back()
                .filter(|_| live)
            {
                peers.add(&self.scaled(sums, at, target, scale));
            } else if peer
                .sums
                .last_key_value()
                .is_some_and(|(&last, _)| last < target && last + PARTITION_HOLD >= target)
            {
                silent.push(peer);
            }
        }
        let held = self.held(&silent, own, &peers);
        peers.add(&held);
        peers
    }

    /// A peer's `sums` of interval `at` as an estimate of its sums of `target`: each bucket of
    /// `scale`'s kind times its rise into `target` and the rise this region's zones saw into
    /// each closed interval between ([`RegionCore::record_rises`]). A peer late with the
    /// interval of a step sends, meanwhile, only its sums of the one before: scaled by the rise
    /// into the open interval alone, a 15x step's peers counted about half their load and a
    /// region's answers to its zones' surge reports dropped 0.90 where 0.93 was due. Unscaled,
    /// a peer whose sums of the interval before a step were lost (so the step's interval does
    /// not wait for it) counted at its load before the step: the step's instructions dropped
    /// 0.90 for a second where 0.93 was due, 10% over the limit.
    fn scaled<'s>(
        &self,
        sums: &'s IndexedSums,
        at: u64,
        target: u64,
        scale: Scale<'_>,
    ) -> Cow<'s, IndexedSums> {
        let between: Vec<&[(Index, f64)]> = self
            .rose
            .range(at + 1..target)
            .map(|(_, rises)| &rises[..])
            .collect();
        if scale.rises.is_empty() && between.iter().all(|r| r.is_empty()) {
            return Cow::Borrowed(sums);
        }
        let mut scaled = sums.clone();
        scaled.for_each_mut(|index, counts| {
            if scale.kind.is_some_and(|k| self.table.spec(index).kind != k) {
                return;
            }
            let mut factor = rise_of(scale.rises, index);
            for rises in &between {
                factor *= rise_of(rises, index);
            }
            if factor != 1.0 {
                *counts = counts.scaled(factor);
            }
        });
        Cow::Owned(scaled)
    }
}

/// How [`RegionCore::peer_sums`] scales a late peer's older sums up to the interval it estimates.
#[derive(Debug, Clone, Copy)]
pub(super) struct Scale<'a> {
    /// The rise into that interval per global bucket, by index in order: for a closed interval,
    /// the one [`RegionCore::record_rises`] kept; for the open one, from the zones' estimates.
    pub rises: &'a [(Index, f64)],
    /// Only the buckets of this algorithm are scaled (all when `None`).
    pub kind: Option<Kind>,
}

/// How long after the first zone estimate of a surge the controller answers, in fractions of
/// the interval: a hundredth (10 ms at 1 s), so the zones of a fleet-wide surge, whose guards
/// engage at the same tick, are in together.
pub const SURGE_WAIT: u64 = 100;

/// How long after an interval's end, in fractions of the interval, a controller missing a
/// zone's report of it instructs without it when the others show a clear rise
/// ([`RegionCore::instruct_without_late_zones`]): a fiftieth (20 ms at 1 s), twice the 10 ms an
/// aggregator of many hosts waits for its own last reports. Later, the step's first 100 ms
/// sample is mostly unenforced: at a fifth of it, a 1.5x overload's sample admits 10% over.
pub const LATE_ZONE_WAIT: u64 = 50;

/// `sums` with each bucket of `rises` (by index, in order) scaled by its rise; shared as they
/// are when nothing rose.
fn scaled_by(sums: &Arc<IndexedSums>, rises: &[(Index, f64)]) -> Arc<IndexedSums> {
    if rises.is_empty() {
        return sums.clone();
    }
    let mut scaled = IndexedSums::clone(sums);
    scaled.for_each_mut(|index, counts| {
        let rise = rise_of(rises, index);
        if rise != 1.0 {
            *counts = counts.scaled(rise);
        }
    });
    Arc::new(scaled)
}

/// Bucket `index`'s rise in `rises` (by index, in order); 1 when it did not rise.
fn rise_of(rises: &[(Index, f64)], index: Index) -> f64 {
    rises
        .binary_search_by_key(&index, |&(i, _)| i)
        .map_or(1.0, |at| rises[at].1)
}

/// How much this region's load of a global bucket must have risen, in its median zone, before
/// the controller instructs from an estimate of the peers' sums ([`RegionCore::provisional`]):
/// 1.25 times, as for an interval's tail ([`crate::sums::TAIL_RISE`]).
pub const PROVISIONAL_RISE: f64 = 1.25;

/// And by how much the estimate must raise the bucket's ratio: 0.02.
pub const PROVISIONAL_STEP: f64 = 0.02;

/// Zones whose previous interval offered fewer requests of a bucket than this say nothing
/// about its rise.
pub(super) const RISE_MIN_REQUESTS: u64 = 10;

/// Per global bucket of `table` (of algorithm `kind` only, when given), the median zone's rise
/// from `before` to `now` ([`median_rise`]), when it is at least [`PROVISIONAL_RISE`]; by
/// index, in order.
pub(super) fn rising(
    table: &Table,
    now: &ZoneSums,
    before: &ZoneSums,
    kind: Option<Kind>,
) -> Vec<(Index, f64)> {
    table
        .global()
        .iter()
        .filter(|&&i| kind.is_none_or(|k| table.spec(i).kind == k))
        .filter_map(|&i| {
            let rise = median_rise(i, now, before)?;
            (rise >= PROVISIONAL_RISE).then_some((i, rise))
        })
        .collect()
}

/// The median over the zones of `now` that also reported `before` of how much one bucket's load
/// rose (`offered_for_rise` now over `offered` before); `None` when no zone had enough load
/// before to tell ([`RISE_MIN_REQUESTS`]).
pub(super) fn median_rise(index: Index, now: &ZoneSums, before: &ZoneSums) -> Option<f64> {
    let mut rises: Vec<f64> = now
        .iter()
        .filter_map(|(zone, sums)| {
            let was = before.get(zone)?.offered(index);
            (was >= RISE_MIN_REQUESTS)
                .then(|| sums.counts(index).offered_for_rise() as f64 / was as f64)
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
