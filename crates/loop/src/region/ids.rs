//! What a zone stream's bucket numbers stand for ([`crate::bucket_ids`]): each number's index in
//! the [`Table`] of the rules in force, so an entry by number is found with one array read, and
//! its unnumbered entries through the stream's [`Order`].

use std::collections::HashMap;

use spillway_proto::v1;

use super::table::{Index, Order, Table};
use crate::bucket_ids::{MAX_BUCKET_ID, Named};
use crate::sums::BucketKey;

/// A number the stream named with a bucket the rules do not have.
const LACKING: Index = Index::MAX;
/// A number the stream never named.
const UNBOUND: Index = Index::MAX - 1;

/// Names of lacking buckets kept per stream, should new rules have them: beyond this a lacking
/// number stays lacking until the stream ends.
const MAX_LACKING: usize = 4096;

/// One stream's numbers, and where its unnumbered entries were last time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Dictionary {
    order: Order,
    /// Each number's bucket index, [`LACKING`] or [`UNBOUND`].
    ids: Vec<Index>,
    /// The names of lacking numbers.
    lacking: HashMap<u32, BucketKey>,
    /// Entries whose number the stream never bound (skipped).
    pub unbound: u64,
}

impl Dictionary {
    /// The index of entry `b` (at `position` of its message, when its entries keep their
    /// places from one message to the next), binding its number when it comes with names.
    pub fn resolve(
        &mut self,
        table: &Table,
        position: Option<usize>,
        b: &v1::BucketCounts,
    ) -> Option<Index> {
        match Named::of(&b.service, &b.bucket, b.id) {
            Named::Names {
                service,
                bucket,
                id: 0,
            } => match position {
                Some(position) => self.order.resolve(table, position, service, bucket),
                None => table.find(service, bucket),
            },
            Named::Names {
                service,
                bucket,
                id,
            } => {
                // Named again as it was bound (a sender names its buckets until it hears that
                // the receiver takes numbers): the bucket its number stands for, checked by
                // two short comparisons rather than found by the names' hashes.
                if let Some(&index) = self.ids.get(id as usize)
                    && table.names(index, service, bucket)
                {
                    return Some(index);
                }
                let found = table.find(service, bucket);
                self.bind(id, found, service, bucket);
                found
            }
            Named::Id(id) => match self.ids.get(id as usize).copied() {
                Some(LACKING) => None,
                Some(index) if index != UNBOUND => Some(index),
                _ => {
                    self.unbound += 1;
                    None
                }
            },
        }
    }

    fn bind(&mut self, id: u32, found: Option<Index>, service: &str, bucket: &str) {
        if id > MAX_BUCKET_ID {
            return;
        }
        let at = id as usize;
        if at >= self.ids.len() {
            self.ids.resize(at + 1, UNBOUND);
        }
        if self.ids[at] == LACKING {
            self.lacking.remove(&id);
        }
        self.ids[at] = match found {
            Some(index) => index,
            None => {
                if self.lacking.len() < MAX_LACKING {
                    self.lacking.insert(id, BucketKey::new(service, bucket));
                }
                LACKING
            }
        };
    }

