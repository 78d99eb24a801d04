//! The zone's side of the bucket numbers on its stream to the controller
//! ([`crate::bucket_ids`]): its reports number each bucket the first time they send it, and the
//! controller's instructions by number get their names back before they go to the hosts, whose
//! link keeps the names.

use std::collections::HashMap;

use spillway_proto::v1;

use crate::bucket_ids::{MAX_BUCKET_ID, Named, Told};
use crate::sums::{BucketKey, Sums, counts_to_wire};

/// One stream's numbers, both ways.
#[derive(Debug, Default)]
pub(super) struct StreamIds {
    /// Each bucket's number in this zone's reports, given the first time it is sent.
    ours: HashMap<BucketKey, u32, foldhash::fast::RandomState>,
    told: Told,
    /// What the controller's numbers stand for, by number.
    theirs: Vec<Option<BucketKey>>,
    /// Instruction entries whose number the stream never named (skipped).
    pub unbound: u64,
}

impl StreamIds {
    /// The controller said whether it takes report entries by number alone.
    pub fn set_takes_ids(&mut self, takes: bool) {
        self.told.set_takes_ids(takes);
    }

    /// `sums` as a report's entries, each bucket numbered (new ones in name order) and named
    /// when due, in number order.
    pub fn entries(&mut self, sums: &Sums) -> Vec<v1::BucketCounts> {
        let mut new: Vec<&BucketKey> = sums
            .0
            .keys()
            .filter(|k| !self.ours.contains_key(*k))
            .collect();
        if !new.is_empty() {
            new.sort();
            for key in new {
                let id = u32::try_from(self.ours.len() + 1).unwrap_or(u32::MAX);
                if id > MAX_BUCKET_ID {
                    break;
                }
                self.ours.insert(key.clone(), id);
            }
        }
        // Numbered ones in number order, then (past the bound) the rest by name.
        let mut numbered: Vec<(u32, &BucketKey)> = sums
            .0
            .keys()
            .map(|k| (self.ours.get(k).copied().unwrap_or(u32::MAX), k))
            .collect();
        numbered.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        numbered
            .into_iter()
            .map(|(id, key)| {
                let id = if id == u32::MAX { 0 } else { id };
                let counts = &sums.0[key];
                if self.told.names_due(id) {
                    counts_to_wire(key.service.clone(), key.bucket.clone(), counts, id)
                } else {
                    counts_to_wire(String::new(), String::new(), counts, id)
                }
            })
            .collect()
    }

    /// Entries of a report that was not sent: the names they carried go again.
    pub fn lost(&mut self, buckets: &[v1::BucketCounts]) {
        for b in buckets {
            if b.id != 0 && !b.bucket.is_empty() {
                self.told.forget(b.id);
            }
        }
    }

    /// Instruction entries named again: a number with names binds them, a number alone takes
    /// those it was bound to (an entry whose number was never bound is counted in
    /// [`StreamIds::unbound`] and left out). What goes on to the hosts carries names only.
    pub fn name(&mut self, buckets: &mut Vec<v1::BucketInstruction>) {
        buckets.retain_mut(|b| {
            let id = b.id;
            b.id = 0;
            match Named::of(&b.service, &b.bucket, id) {
                Named::Names { id: 0, .. } => true,
                Named::Names {
                    service, bucket, ..
                } => {
                    if id <= MAX_BUCKET_ID {
                        let at = id as usize;
                        if at >= self.theirs.len() {
                            self.theirs.resize(at + 1, None);
                        }
                        let same = self.theirs[at]
                            .as_ref()
                            .is_some_and(|k| k.service == service && k.bucket == bucket);
                        if !same {
                            self.theirs[at] = Some(BucketKey::new(service, bucket));
                        }
                    }
                    true
                }
                Named::Id(_) => match self.theirs.get(id as usize).and_then(Option::as_ref) {
                    Some(key) => {
                        b.service.clone_from(&key.service);
                        b.bucket.clone_from(&key.bucket);
                        true
                    }
                    None => {
                        self.unbound += 1;
                        false
                    }
                },
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sums::Counts;

    fn sums(buckets: &[&str]) -> Sums {
        let mut sums = Sums::default();
        for (n, bucket) in (1..).zip(buckets) {
            let counts = Counts {
                offered: n,
                ..Default::default()
            };
            sums.0.insert(BucketKey::new("api", *bucket), counts);
        }
        sums
    }

    fn named(entries: &[v1::BucketCounts]) -> Vec<(u32, &str, u64)> {
        entries
            .iter()
            .map(|b| (b.id, b.bucket.as_str(), b.offered))
            .collect()
    }

    #[test]
    fn reports_name_a_bucket_once_the_controller_takes_numbers() {
        let mut ids = StreamIds::default();
        let first = ids.entries(&sums(&["b", "a"]));
        assert_eq!(
            named(&first),
            [(1, "a", 2), (2, "b", 1)],
            "numbered in name order"
        );
        let again = ids.entries(&sums(&["b", "a"]));
        assert_eq!(
            named(&again),
            named(&first),
            "named until the controller takes numbers"
        );
        ids.set_takes_ids(true);
        assert_eq!(
            named(&ids.entries(&sums(&["b", "a"]))),
            [(1, "", 2), (2, "", 1)]
        );
        let steady = ids.entries(&sums(&["c", "b", "a"]));
        assert_eq!(named(&steady), [(1, "", 3), (2, "", 2), (3, "c", 1)]);
        assert!(steady[..2].iter().all(|b| b.service.is_empty()));
        // A report lost: its names go again.
        ids.lost(&steady);
        assert_eq!(named(&ids.entries(&sums(&["c"]))), [(3, "c", 1)]);
        assert_eq!(named(&ids.entries(&sums(&["c"]))), [(3, "", 1)]);
    }

    #[test]
    fn a_new_stream_names_every_bucket_again() {
        let mut ids = StreamIds::default();
        ids.set_takes_ids(true);
        ids.entries(&sums(&["a"]));
        assert_eq!(named(&ids.entries(&sums(&["a"]))), [(1, "", 1)]);
        let mut ids = StreamIds::default();
        ids.set_takes_ids(true);
        assert_eq!(named(&ids.entries(&sums(&["a"]))), [(1, "a", 1)]);
    }

    fn instruction(bucket: &str, id: u32, drop_ratio: u64) -> v1::BucketInstruction {
        v1::BucketInstruction {
            service: if bucket.is_empty() { "" } else { "api" }.into(),
            bucket: bucket.into(),
            id,
            drop_ratio,
            ..Default::default()
        }
    }

    #[test]
    fn instructions_by_number_get_their_names_back() {
        let mut ids = StreamIds::default();
        let mut first = vec![instruction("a", 1, 10), instruction("old", 0, 20)];
        ids.name(&mut first);
        assert_eq!(first, [instruction("a", 0, 10), instruction("old", 0, 20)]);
        let mut later = vec![instruction("", 1, 11), instruction("", 9, 30)];
        ids.name(&mut later);
        assert_eq!(later, [instruction("a", 0, 11)], "number 9 was never named");
        assert_eq!(ids.unbound, 1);
        // Renamed (the controller's rules renumbered its buckets).
        let mut renamed = vec![instruction("b", 1, 12)];
        ids.name(&mut renamed);
        let mut after = vec![instruction("", 1, 13)];
        ids.name(&mut after);
        assert_eq!(after, [instruction("b", 0, 13)]);
    }
}
