//! The region's buckets by number: every bucket of the rules in force has an index, so an
//! interval's sums are arrays addressed by it and a zone report's names are looked up once per
//! entry, without building a key.
//!
//! A controller of 100 zones x 10,000 buckets adds a million (zone, bucket) sums a second; keyed
//! by a service and a bucket `String`, their hashing, comparing, cloning and freeing cost it
//! about 5 us each, most of a core. By index, adding one is a few nanoseconds.

use std::collections::HashMap;

use spillway_core::algo::Kind;
use spillway_core::config::{Config, Scope};

use crate::sums::BucketKey;

type Fast = foldhash::fast::RandomState;

/// A bucket's place in the [`Table`] of the rules in force.
pub(crate) type Index = u32;

/// What the region's math needs of a bucket, read once from the rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spec {
    pub scope: Scope,
    pub kind: Kind,
    /// Its limit in this region (a region-scoped bucket may have one of its own), per second.
    pub limit: f64,
}

impl Spec {
    /// Whether the controller computes a drop ratio (or adaptive shares) for it.
    pub fn computed(&self) -> bool {
        matches!(self.kind, Kind::DropRatio | Kind::AdaptiveTokenBucket)
    }
}

/// Every bucket of the rules, in the rules' order, by index.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    keys: Vec<BucketKey>,
    specs: Vec<Spec>,
    /// Each bucket's index by service, then bucket name: queried with the report's own `&str`s.
    index: HashMap<String, HashMap<String, Index, Fast>, Fast>,
    /// The global buckets, in order: what the peers are sent.
    global: Vec<Index>,
}

impl Table {
    /// The buckets of `config` as region `region` sees them.
    pub fn new(config: &Config, region: &str) -> Self {
        let mut table = Table::default();
        for (service, bucket) in config.buckets() {
            let names = table.index.entry(service.name.clone()).or_default();
            if names.contains_key(&bucket.name) {
                continue;
            }
            let index = Index::try_from(table.keys.len()).unwrap_or(Index::MAX);
            names.insert(bucket.name.clone(), index);
            table.keys.push(BucketKey::new(&service.name, &bucket.name));
            table.specs.push(Spec {
                scope: bucket.scope,
                kind: bucket.algorithm,
                limit: bucket.limit_in(region).per_second(),
            });
            if bucket.scope == Scope::Global {
                table.global.push(index);
            }
        }
        table
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn key(&self, index: Index) -> &BucketKey {
        &self.keys[index as usize]
    }

    pub fn spec(&self, index: Index) -> &Spec {
        &self.specs[index as usize]
    }

    /// Every bucket with its index and spec, in the rules' order.
    pub fn iter(&self) -> impl Iterator<Item = (Index, &BucketKey, &Spec)> {
        (0..)
            .zip(self.keys.iter().zip(&self.specs))
            .map(|(i, (k, s))| (i, k, s))
    }

    /// The index of a bucket by its names, if the rules have it.
    pub fn find(&self, service: &str, bucket: &str) -> Option<Index> {
        self.index.get(service)?.get(bucket).copied()
    }

    /// Whether bucket `index` is the one named `service` and `bucket` (false for an index the
    /// table does not have).
    pub fn names(&self, index: Index, service: &str, bucket: &str) -> bool {
        self.keys
            .get(index as usize)
            .is_some_and(|key| key.service == service && key.bucket == bucket)
    }

    /// The global buckets, in the rules' order.
    pub fn global(&self) -> &[Index] {
        &self.global
    }

    /// Whether a bucket is global.
    pub fn is_global(&self, index: Index) -> bool {
        self.specs[index as usize].scope == Scope::Global
    }

    /// Whether `next` numbers the same buckets the same way (its limits may differ).
    pub fn same_buckets(&self, next: &Table) -> bool {
        self.keys == next.keys
    }

    /// Where each bucket of this table is in `next` (`None`: it left the rules).
    pub fn moves_to(&self, next: &Table) -> Vec<Option<Index>> {
        self.keys
            .iter()
            .map(|k| next.find(&k.service, &k.bucket))
            .collect()
    }
}

/// Where a stream's last report had each of its buckets, by position: an aggregator sends the
/// same buckets in the same order every interval, so an entry is found by comparing its names
/// with those of the bucket at its position last time, without hashing them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Order(Vec<Index>);

/// A position whose entry named no bucket of the rules.
const UNKNOWN: Index = Index::MAX;

impl Order {
    /// The index of the entry at `position` of a report, named `service` and `bucket`.
    pub fn resolve(
        &mut self,
        table: &Table,
        position: usize,
        service: &str,
        bucket: &str,
    ) -> Option<Index> {
        if let Some(&cached) = self.0.get(position)
            && let Some(key) = table.keys.get(cached as usize)
            && key.service == service
            && key.bucket == bucket
        {
            return Some(cached);
        }
        let found = table.find(service, bucket);
        if position >= self.0.len() {
            self.0.resize(position + 1, UNKNOWN);
        }
        self.0[position] = found.unwrap_or(UNKNOWN);
        found
    }

    /// Forgets every position (the table changed).
    pub fn clear(&mut self) {
        self.0.clear();
    }
}
