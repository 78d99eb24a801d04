//! Per-bucket counts and their sums: what aggregators and controllers add up every interval,
//! and the sans-IO bookkeeping of which intervals are still open ([`Intervals`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;

use spillway_core::criticality::{Criticality, TIERS};
use spillway_proto::v1;

/// A bucket by its configuration names; stable across reloads that keep the bucket.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey {
    pub service: String,
    pub bucket: String,
}

impl BucketKey {
    pub fn new(service: impl Into<String>, bucket: impl Into<String>) -> Self {
        Self {
            service: service.into(),
            bucket: bucket.into(),
        }
    }
}

/// Counts of one bucket over one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Everything that arrived, dropped or not.
    pub offered: u64,
    /// The part of `offered` that arrived in the interval's last quarter ([`TAIL_PARTS`]).
    pub offered_tail: u64,
    pub allowed: u64,
    pub shadow_dropped: u64,
    /// Hosts whose counts are summed here that offered load to the bucket.
    pub hosts: u64,
    /// `offered` per criticality tier, in [`Criticality::ALL`] order, summing to `offered`
    /// ([`Counts::fit_tiers`]); all zero when it is all the default tier.
    pub tiers: [u64; TIERS],
}

/// The tail is the last `1 / TAIL_PARTS` of an interval: 250 ms of a 1 s interval.
pub const TAIL_PARTS: u64 = 4;

/// How much higher than the interval's offered load the tail's rate must be before a drop ratio
/// is computed from the tail: 1.25 times. A rise smaller than that is left to the next interval,
/// which sees it whole.
pub const TAIL_RISE: f64 = 1.25;

/// How far above a steady load's counting noise the tail's rate must also be, in standard
/// deviations. At a steady rate the tail's count `t` and the rest `n - t` are independent Poisson
/// counts, so `4t - n` has mean 0 and variance `9n/4 + 3n/4 = 3n`; three deviations
/// (`3 sqrt(3n)`) are passed by chance about once in 740 intervals, and then the ratio
/// overshoots and is released by the smoother within a few intervals: an average bias of about
/// 0.001 in the ratio. Below about 430 requests per interval this is the stricter test: at 100
/// requests a tail needs 4t over 152.
pub const TAIL_NOISE_SIGMAS: f64 = 3.0;

impl Counts {
    /// What each tier offered, in [`Criticality::ALL`] order: `tiers`, or all of `offered` in
    /// the default tier when no tier was counted.
    pub fn tier_offered(&self) -> [u64; TIERS] {
        if self.tiers.iter().all(|&n| n == 0) {
            let mut tiers = [0; TIERS];
            tiers[Criticality::default().index()] = self.offered;
            tiers
        } else {
            self.tiers
        }
    }

    /// Scales the tiers to sum to `offered`, keeping their proportions (the default tier takes
    /// what rounding leaves): after a clamp lowered `offered`, or for tiers as a sender wrote
    /// them, whose total may be anything. A sender's tiers thus say how its load divides, never
    /// how large it is.
    pub fn fit_tiers(&mut self) {
        let total: u128 = self.tiers.iter().map(|&n| u128::from(n)).sum();
        if total == 0 || total == u128::from(self.offered) {
            return;
        }
        let offered = u128::from(self.offered);
        let mut fitted = [0u64; TIERS];
        for (f, &n) in fitted.iter_mut().zip(&self.tiers) {
            *f = u64::try_from(u128::from(n) * offered / total).unwrap_or(u64::MAX);
        }
        let rest = self.offered.saturating_sub(fitted.iter().sum());
        fitted[Criticality::default().index()] += rest;
        self.tiers = fitted;
    }

