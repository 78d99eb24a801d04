//! Fencing: a receiver of instructions follows the newest controller epoch it has seen, so a
//! leader that was paused past its lease (a stopped process, a long stall, a partition) and
//! wakes still sending cannot undo its successor's instructions.
//!
//! An epoch is remembered for as long as its instructions would be: when no instruction of it
//! came within their TTL, the receiver would fail open anyway and takes the next instructions
//! of any epoch (a lease store that was recreated starts again at epoch 1).

/// The newest epoch a receiver applied and when, and how many instructions it dropped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fence {
    epoch: u64,
    /// When instructions of `epoch` last arrived, and their TTL.
    seen_ms: u64,
    ttl_ms: u64,
    dropped: u64,
}

impl Fence {
    /// Whether instructions of `epoch` with a TTL of `ttl_ms`, arriving at `now_ms`, apply;
    /// when they do, their epoch is the one to follow from now on.
    ///
    /// After instructions of epoch 5 at 10,000 ms with a TTL of 3,000 ms, epoch 4's are dropped
    /// until 13,000 ms and taken after it; epoch 5's and 6's always apply.
    pub fn admit(&mut self, epoch: u64, ttl_ms: u64, now_ms: u64) -> bool {
        let remembered = now_ms.saturating_sub(self.seen_ms) < self.ttl_ms;
        if epoch < self.epoch && remembered {
            self.dropped += 1;
            return false;
        }
        self.epoch = epoch;
        self.seen_ms = now_ms;
        self.ttl_ms = ttl_ms;
        true
    }

    /// The epoch followed (0: none seen, or controllers without a lease).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Instructions dropped for an older epoch, so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_epoch_is_dropped_while_the_newer_one_holds() {
        let mut fence = Fence::default();
        assert!(fence.admit(5, 3_000, 10_000));
        assert!(!fence.admit(4, 3_000, 10_500), "the paused leader's epoch");
        assert!(!fence.admit(4, 3_000, 12_999));
        assert!(fence.admit(5, 3_000, 11_000));
        assert!(
            !fence.admit(4, 3_000, 13_999),
            "remembered from the renewed 5"
        );
        assert!(fence.admit(6, 3_000, 12_000));
        assert_eq!(fence.epoch(), 6);
        assert_eq!(fence.dropped(), 3);
    }

    #[test]
    fn a_forgotten_epoch_no_longer_fences() {
        let mut fence = Fence::default();
        assert!(fence.admit(7, 3_000, 10_000));
        // Nothing of epoch 7 for a whole TTL: the receiver failed open, and follows whoever
        // instructs now, even at a lower epoch (a recreated lease store).
        assert!(fence.admit(1, 3_000, 13_000));
        assert_eq!(fence.epoch(), 1);
        assert_eq!(fence.dropped(), 0);
    }

    #[test]
    fn controllers_without_a_lease_are_never_fenced() {
        let mut fence = Fence::default();
        for t in 0..10 {
            assert!(fence.admit(0, 3_000, t * 1_000));
        }
        assert_eq!(fence.dropped(), 0);
    }
}
