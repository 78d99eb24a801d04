//! Answers that do not wait for the peers: a surge its own zones report (instructions from their
//! rates now, [`SURGE_WAIT`] after the first estimate) and a global bucket whose load in this
//! region rises clearly (instructions from an estimate of the peers' sums, [`PROVISIONAL_RISE`]).

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
        let peers = self.peer_sums(sequence + 1, now_ms, ttl, &rises, &own);
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
    pub(super) fn estimate_missing(&mut self, sequence: u64, parts: &mut Parts) {
        for (&member, zone) in self.zones.iter_mut().filter(|(_, z)| !z.name.is_empty()) {
            match parts.get(&member) {
                Some((_, sums)) => zone.last = Some((sequence, sums.clone())),
                None => {
                    if let Some((last, sums)) = &zone.last
                        && last + 1 == sequence
                    {
                        parts.insert(member, (zone.name.clone(), sums.clone()));
                    }
                }
            }
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
    pub(super) fn provisional(
        &mut self,
        config: &Config,
        sequence: u64,
        zone_sums: &ZoneSums,
        before: &ZoneSums,
        now_ms: u64,
        interval: Interval,
    ) -> Option<PerZone> {
        let rises = rising(&self.table, zone_sums, before, Some(Kind::DropRatio));
        if rises.is_empty() {
            return None;
        }
        let ttl = config.control.instruction_ttl;
        let own = self.own_global(zone_sums);
        let peers = self.peer_sums(sequence, now_ms, ttl, &rises, &own);
        let (per_zone, computed) = self.compute(zone_sums, &peers, interval, false);
        let raised = rises.iter().any(|&(i, _)| {
            let old = self.views[i as usize].map_or(0.0, |v| v.drop_ratio);
            computed[i as usize].is_some_and(|v| v.drop_ratio > old + PROVISIONAL_STEP)
        });
        raised.then_some(per_zone)
    }

    /// The peers' sums for interval `target`: each live peer's sums of it, or else the latest
    /// of its two before (the peer was late, or one of its messages was lost), scaled by
    /// `rises` per bucket (a rise this region's own zones saw since, by index in order); and
    /// for the peers silent
    /// longer, their last sums held as [`RegionCore::held`] says, given `own`, this region's
    /// global sums of `target`.
    pub(super) fn peer_sums(
        &self,
        target: u64,
        now_ms: u64,
        ttl: Duration,
        rises: &[(Index, f64)],
        own: &IndexedSums,
    ) -> IndexedSums {
        let mut peers = IndexedSums::default();
        let mut silent = Vec::new();
        for peer in self.peers.values() {
            let live = is_live(peer, now_ms, ttl);
            if let Some(sums) = peer.sums.get(&target).filter(|_| live) {
                peers.add(sums);
            } else if let Some((_, sums)) = peer
                .sums
                .range(target.saturating_sub(2)..target)
                .next_back()
                .filter(|_| live)
            {
                if rises.is_empty() {
                    peers.add(sums);
                } else {
                    let mut scaled = sums.clone();
                    scaled.for_each_mut(|index, counts| {
                        if let Ok(at) = rises.binary_search_by_key(&index, |&(i, _)| i) {
                            *counts = counts.scaled(rises[at].1);
                        }
                    });
                    peers.add(&scaled);
                }
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