    /// The offered load to compute a drop ratio from, in requests per interval: the interval's
    /// offered count, or [`TAIL_PARTS`] times its tail when that is clearly higher (a surge
    /// that started within the interval), by more than [`TAIL_RISE`] times and more than
    /// [`TAIL_NOISE_SIGMAS`] deviations of a steady load's noise.
    ///
    /// Worked example: 1 s intervals, 22,000 req/s until 0.4 s, then 330,000 req/s. The interval
    /// offers 8,800 + 198,000 = 206,800, a drop ratio of 0.894 against a limit of 22,000/s; its
    /// tail holds 82,500, four times that is 330,000, over 1.25 x 206,800, and the ratio sent
    /// is the whole surge's 14/15 at once. A load that falls within an interval has a low tail,
    /// so falls always go by the interval's own count.
    pub fn offered_for_rise(&self) -> u64 {
        let offered = self.offered as f64;
        let rise = self.offered_tail.saturating_mul(TAIL_PARTS);
        let clear = (TAIL_RISE * offered).max(offered + TAIL_NOISE_SIGMAS * (3.0 * offered).sqrt());
        if rise as f64 > clear {
            rise
        } else {
            self.offered
        }
    }
}

impl Counts {
    /// One bucket's counts as they came over the wire.
    pub fn from_wire(b: &v1::BucketCounts) -> Counts {
        let mut counts = Counts {
            offered: b.offered,
            // Unknown: a quarter of the interval, as a steady load would have it.
            offered_tail: b.offered_tail.unwrap_or(b.offered / TAIL_PARTS),
            allowed: b.allowed,
            shadow_dropped: b.shadow_dropped,
            // A host's own report: one host, when it offered anything.
            hosts: b.hosts.unwrap_or(u64::from(b.offered > 0)),
            // Anything but four values says nothing about tiers: all the default tier.
            tiers: <[u64; TIERS]>::try_from(b.tier_offered.as_slice()).unwrap_or_default(),
        };
        counts.fit_tiers();
        counts
    }

    /// These counts times `factor` (rounded), hosts unchanged: one interval's counts standing
    /// in for a later one whose load is `factor` times as high.
    pub fn scaled(self, factor: f64) -> Counts {
        let scale = |n: u64| (n as f64 * factor.max(0.0)).round() as u64;
        let mut scaled = Counts {
            offered: scale(self.offered),
            offered_tail: scale(self.offered_tail),
            allowed: scale(self.allowed),
            shadow_dropped: scale(self.shadow_dropped),
            hosts: self.hosts,
            tiers: self.tiers.map(scale),
        };
        scaled.fit_tiers();
        scaled
    }
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Counts) {
        // Sums of counts with and without tiers: the latter are all the default tier.
        if self.tiers != [0; TIERS] || other.tiers != [0; TIERS] {
            let (mine, theirs) = (self.tier_offered(), other.tier_offered());
            for (t, (a, b)) in self.tiers.iter_mut().zip(mine.iter().zip(theirs)) {
                *t = a.saturating_add(b);
            }
        }
        self.offered = self.offered.saturating_add(other.offered);
        self.offered_tail = self.offered_tail.saturating_add(other.offered_tail);
        self.allowed = self.allowed.saturating_add(other.allowed);
        self.shadow_dropped = self.shadow_dropped.saturating_add(other.shadow_dropped);
        self.hosts = self.hosts.saturating_add(other.hosts);
    }
}

/// Counts per bucket: a host's, a zone's or a region's, for one interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sums(pub HashMap<BucketKey, Counts>);

impl Sums {
    /// Adds another sum into this one.
    pub fn add(&mut self, other: &Sums) {
        for (key, counts) in &other.0 {
            *self.0.entry(key.clone()).or_default() += *counts;
        }
    }

    /// Adds counts as they came over the wire.
    pub fn add_wire(&mut self, buckets: &[v1::BucketCounts]) {
        for b in buckets {
            *self
                .0
                .entry(BucketKey::new(&b.service, &b.bucket))
                .or_default() += Counts::from_wire(b);
        }
    }

    pub fn from_wire(buckets: &[v1::BucketCounts]) -> Self {
        let mut sums = Sums::default();
        sums.add_wire(buckets);
        sums
    }

