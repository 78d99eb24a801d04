//! Buckets by number on the zone<->controller stream (`LinkZone`), both ways: a sender numbers a
//! bucket the first time it sends it on a stream, with its names, and once the receiver said it
//! takes numbers, sends the number alone; the receiver keeps what each number stands for until
//! the stream ends. A new stream starts afresh.
//!
//! At 100 zones x 10,000 buckets a second the names cost a controller more than its math: two
//! `String`s decoded, allocated, compared and freed per entry, each way. By number an entry is a
//! few varints, decoded without an allocation (prost leaves an empty string unallocated), and
//! looked up by position.
//!
//! An entry with names and no number is read by its names, as every sender older than the
//! numbers sends them; an entry whose number the stream never bound is counted and skipped.
//! Numbers need a stream that delivers every message in order: the simulator's network loses
//! and reorders messages, so its zones name every bucket (they never ask for numbers).

/// The highest number a stream may give a bucket. Numbers are dense from 1, so this bounds what
/// a peer can make its receiver keep (4 MB of numbers at most), a hundred times the buckets of
/// the largest rules measured.
pub const MAX_BUCKET_ID: u32 = 1 << 20;

/// What a wire entry says of its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Named<'a> {
    /// Names, and the number they bind on this stream (0: none).
    Names {
        service: &'a str,
        bucket: &'a str,
        id: u32,
    },
    /// A number alone, bound by an earlier entry of the stream.
    Id(u32),
}

impl<'a> Named<'a> {
    pub fn of(service: &'a str, bucket: &'a str, id: u32) -> Self {
        if id == 0 || !service.is_empty() || !bucket.is_empty() {
            Named::Names {
                service,
                bucket,
                id,
            }
        } else {
            Named::Id(id)
        }
    }
}

/// A sender's side of one stream: which of its numbers the receiver has the names of, and
/// whether it takes numbers alone.
#[derive(Debug, Clone, Default)]
pub(crate) struct Told {
    told: Vec<bool>,
    takes_ids: bool,
}

impl Told {
    /// The receiver said whether it takes entries by number alone.
    pub fn set_takes_ids(&mut self, takes: bool) {
        self.takes_ids = takes;
    }

    pub fn takes_ids(&self) -> bool {
        self.takes_ids
    }

    /// Whether an entry of bucket `id`, sent with its number, goes with its names: the first
    /// time on the stream, and every time until the receiver said it takes numbers alone (a
    /// receiver that takes them bound the number the first time all the same).
    pub fn names_due(&mut self, id: u32) -> bool {
        if id == 0 || id > MAX_BUCKET_ID {
            return true;
        }
        let at = id as usize;
        if at >= self.told.len() {
            self.told.resize(at + 1, false);
        }
        let first = !std::mem::replace(&mut self.told[at], true);
        first || !self.takes_ids
    }

    /// An entry that carried the names of `id` was lost: they go again with the next.
    pub fn forget(&mut self, id: u32) {
        if let Some(told) = self.told.get_mut(id as usize) {
            *told = false;
        }
    }

    /// Every name goes again (the numbers now stand for other buckets).
    pub fn forget_all(&mut self) {
        self.told.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_named_when_it_has_names_or_no_number() {
        assert_eq!(
            Named::of("api", "all", 3),
            Named::Names {
                service: "api",
                bucket: "all",
                id: 3
            }
        );
        assert_eq!(Named::of("", "", 3), Named::Id(3));
        assert_eq!(
            Named::of("", "", 0),
            Named::Names {
                service: "",
                bucket: "",
                id: 0
            }
        );
    }

    #[test]
    fn names_go_until_the_receiver_takes_numbers_once_per_bucket_and_again_once_forgotten() {
        let mut told = Told::default();
        assert!(told.names_due(1) && told.names_due(1), "not yet asked for");
        told.set_takes_ids(true);
        assert!(!told.names_due(1), "named before");
        assert!(told.names_due(2));
        assert!(!told.names_due(2));
        told.forget(1);
        assert!(told.names_due(1));
        assert!(!told.names_due(2));
        told.forget_all();
        assert!(told.names_due(2));
        assert!(told.names_due(MAX_BUCKET_ID + 1) && told.names_due(MAX_BUCKET_ID + 1));
    }
}
