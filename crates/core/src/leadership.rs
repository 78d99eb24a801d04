//! Which controller of a region leads: the lease as the control plane sees it, whoever keeps it
//! (`spillway-db` holds it in the rules store's database; a controller without a lease store
//! always leads, at epoch 0).
//!
//! Each takeover of a region's lease raises its epoch, so instructions stamped with the epoch of
//! the leader that computed them can be told apart: a receiver that saw epoch 5 drops epoch 4's,
//! and a leader that was paused past its lease cannot undo its successor.

use std::time::Instant;

/// One controller's view of its region's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// The lease's epoch: this controller's own while it leads, else the latest it saw held by
    /// another (0: no lease store, or none seen yet).
    pub epoch: u64,
    /// Until when this controller may instruct (its lease, measured on its own monotonic clock
    /// from before the renewal was asked for); `None` when it does not lead.
    pub until: Option<Instant>,
    /// Where the leader takes aggregators' streams (its advertised URL), when it is another
    /// controller and known.
    pub leader_url: Option<String>,
}

impl Leadership {
    /// A controller without a lease store: it leads, forever, at epoch 0.
    pub fn alone() -> Self {
        Self {
            epoch: 0,
            until: None,
            leader_url: None,
        }
        .leading_forever()
    }

    fn leading_forever(mut self) -> Self {
        // Far enough away never to be reached, near enough not to overflow an `Instant`.
        self.until = Instant::now().checked_add(std::time::Duration::from_secs(100 * 365 * 86_400));
        self
    }

    /// A standby that has not heard of any leader yet.
    pub fn standby() -> Self {
        Self {
            epoch: 0,
            until: None,
            leader_url: None,
        }
    }

    /// Whether this controller holds the lease (it may have lapsed: see [`Leadership::leads_at`]).
    pub fn is_leader(&self) -> bool {
        self.until.is_some()
    }

    /// Whether this controller may instruct at `now`: it holds a lease that has not lapsed.
    pub fn leads_at(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_controller_alone_leads_and_a_standby_does_not() {
        let now = Instant::now();
        assert!(Leadership::alone().leads_at(now + Duration::from_secs(86_400)));
        assert_eq!(Leadership::alone().epoch, 0);
        assert!(!Leadership::standby().leads_at(now));
        assert!(!Leadership::standby().is_leader());
    }

    #[test]
    fn a_lapsed_lease_no_longer_instructs() {
        let now = Instant::now();
        let lease = Leadership {
            epoch: 3,
            until: Some(now + Duration::from_secs(3)),
            leader_url: None,
        };
        assert!(lease.leads_at(now + Duration::from_secs(2)));
        assert!(!lease.leads_at(now + Duration::from_secs(3)));
        assert!(lease.is_leader());
    }
}