    /// The names of entry `b`: its own, or those its number stands for.
    pub fn names<'a>(
        &'a self,
        table: &'a Table,
        b: &'a v1::BucketCounts,
    ) -> Option<(&'a str, &'a str)> {
        match Named::of(&b.service, &b.bucket, b.id) {
            Named::Names {
                service, bucket, ..
            } => Some((service, bucket)),
            Named::Id(id) => match self.ids.get(id as usize).copied() {
                Some(LACKING) => self
                    .lacking
                    .get(&id)
                    .map(|k| (k.service.as_str(), k.bucket.as_str())),
                Some(index) if index != UNBOUND => {
                    let key = table.key(index);
                    Some((key.service.as_str(), key.bucket.as_str()))
                }
                _ => None,
            },
        }
    }

    /// The rules' buckets were renumbered from `old` to `next` (`moves`: where each index went):
    /// every number keeps its bucket, a bucket that left the rules is lacking, and a lacking one
    /// the new rules have is found again.
    pub fn renumber(&mut self, old: &Table, next: &Table, moves: &[Option<Index>]) {
        self.order.clear();
        for (id, slot) in (0u32..).zip(self.ids.iter_mut()) {
            match *slot {
                UNBOUND => {}
                LACKING => {
                    let found = self
                        .lacking
                        .get(&id)
                        .and_then(|k| next.find(&k.service, &k.bucket));
                    if let Some(index) = found {
                        self.lacking.remove(&id);
                        *slot = index;
                    }
                }
                index => match moves.get(index as usize).copied().flatten() {
                    Some(moved) => *slot = moved,
                    None => {
                        if self.lacking.len() < MAX_LACKING {
                            self.lacking.insert(id, old.key(index).clone());
                        }
                        *slot = LACKING;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RulesSnapshot;

    fn table(buckets: &[&str]) -> Table {
        let mut yaml = String::from("version: 1\nservices:\n  api:\n    buckets:\n");
        for name in buckets {
            yaml.push_str(&format!(
                "      - {{ name: {name}, match: {{ procedure: /{name} }}, limit: 100/s, scope: region }}\n"
            ));
        }
        let rules = RulesSnapshot::parse(1, &yaml, "rules.yaml").unwrap();
        Table::new(&rules.config, "r1")
    }

    fn entry(bucket: &str, id: u32) -> v1::BucketCounts {
        v1::BucketCounts {
            service: if bucket.is_empty() { "" } else { "api" }.into(),
            bucket: bucket.into(),
            id,
            ..Default::default()
        }
    }

    #[test]
    fn a_number_named_once_finds_its_bucket_alone_after() {
        let table = table(&["a", "b"]);
        let mut names = Dictionary::default();
        assert_eq!(names.resolve(&table, Some(0), &entry("b", 7)), Some(1));
        assert_eq!(names.resolve(&table, Some(0), &entry("", 7)), Some(1));
        assert_eq!(names.resolve(&table, None, &entry("", 7)), Some(1));
        assert_eq!(names.names(&table, &entry("", 7)), Some(("api", "b")));
        assert_eq!(names.unbound, 0);
    }

    #[test]
    fn a_number_named_again_with_other_names_stands_for_them() {
        let table = table(&["a", "b"]);
        let mut names = Dictionary::default();
        assert_eq!(names.resolve(&table, Some(0), &entry("a", 1)), Some(0));
        assert_eq!(names.resolve(&table, Some(0), &entry("a", 1)), Some(0));
        assert_eq!(names.resolve(&table, Some(0), &entry("b", 1)), Some(1));
        assert_eq!(names.resolve(&table, Some(0), &entry("", 1)), Some(1));
        assert_eq!(names.resolve(&table, Some(0), &entry("zz", 1)), None);
        assert_eq!(
            names.resolve(&table, Some(0), &entry("", 1)),
            None,
            "lacking"
        );
        assert_eq!(names.unbound, 0);
    }

    #[test]
    fn a_number_never_named_is_counted_and_skipped() {
        let table = table(&["a"]);
        let mut names = Dictionary::default();
        assert_eq!(names.resolve(&table, Some(0), &entry("", 3)), None);
        assert_eq!(
            names.resolve(&table, Some(0), &entry("", MAX_BUCKET_ID * 4)),
            None
        );
        assert_eq!(names.unbound, 2);
        assert_eq!(names.names(&table, &entry("", 3)), None);
        // A number past the bound is never bound, whatever its names.
        assert_eq!(
            names.resolve(&table, None, &entry("a", MAX_BUCKET_ID + 1)),
            Some(0)
        );
        assert_eq!(
            names.resolve(&table, None, &entry("", MAX_BUCKET_ID + 1)),
            None
        );
        assert_eq!(names.unbound, 3);
    }

    #[test]
    fn an_entry_without_a_number_is_read_by_its_names() {
        let table = table(&["a", "b"]);
        let mut names = Dictionary::default();
        assert_eq!(names.resolve(&table, Some(0), &entry("b", 0)), Some(1));
        assert_eq!(names.resolve(&table, Some(0), &entry("a", 0)), Some(0));
        assert_eq!(names.resolve(&table, None, &entry("zz", 0)), None);
        assert_eq!(names.unbound, 0);
    }

    #[test]
    fn numbers_follow_their_buckets_through_new_rules() {
        let old = table(&["a", "b", "c"]);
        let mut names = Dictionary::default();
        for (bucket, id) in [("a", 1), ("b", 2), ("c", 3), ("d", 4)] {
            names.resolve(&old, None, &entry(bucket, id));
        }
        assert_eq!(
            names.resolve(&old, None, &entry("", 4)),
            None,
            "d: not in the rules"
        );
        // b leaves, d comes, c moves.
        let next = table(&["d", "c", "a"]);
        names.renumber(&old, &next, &old.moves_to(&next));
        let found: Vec<Option<Index>> = (1..=4)
            .map(|id| names.resolve(&next, None, &entry("", id)))
            .collect();
        assert_eq!(found, [Some(2), None, Some(1), Some(0)]);
        assert_eq!(names.names(&next, &entry("", 2)), Some(("api", "b")));
        assert_eq!(names.unbound, 0);
        // b comes back: found again.
        names.renumber(&next, &old, &next.moves_to(&old));
        assert_eq!(names.resolve(&old, None, &entry("", 2)), Some(1));
    }
}
