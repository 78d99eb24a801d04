//! Per-bucket counts and their sums: what aggregators and controllers add up every interval.

use std::collections::HashMap;

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
}