    /// The counts for the wire, sorted by bucket so equal sums encode equally.
    pub fn to_wire(&self) -> Vec<v1::BucketCounts> {
        let mut keys: Vec<&BucketKey> = self.0.keys().collect();
        keys.sort();
        keys.into_iter()
            .map(|key| counts_to_wire(key.service.clone(), key.bucket.clone(), &self.0[key], 0))
            .collect()
    }

    /// Offered requests of one bucket (0 when it saw none).
    pub fn offered(&self, key: &BucketKey) -> u64 {
        self.0.get(key).map_or(0, |c| c.offered)
    }

    /// The counts of one bucket (zeros when it saw none).
    pub fn counts(&self, key: &BucketKey) -> Counts {
        self.0.get(key).copied().unwrap_or_default()
    }
}

/// One bucket's counts as a wire entry, with its names (empty: by its number `id` alone).
pub(crate) fn counts_to_wire(
    service: String,
    bucket: String,
    c: &Counts,
    id: u32,
) -> v1::BucketCounts {
    v1::BucketCounts {
        service,
        bucket,
        offered: c.offered,
        allowed: c.allowed,
        shadow_dropped: c.shadow_dropped,
        offered_tail: Some(c.offered_tail),
        hosts: Some(c.hosts),
        tier_offered: tiers_to_wire(c),
        id,
    }
}

/// A count's tiers for the wire: none when all of it is the default tier.
pub fn tiers_to_wire(c: &Counts) -> Vec<u64> {
    let tiers = c.tier_offered();
    let default = Criticality::default().index();
    if tiers
        .iter()
        .enumerate()
        .all(|(i, &n)| i == default || n == 0)
    {
        Vec::new()
    } else {
        tiers.to_vec()
    }
}

/// How far past the last closed interval a report may be: 16 intervals. In normal operation a
/// report is one or two ahead (the interval that just ended, while the one before waits out its
/// grace); a sequence further ahead comes from a broken or hostile sender, and accepting it would
/// hold an open interval (and its memory) that nothing ever closes.
pub const MAX_AHEAD: u64 = 16;

/// When an interval may close before every member reported it: `wait_ms` after its end, with at
/// most `missing` members silent. [`Quorum::ALL`] never closes early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quorum {
    pub wait_ms: u64,
    pub missing: usize,
}

impl Quorum {
    /// Every member, or the full wait.
    pub const ALL: Quorum = Quorum {
        wait_ms: u64::MAX,
        missing: 0,
    };
}

/// Open intervals and what has arrived for each, from a set of members (an aggregator's hosts, a
/// controller's zones): the rule both tiers use to decide when an interval is closed.
///
/// An interval closes when every member has reported it, or `wait` milliseconds after its end,
/// whichever comes first; intervals close in order, and a report for a closed interval is late.
/// With 1 s intervals and a 250 ms wait, interval 7 (7.000 s to 8.000 s) closes the moment its
/// last member reports, and at 8.250 s at the latest. Time is passed in (Unix or simulated
/// milliseconds), so the servers and the simulator run the same code.
#[derive(Debug, Clone)]
pub struct Intervals<K, P> {
    pending: BTreeMap<u64, (P, HashSet<K>)>,
    closed_through: u64,
}

impl<K: Eq + Hash, P: Default> Intervals<K, P> {
    /// Nothing open; intervals up to `closed_through` count as closed.
    pub fn new(closed_through: u64) -> Self {
        Self {
            pending: BTreeMap::new(),
            closed_through,
        }
    }

    /// Forgets every open interval and starts afresh after `closed_through` (the interval length
    /// changed, so sequence numbers mean something else now).
    pub fn reset(&mut self, closed_through: u64) {
        self.pending.clear();
        self.closed_through = closed_through;
    }

    /// The last closed interval.
    pub fn closed_through(&self) -> u64 {
        self.closed_through
    }

