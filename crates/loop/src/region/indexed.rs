//! Sums by bucket index ([`super::table`]): what the region core adds up, keeps and computes
//! from, as sorted arrays, so adding a zone's interval is a merge of two arrays and nothing is
//! hashed, compared by name or allocated per bucket.

use spillway_proto::v1;

use super::ids::Dictionary;
use super::table::{Index, Table};
use crate::sums::{Counts, Sums};

/// Counts per bucket index, sorted by index, each index once: a zone's, a region's or a
/// peer's, for one interval. Holds only the buckets that were reported, so a zone that sends a
/// few buckets of many costs a few entries.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct IndexedSums(Vec<(Index, Counts)>);

impl IndexedSums {
    /// Adds counts as they came over the wire, each entry found in `table` through `names`, the
    /// stream's numbers (and its entries' positions in its last message, with `positional`);
    /// entries of buckets the rules do not have are left out, as the math never reads them.
    pub fn add_wire(
        &mut self,
        table: &Table,
        names: &mut Dictionary,
        positional: bool,
        buckets: &[v1::BucketCounts],
    ) {
        self.0.reserve(buckets.len());
        for (position, b) in buckets.iter().enumerate() {
            if let Some(index) = names.resolve(table, positional.then_some(position), b) {
                self.0.push((index, Counts::from_wire(b)));
            }
        }
        self.normalize();
    }

    /// The sums of `buckets` as they came over the wire, by their names.
    #[cfg(test)]
    pub fn from_wire(table: &Table, buckets: &[v1::BucketCounts]) -> Self {
        let mut sums = Self::default();
        sums.add_wire(table, &mut Dictionary::default(), false, buckets);
        sums
    }

    /// Sorted by index again, with the counts of an index reported twice added up. A report in
    /// the rules' order, the usual one, is only checked.
    fn normalize(&mut self) {
        if self.0.windows(2).all(|w| w[0].0 < w[1].0) {
            return;
        }
        self.0.sort_by_key(|&(index, _)| index);
        self.0.dedup_by(|later, kept| {
            let same = later.0 == kept.0;
            if same {
                kept.1 += later.1;
            }
            same
        });
    }

    /// Adds another sum into this one.
    pub fn add(&mut self, other: &IndexedSums) {
        if other.0.is_empty() {
            return;
        }
        if self.0.is_empty() {
            self.0.clone_from(&other.0);
            return;
        }
        let (x, y) = (&self.0, &other.0);
        let mut merged = Vec::with_capacity(x.len().max(y.len()));
        let (mut i, mut j) = (0, 0);
        while i < x.len() && j < y.len() {
            let ((a, ca), (b, cb)) = (x[i], y[j]);
            if a == b {
                let mut sum = ca;
                sum += cb;
                merged.push((a, sum));
                (i, j) = (i + 1, j + 1);
            } else if a < b {
                merged.push((a, ca));
                i += 1;
            } else {
                merged.push((b, cb));
                j += 1;
            }
        }
        merged.extend_from_slice(&x[i..]);
        merged.extend_from_slice(&y[j..]);
        self.0 = merged;
    }

    /// The counts of one bucket (zeros when it saw none).
    pub fn counts(&self, index: Index) -> Counts {
        self.0
            .binary_search_by_key(&index, |&(i, _)| i)
            .map_or_else(|_| Counts::default(), |at| self.0[at].1)
    }

    /// Offered requests of one bucket (0 when it saw none).
    pub fn offered(&self, index: Index) -> u64 {
        self.counts(index).offered
    }

    /// Every bucket that saw counts, by index.
    pub fn iter(&self) -> impl Iterator<Item = &(Index, Counts)> {
        self.0.iter()
    }

    /// Every bucket that saw counts, by index, as a slice.
    pub fn as_slice(&self) -> &[(Index, Counts)] {
        &self.0
    }

    /// The buckets `keep` says, apart.
    pub fn filtered(&self, mut keep: impl FnMut(Index) -> bool) -> IndexedSums {
        IndexedSums(self.0.iter().filter(|&&(i, _)| keep(i)).copied().collect())
    }

    /// Each bucket's counts changed by `change`.
    pub fn for_each_mut(&mut self, mut change: impl FnMut(Index, &mut Counts)) {
        for (index, counts) in &mut self.0 {
            change(*index, counts);
        }
    }

    /// Appends a bucket past the last one.
    pub fn push(&mut self, index: Index, counts: Counts) {
        debug_assert!(self.0.last().is_none_or(|&(last, _)| last < index));
        self.0.push((index, counts));
    }

    /// These sums under a new table: `moves` says where each index went (`None`: the bucket
    /// left the rules, and its counts with it).
    pub fn remap(&self, moves: &[Option<Index>]) -> IndexedSums {
        let mut sums = IndexedSums(
            self.0
                .iter()
                .filter_map(|&(i, c)| Some((moves.get(i as usize).copied().flatten()?, c)))
                .collect(),
        );
        sums.normalize();
        sums
    }

    /// The counts for the wire, sorted by bucket so equal sums encode equally.
    pub fn to_wire(&self, table: &Table) -> Vec<v1::BucketCounts> {
        self.to_sums(table).to_wire()
    }

    /// The same sums keyed by name.
    pub fn to_sums(&self, table: &Table) -> Sums {
        Sums(
            self.0
                .iter()
                .map(|&(i, c)| (table.key(i).clone(), c))
                .collect(),
        )
    }

    /// The counts of one bucket by name (zeros when it saw none or the table has no such bucket).
    #[cfg(test)]
    pub fn counts_of(&self, table: &Table, key: &crate::sums::BucketKey) -> Counts {
        table
            .find(&key.service, &key.bucket)
            .map_or_else(Counts::default, |i| self.counts(i))
    }
}
