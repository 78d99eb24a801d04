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
    /// The sum of the squares of the costs counted in `offered`, for a bucket counted in units
    /// of a cost (a token budget's tokens); under `offered` (0 included) it is read as
    /// `offered`, each unit one arrival ([`Counts::squares`]).
    pub offered_squares: u64,
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
/// requests a tail needs 4t over 152. For a sum of costs (a token budget's tokens) the variance
/// is `3 sum c^2` ([`Counts::squares`]) and the same three deviations apply.
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

    /// The sum of the squares of the costs counted in `offered`: `offered_squares`, or
    /// `offered` itself when that is more (a bucket counted in requests, a sender that does not
    /// say: each unit one arrival). A steady load's count over an interval has this variance,
    /// a Poisson count `n` and a compound Poisson sum of costs `sum c^2` alike, so the field
    /// can only make the noise tests more patient than a count of requests, never less.
    pub fn squares(&self) -> u64 {
        self.offered_squares.max(self.offered)
    }

    /// How many independent arrivals `offered` stands for: `offered^2 / sum c^2`, the count a
    /// Poisson count of the same relative spread would have; `offered` for a bucket counted in
    /// requests. Worked example: 40 answers of 100 to 2,000 tokens (42,000 tokens, 1,336 per
    /// answer in `sum c^2 / sum c`) are 31.4 arrivals, not 42,000.
    pub fn arrivals(&self) -> f64 {
        let squares = self.squares();
        if squares == self.offered {
            self.offered as f64
        } else {
            (self.offered as f64).powi(2) / squares as f64
        }
    }

    /// The offered load to compute a drop ratio from, in requests (or a budget's units) per
    /// interval: the interval's offered count, or [`TAIL_PARTS`] times its tail when that is
    /// clearly higher (a surge that started within the interval), by more than [`TAIL_RISE`]
    /// times and more than [`TAIL_NOISE_SIGMAS`] deviations of a steady load's noise
    /// (`sqrt(3 x squares)`, [`Counts::squares`]).
    ///
    /// Worked example: 1 s intervals, 22,000 req/s until 0.4 s, then 330,000 req/s. The interval
    /// offers 8,800 + 198,000 = 206,800, a drop ratio of 0.894 against a limit of 22,000/s; its
    /// tail holds 82,500, four times that is 330,000, over 1.25 x 206,800, and the ratio sent
    /// is the whole surge's 14/15 at once. A load that falls within an interval has a low tail,
    /// so falls always go by the interval's own count. For a token budget the noise is that of
    /// the answers' sizes: 42,000 tokens in 40 answers of 100 to 2,000 tokens (`sum c^2` about
    /// 56.1M) need a tail over 20,233 (4t over `42,000 + 3 sqrt(3 x 56.1M)` = 80,931), where
    /// counted as requests 13,126 would pass (the 1.25 ratio), which the spread of ten answers'
    /// sizes in a tail reaches about one interval in five.
    pub fn offered_for_rise(&self) -> u64 {
        let offered = self.offered as f64;
        let rise = self.offered_tail.saturating_mul(TAIL_PARTS);
        let noise = TAIL_NOISE_SIGMAS * (3.0 * self.squares() as f64).sqrt();
        let clear = (TAIL_RISE * offered).max(offered + noise);
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
            // Unknown: each unit one arrival.
            offered_squares: b.offered_squares.unwrap_or(b.offered),
        };
        counts.fit_tiers();
        counts
    }

    /// These counts times `factor` (rounded), hosts unchanged: one interval's counts standing
    /// in for a later one whose load is `factor` times as high (as many more requests of the
    /// same sizes, so the sum of squares scales alike).
    pub fn scaled(self, factor: f64) -> Counts {
        let scale = |n: u64| (n as f64 * factor.max(0.0)).round() as u64;
        let mut scaled = Counts {
            offered: scale(self.offered),
            offered_tail: scale(self.offered_tail),
            allowed: scale(self.allowed),
            shadow_dropped: scale(self.shadow_dropped),
            hosts: self.hosts,
            tiers: self.tiers.map(scale),
            offered_squares: scale(self.squares()),
        };
        scaled.fit_tiers();
        scaled
    }

    /// Sets `offered` to `offered` (a clamp lowered it) and the sum of squares in proportion,
    /// the same requests fewer: the spread a count of that size would have.
    pub fn lower_offered(&mut self, offered: u64) {
        if offered < self.offered {
            let squares =
                u128::from(self.squares()) * u128::from(offered) / u128::from(self.offered);
            self.offered_squares = u64::try_from(squares).unwrap_or(u64::MAX);
            self.offered = offered;
        }
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
        // Before `offered` changes: a side that does not say counts each unit as one arrival.
        self.offered_squares = self.squares().saturating_add(other.squares());
        self.offered = self.offered.saturating_add(other.offered);
        self.offered_tail = self.offered_tail.saturating_add(other.offered_tail);
        self.allowed = self.allowed.saturating_add(other.allowed);
        self.shadow_dropped = self.shadow_dropped.saturating_add(other.shadow_dropped);
        self.hosts = self.hosts.saturating_add(other.hosts);
    }
}