    /// How many intervals are open (at most [`MAX_AHEAD`] plus the one the clock says ended).
    pub fn open(&self) -> usize {
        self.pending.len()
    }

    /// The payloads of the open intervals, oldest first.
    pub fn pending(&self) -> impl Iterator<Item = &P> {
        self.pending.values().map(|(payload, _)| payload)
    }

    /// The payloads of the open intervals, to change in place (a new rules table renumbered
    /// what they hold).
    pub fn pending_mut(&mut self) -> impl Iterator<Item = &mut P> {
        self.pending.values_mut().map(|(payload, _)| payload)
    }

    /// The payload of interval `sequence` for `member` to add into, or `None` when the interval
    /// is already closed (the report is late) or more than [`MAX_AHEAD`] past the last closed one
    /// (the report is bogus).
    pub fn accept(&mut self, sequence: u64, member: K) -> Option<&mut P> {
        if sequence <= self.closed_through
            || sequence > self.closed_through.saturating_add(MAX_AHEAD)
        {
            return None;
        }
        let (payload, reported) = self.pending.entry(sequence).or_default();
        reported.insert(member);
        Some(payload)
    }

    /// Closes, in order, every interval that every one of `members` reported (when there is at
    /// least one member) or whose wait has passed at `now_ms`, and returns each with its payload
    /// and how many members reported it. An interval nobody reported is still closed (empty)
    /// once its wait passed, so the tier above keeps hearing from this one.
    pub fn close_ready<'a>(
        &mut self,
        now_ms: u64,
        interval: crate::interval::Interval,
        wait_ms: u64,
        members: impl Iterator<Item = &'a K> + Clone,
    ) -> Vec<(u64, P, usize)>
    where
        K: 'a,
    {
        self.close_ready_quorum(now_ms, interval, wait_ms, members, Quorum::ALL)
    }

    /// [`Intervals::close_ready`], where an interval also closes once `quorum.wait_ms` past its
    /// end when at most `quorum.missing` of `members` have not reported it.
    pub fn close_ready_quorum<'a>(
        &mut self,
        now_ms: u64,
        interval: crate::interval::Interval,
        wait_ms: u64,
        members: impl Iterator<Item = &'a K> + Clone,
        quorum: Quorum,
    ) -> Vec<(u64, P, usize)>
    where
        K: 'a,
    {
        let ended = interval
            .sequence_at(now_ms.saturating_sub(wait_ms))
            .saturating_sub(1);
        if ended > self.closed_through && !self.pending.contains_key(&ended) {
            self.pending.insert(ended, Default::default());
        }
        let mut closed = Vec::new();
        while let Some((&sequence, (_, reported))) = self.pending.first_key_value() {
            // Saturating: a host may claim an interval that ends past the end of time.
            let end = interval.end_of(sequence);
            let overdue = now_ms >= end.saturating_add(wait_ms);
            let past_quorum_wait = now_ms >= end.saturating_add(quorum.wait_ms);
            // Before its wait, an interval fewer members reported than could close it stays
            // open without a look at who they were: at least `members - reported` are missing.
            // An aggregator of 10,000 hosts polls every 10 ms, and looking up every host's name
            // each time was most of its work (and of the simulator's at 100,000 hosts).
            if !overdue
                && let (least, Some(most)) = members.size_hint()
                && least == most
            {
                let fewest_missing = most.saturating_sub(reported.len());
                let allowed = if past_quorum_wait { quorum.missing } else { 0 };
                if fewest_missing > allowed {
                    break;
                }
            }
            let (count, missing) = members.clone().fold((0usize, 0usize), |(n, m), k| {
                (n + 1, m + usize::from(!reported.contains(k)))
            });
            let complete = count > 0 && missing == 0;
            let quorate = count > 0 && missing <= quorum.missing && past_quorum_wait;
            if !(complete || overdue || quorate) {
                break;
            }
            let Some((sequence, (payload, reported))) = self.pending.pop_first() else {
                break;
            };
            self.closed_through = sequence;
            closed.push((sequence, payload, reported.len()));
        }
        closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_add_per_bucket_and_survive_the_wire() {
        let a = BucketKey::new("api", "a");
        let b = BucketKey::new("api", "b");
        let mut zone = Sums::default();
        let host = |key: &BucketKey, offered| {
            Sums(HashMap::from([(
                key.clone(),
                Counts {
                    offered,
                    offered_tail: offered / 4,
                    allowed: offered / 2,
                    shadow_dropped: 1,
                    hosts: 1,
                    tiers: [0; TIERS],
                },
            )]))
        };
        zone.add(&host(&a, 100));
        zone.add(&host(&a, 50));
        zone.add(&host(&b, 7));
        assert_eq!(zone.offered(&a), 150);
        assert_eq!(zone.0[&a].allowed, 75);
        assert_eq!(zone.0[&a].shadow_dropped, 2);
        assert_eq!(zone.offered(&BucketKey::new("api", "c")), 0);
        assert_eq!(zone.0[&a].offered_tail, 37);
        assert_eq!(zone.0[&a].hosts, 2, "two hosts offered load to a");
        assert_eq!(Sums::from_wire(&zone.to_wire()), zone);
    }

    #[test]
    fn an_unknown_tail_counts_as_a_steady_load() {
        let wire = |offered, offered_tail| v1::BucketCounts {
            service: "api".into(),
            bucket: "a".into(),
            offered,
            offered_tail,
            ..Default::default()
        };
        // An older client that sends no tail, and a newer one whose load stopped before its tail.
        let sums = Sums::from_wire(&[wire(400, None), wire(100, Some(0))]);
        let counts = sums.counts(&BucketKey::new("api", "a"));
        assert_eq!(counts.offered, 500);
        assert_eq!(counts.offered_tail, 100);
        // Each host's own report counts the host once; a zone's sum says how many it holds.
        assert_eq!(counts.hosts, 2);
        let zone = Sums::from_wire(&sums.to_wire());
        assert_eq!(zone.counts(&BucketKey::new("api", "a")).hosts, 2);
        assert_eq!(counts.offered_for_rise(), 500);
    }

    fn counts(offered: u64, offered_tail: u64) -> Counts {
        Counts {
            offered,
            offered_tail,
            ..Counts::default()
        }
    }

    #[test]
    fn a_surge_within_the_interval_is_taken_from_its_tail() {
        // 22,000/s until 0.4 s, then 330,000/s: the tail shows the whole surge.
        assert_eq!(counts(206_800, 82_500).offered_for_rise(), 330_000);
        // A surge late in the tail still shows more than the interval's count.
        assert_eq!(counts(30_000, 25_000).offered_for_rise(), 100_000);
        // A load falling within the interval goes by the interval's own count.
        assert_eq!(counts(200_000, 10_000).offered_for_rise(), 200_000);
    }

    #[test]
    fn the_tail_must_be_over_a_quarter_by_more_than_the_ratio_and_the_noise() {
        // Large counts: the 1.25 ratio decides. 4 x 3,124 = 12,496 is not over 12,500.
        assert_eq!(counts(10_000, 3_124).offered_for_rise(), 10_000);
        assert_eq!(counts(10_000, 3_126).offered_for_rise(), 12_504);
        // Small counts: the noise decides. 3 sqrt(300) = 52.0, so 100 needs a tail over 38.0
        // (4t over 152.0), though 1.25 x 100 is only 125.
        assert_eq!(counts(100, 37).offered_for_rise(), 100);
        assert_eq!(counts(100, 38).offered_for_rise(), 152);
        // Nothing offered, or nothing in the tail.
        assert_eq!(counts(0, 0).offered_for_rise(), 0);
        assert_eq!(counts(500, 0).offered_for_rise(), 500);
    }

    #[test]
    fn a_steady_poisson_load_rarely_passes_for_a_surge() {
        // Steady loads of 50 to 50,000 requests per interval, each arrival in the tail with
        // chance 1/4 (a Poisson process split in time): 4,000 intervals each, with a fixed seed.
        let mut rng = fastrand::Rng::with_seed(7);
        for offered in [50u64, 200, 1_000, 5_000, 50_000] {
            let mut passed = 0;
            for _ in 0..4_000 {
                // A binomial draw by its normal approximation, exact enough at these counts.
                let mean = offered as f64 / 4.0;
                let sd = (offered as f64 * 3.0 / 16.0).sqrt();
                let z = normal(&mut rng);
                let tail = (mean + sd * z).round().clamp(0.0, offered as f64) as u64;
                if counts(offered, tail).offered_for_rise() != offered {
                    passed += 1;
                }
            }
            // About 5 expected at three deviations; far fewer where the 1.25 ratio decides.
            assert!(
                passed <= 16,
                "{passed} of 4,000 steady intervals of {offered}"
            );
        }
    }

    /// A standard normal draw (Box-Muller).
    fn normal(rng: &mut fastrand::Rng) -> f64 {
        let u = rng.f64().max(f64::MIN_POSITIVE);
        let v = rng.f64();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    #[test]
    fn an_interval_closes_when_complete_or_overdue_and_late_reports_are_refused() {
        let interval = crate::interval::Interval::from_ms(1000);
        let members = ["a", "b"];
        let mut open: Intervals<&str, u64> = Intervals::new(6);
        *open.accept(7, "a").unwrap() += 10;
        // Interval 7 ends at 8,000 ms: at 8,100 only "a" reported and the wait runs to 8,250.
        assert!(
            open.close_ready(8_100, interval, 250, members.iter())
                .is_empty()
        );
        *open.accept(7, "b").unwrap() += 5;
        assert_eq!(
            open.close_ready(8_100, interval, 250, members.iter()),
            vec![(7, 15, 2)]
        );
        assert!(open.accept(7, "a").is_none(), "7 is closed");
        // Only "a" reports 8; it closes at 9,250 without "b".
        *open.accept(8, "a").unwrap() += 1;
        assert!(
            open.close_ready(9_249, interval, 250, members.iter())
                .is_empty()
        );
        assert_eq!(
            open.close_ready(9_250, interval, 250, members.iter()),
            vec![(8, 1, 1)]
        );
        // Nobody reported 9: it still closes, empty, once its wait passed.
        assert_eq!(
            open.close_ready(10_300, interval, 250, members.iter()),
            vec![(9, 0, 0)]
        );
        assert_eq!(open.closed_through(), 9);
        // A sequence far ahead is refused rather than held open forever.
        assert!(open.accept(9 + MAX_AHEAD + 1, "a").is_none());
        assert!(open.accept(u64::MAX, "a").is_none());
        assert!(open.accept(9 + MAX_AHEAD, "a").is_some());
    }

    #[test]
    fn an_interval_that_ends_past_the_end_of_time_waits_without_overflow() {
        // Sequence numbers near the end of u64, as a broken or hostile host may claim once the
        // window stands there: the interval's end saturates at u64::MAX ms, and its wait with it.
        let interval = crate::interval::Interval::from_ms(1_000);
        let last = u64::MAX - 20;
        let mut open: Intervals<&str, u64> = Intervals::new(last);
        *open.accept(last + 1, "a").unwrap() += 1;
        let (members, now, wait) = (["a", "b"], 1_800_000_000_000, interval.grace_ms());
        // Not overdue (it never is), and "b" has not reported it yet.
        assert!(
            open.close_ready(now, interval, wait, members.iter())
                .is_empty()
        );
        *open.accept(last + 1, "b").unwrap() += 1;
        assert_eq!(
            open.close_ready(now, interval, wait, members.iter()),
            vec![(last + 1, 2, 2)]
        );
    }
}
