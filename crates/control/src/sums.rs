//! Per-bucket counts and their sums: what aggregators and controllers add up every interval,
//! and the sans-IO bookkeeping of which intervals are still open ([`Intervals`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;

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
    pub allowed: u64,
    pub shadow_dropped: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Counts) {
        self.offered = self.offered.saturating_add(other.offered);
        self.allowed = self.allowed.saturating_add(other.allowed);
        self.shadow_dropped = self.shadow_dropped.saturating_add(other.shadow_dropped);
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
                .or_default() += Counts {
                offered: b.offered,
                allowed: b.allowed,
                shadow_dropped: b.shadow_dropped,
            };
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
            .map(|key| {
                let c = self.0[key];
                v1::BucketCounts {
                    service: key.service.clone(),
                    bucket: key.bucket.clone(),
                    offered: c.offered,
                    allowed: c.allowed,
                    shadow_dropped: c.shadow_dropped,
                }
            })
            .collect()
    }

    /// Offered requests of one bucket (0 when it saw none).
    pub fn offered(&self, key: &BucketKey) -> u64 {
        self.0.get(key).map_or(0, |c| c.offered)
    }
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

    /// The payload of interval `sequence` for `member` to add into, or `None` when the interval
    /// is already closed (the report is late).
    pub fn accept(&mut self, sequence: u64, member: K) -> Option<&mut P> {
        if sequence <= self.closed_through {
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
        interval: crate::timing::Interval,
        wait_ms: u64,
        members: impl Iterator<Item = &'a K> + Clone,
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
            let mut all = members.clone().peekable();
            let complete = all.peek().is_some() && all.all(|m| reported.contains(m));
            let overdue = now_ms >= interval.end_of(sequence) + wait_ms;
            if !(complete || overdue) {
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
                    allowed: offered / 2,
                    shadow_dropped: 1,
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
        assert_eq!(Sums::from_wire(&zone.to_wire()), zone);
    }

    #[test]
    fn an_interval_closes_when_complete_or_overdue_and_late_reports_are_refused() {
        let interval = crate::timing::Interval::from_ms(1000);
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
    }
}