/// How [`Sums`] hash their keys: foldhash rather than SipHash. An aggregator hashes every
/// bucket of every host's report twice an interval (into the host's sums, then into the zone's),
/// and the keys are the zone's own buckets' names.
pub type KeyHasher = foldhash::fast::RandomState;

/// Counts per bucket: a host's, a zone's or a region's, for one interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sums(pub HashMap<BucketKey, Counts, KeyHasher>);

impl Sums {
    /// Adds another sum into this one. A bucket's key is copied only the first time it is
    /// added: summing a zone's hosts copies each bucket's names once, not once per host.
    pub fn add(&mut self, other: &Sums) {
        for (key, counts) in &other.0 {
            match self.0.get_mut(key) {
                Some(sum) => *sum += *counts,
                None => {
                    // As added to empty counts: its sum of squares made explicit.
                    let mut sum = Counts::default();
                    sum += *counts;
                    self.0.insert(key.clone(), sum);
                }
            }
        }
    }

    /// These sums as [`Sums::add`] would add them to empty ones, without copying a key: each
    /// count's sum of squares made explicit ([`Counts::squares`]).
    pub fn normalized(mut self) -> Sums {
        for counts in self.0.values_mut() {
            counts.offered_squares = counts.squares();
        }
        self
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

    /// [`Sums::from_wire`] of entries the caller owns: their names become the keys without a
    /// copy (a report's buckets, decoded for the one aggregator that sums them).
    pub fn from_wire_owned(buckets: Vec<v1::BucketCounts>) -> Self {
        let mut sums = Sums(HashMap::with_capacity_and_hasher(
            buckets.len(),
            KeyHasher::default(),
        ));
        for mut b in buckets {
            let counts = Counts::from_wire(&b);
            let key = BucketKey {
                service: std::mem::take(&mut b.service),
                bucket: std::mem::take(&mut b.bucket),
            };
            *sums.0.entry(key).or_default() += counts;
        }
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

/// A count's sum of squares for the wire: none when each unit is one arrival (a bucket counted
/// in requests), which is what a receiver takes when the field is absent.
pub fn squares_to_wire(c: &Counts) -> Option<u64> {
    (c.squares() > c.offered).then_some(c.squares())
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
        offered_squares: squares_to_wire(c),
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

    /// The payload of open interval `sequence`, if any member reported it yet.
    pub fn pending_of(&self, sequence: u64) -> Option<&P> {
        self.pending.get(&sequence).map(|(payload, _)| payload)
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
            Sums(HashMap::from_iter([(
                key.clone(),
                Counts {
                    offered,
                    offered_tail: offered / 4,
                    allowed: offered / 2,
                    shadow_dropped: 1,
                    hosts: 1,
                    tiers: [0; TIERS],
                    offered_squares: 0,
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

    #[test]
    fn squares_add_across_senders_that_say_and_those_that_do_not() {
        let wire = |offered, offered_squares| v1::BucketCounts {
            service: "llm".into(),
            bucket: "tokens".into(),
            offered,
            offered_squares,
            ..Default::default()
        };
        // A host of a token budget (40 answers, 42,000 tokens) and one older than the field.
        let sums = Sums::from_wire(&[wire(42_000, Some(56_000_000)), wire(1_000, None)]);
        let key = BucketKey::new("llm", "tokens");
        let c = sums.counts(&key);
        assert_eq!((c.offered, c.squares()), (43_000, 56_001_000));
        // The zone's sum goes on as it is, and adds again at the region with another zone's.
        let wired = sums.to_wire();
        assert_eq!(wired[0].offered_squares, Some(56_001_000));
        let mut region = Sums::from_wire(&wired);
        region.add(&Sums::from_wire(&[wire(21_000, Some(28_000_000))]));
        let c = region.counts(&key);
        assert_eq!((c.offered, c.squares()), (64_000, 84_001_000));
        // Not sqrt-additive: the region's arrivals are its sums' ratio, not the zones' total.
        assert!((c.arrivals() - 64_000f64.powi(2) / 84_001_000.0).abs() < 1e-9);
        // A stand-in scaled up or a clamp lowering it keeps the sizes of its requests.
        assert_eq!(c.scaled(2.0).squares(), 168_002_000);
        let mut lowered = c;
        lowered.lower_offered(32_000);
        assert_eq!(lowered.squares(), 42_000_500);
    }

    #[test]
    fn without_squares_the_counts_read_as_requests_as_before() {
        let wire = |offered_squares| v1::BucketCounts {
            service: "api".into(),
            bucket: "a".into(),
            offered: 100,
            offered_tail: Some(38),
            offered_squares,
            ..Default::default()
        };
        let key = BucketKey::new("api", "a");
        let absent = Sums::from_wire(&[wire(None)]).counts(&key);
        // Each unit one arrival: the rise test and the arrivals of a count of requests.
        assert_eq!(absent.offered_for_rise(), 152);
        assert_eq!(absent.arrivals(), 100.0);
        // Saying so changes nothing, nor does less than that (never stricter than requests).
        for said in [Some(100), Some(1), Some(0)] {
            let c = Sums::from_wire(&[wire(said)]).counts(&key);
            assert_eq!(
                (c.offered_for_rise(), c.arrivals()),
                (152, 100.0),
                "{said:?}"
            );
        }
        // Nor is it sent for a count of requests.
        assert_eq!(
            Sums::from_wire(&[wire(None)]).to_wire()[0].offered_squares,
            None
        );
    }

    /// One interval of a token load: a Poisson count of answers of 100 to 2,000 tokens (1,050
    /// on average, `E[c^2] / E[c]` = 1,336), `answers` expected over the first three quarters'
    /// rate and `rise` times that rate in the last quarter. With `squares` false the counts do
    /// not say (a report before the field): each token reads as one arrival.
    fn token_interval(rng: &mut fastrand::Rng, answers: f64, rise: f64, squares: bool) -> Counts {
        let mut c = Counts::default();
        let head = poisson(rng, answers * 0.75);
        let tail = poisson(rng, answers * 0.25 * rise);
        for at in 0..head + tail {
            let cost = rng.u64(100..=2_000);
            c.offered += cost;
            c.offered_squares += cost * cost;
            if at >= head {
                c.offered_tail += cost;
            }
        }
        if !squares {
            c.offered_squares = 0;
        }
        c
    }

    /// A Poisson draw (Knuth's, fine for the means here).
    fn poisson(rng: &mut fastrand::Rng, mean: f64) -> u64 {
        let floor = (-mean).exp();
        let (mut n, mut p) = (0, rng.f64());
        while p > floor {
            n += 1;
            p *= rng.f64();
        }
        n
    }

    #[test]
    fn a_steady_token_load_rarely_passes_for_a_surge_by_its_squares() {
        // 10 to 200 answers an interval (the simulator's token budget sees about 40 at the
        // budget): 4,000 steady intervals each.
        let mut rng = fastrand::Rng::with_seed(11);
        for answers in [10.0, 40.0, 200.0] {
            let passed = |rng: &mut fastrand::Rng, squares| {
                (0..4_000)
                    .filter(|_| {
                        let c = token_interval(rng, answers, 1.0, squares);
                        c.offered_for_rise() != c.offered
                    })
                    .count()
            };
            let by_squares = passed(&mut rng, true);
            let as_requests = passed(&mut rng, false);
            eprintln!("{answers} answers: {by_squares} by squares, {as_requests} as requests");
            // Three deviations of a skewed sum: a few in a thousand at 10 answers, fewer above.
            assert!(by_squares <= 20, "{by_squares} of 4,000 at {answers}");
            // Read as requests, the answers' sizes pass for a surge every few intervals.
            assert!(as_requests >= 100, "{as_requests} of 4,000 at {answers}");
        }
    }

    #[test]
    fn a_token_surge_in_the_tail_still_passes() {
        // 40 answers an interval's rate, four times it in the last quarter: the tail's rate is
        // 168,000 tokens against an interval of 73,500, over its bar of about 125,000.
        let mut rng = fastrand::Rng::with_seed(12);
        let seen = (0..4_000)
            .filter(|_| {
                let c = token_interval(&mut rng, 40.0, 4.0, true);
                c.offered_for_rise() == c.offered_tail * TAIL_PARTS
            })
            .count();
        eprintln!("{seen} of 4,000 surges seen from the tail");
        assert!(seen >= 3_400, "{seen} of 4,000");
    }

    /// A steady token load of `answers` an interval at four times `budget`, every interval's
    /// ratio computed as the controller does (the rise test, then the smoother with the
    /// arrivals the count stands for): how often a fall is taken at once, and the tokens
    /// admitted against the budget, each interval under the ratio from the one before.
    fn steady_over_budget(answers: f64, budget: f64, squares: bool, weighed: bool) -> (f64, f64) {
        use spillway_core::control::{Smoother, target_drop};
        let mut rng = fastrand::Rng::with_seed(13);
        let mut s = Smoother::default();
        let (mut snaps, mut admitted) = (0, 0.0);
        let intervals = 4_000;
        for _ in 0..intervals {
            let c = token_interval(&mut rng, answers, 1.0, squares);
            let before = s.current();
            admitted += (1.0 - before) * c.offered as f64;
            let target = target_drop(budget, c.offered_for_rise() as f64);
            let after = if weighed {
                s.update_weighed(target, c.arrivals())
            } else {
                s.update_counted(target, c.arrivals())
            };
            // A fall further than easing's step towards the target: taken at once.
            let eased = before - Smoother::DEFAULT_RELEASE * (before - target);
            if target < before && after < eased - 1e-9 {
                snaps += 1;
            }
        }
        (
            snaps as f64 / intervals as f64,
            admitted / intervals as f64 / budget,
        )
    }

    #[test]
    fn a_steady_token_load_over_its_budget_is_not_read_as_falls_and_admits_its_budget() {
        // 152 answers an interval, 4x a budget of 40,000 tokens. Read as requests, every dip of
        // the sizes is a clear fall; by the squares a fall within the noise is eased.
        let (snaps, _) = steady_over_budget(152.0, 40_000.0, true, false);
        let (old_snaps, _) = steady_over_budget(152.0, 40_000.0, false, false);
        eprintln!("falls taken at once: {snaps} by the squares, {old_snaps} as requests");
        assert!(snaps < 0.1, "{snaps}");
        assert!(old_snaps > 0.3, "{old_snaps}");
        // Rises at once and falls eased sit above the target (0.94-0.97 of the budget here);
        // a sum of costs eases both within its noise and admits its budget to within 3%, from
        // 10 answers an interval (the simulator's budget counts about 38) to 152.
        for (answers, budget) in [(152.0, 40_000.0), (38.0, 10_000.0), (10.0, 2_500.0)] {
            let (_, counted) = steady_over_budget(answers, budget, true, false);
            let (_, weighed) = steady_over_budget(answers, budget, true, true);
            eprintln!("{answers} answers: {counted} rising at once, {weighed} weighed");
            assert!(counted < 0.98, "{counted} at {answers}");
            assert!((weighed - 1.0).abs() < 0.03, "{weighed} at {answers}");
        }
    }

    #[test]
    fn a_clear_fall_and_a_clear_rise_of_a_token_load_are_taken_at_once() {
        use spillway_core::control::{Smoother, target_drop};
        let (budget, answers) = (40_000.0, 152.0);
        let mut rng = fastrand::Rng::with_seed(14);
        let settled = |rng: &mut fastrand::Rng| {
            let mut s = Smoother::default();
            for _ in 0..5 {
                let c = token_interval(rng, answers, 1.0, true);
                s.update_weighed(
                    target_drop(budget, c.offered_for_rise() as f64),
                    c.arrivals(),
                );
            }
            s
        };
        for _ in 0..200 {
            // 4x to 1.5x of the budget: the ratio goes to the new one at once.
            let mut s = settled(&mut rng);
            let c = token_interval(&mut rng, answers * 1.5 / 4.0, 1.0, true);
            let target = target_drop(budget, c.offered_for_rise() as f64);
            let after = s.update_weighed(target, c.arrivals());
            // The new target, less its bias (`Smoother::update_weighed`); none under the
            // budget, which the spread of sizes now and then shows.
            let unbiased = if target > 0.0 {
                1.0 - (1.0 - target) / (1.0 + 1.0 / c.arrivals())
            } else {
                0.0
            };
            assert!((after - unbiased).abs() < 1e-12, "{after} for {target}");
            // 4x to 8x: at once too.
            let mut s = settled(&mut rng);
            let c = token_interval(&mut rng, answers * 2.0, 1.0, true);
            let target = target_drop(budget, c.offered_for_rise() as f64);
            let after = s.update_weighed(target, c.arrivals());
            assert!(after >= target, "{after} for {target}");
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
