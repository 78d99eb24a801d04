//! The control loop's sans-IO cores: every tier's state machine, with events and time in
//! and steps out, and no I/O, clock or task of its own.
//!
//! ```text
//! HostCore --Report--> ZoneCore (zone) --ZoneReport--> RegionCore (region) <--RegionSums--> peers
//!    ^                     |                                 |
//!    +---Instructions------+<---------ZoneInstructions-------+
//! ```
//! The servers of `spillway-control` and the link of `spillway-link` drive these cores with the
//! wall clock and real streams; the simulator of `spillway-sim` drives the very same cores with
//! simulated time and a simulated network. Every tier works on the same wall-clock intervals
//! ([`Interval`]), so sums of one interval meet without coordination, and each tier forwards an
//! interval the moment it is complete. At 1.5x a global limit, every host in every region
//! receives a drop ratio of 1/3 about one network round trip after the interval in which the load
//! arrived.
#![forbid(unsafe_code)]

pub mod bucket_ids;
pub mod fence;
pub mod host;
pub mod interval;
pub mod ledger;
pub mod plausible;
pub mod region;
pub mod rules;
pub mod sums;
pub mod tally;
pub mod zone;

pub use bucket_ids::MAX_BUCKET_ID;
pub use fence::Fence;
pub use host::{HostCore, HostId, HostStep, HostTime, SteeredLimiter, StepApplied};
pub use interval::{Interval, MAX_INTERVAL_MS, MIN_INTERVAL_MS};
pub use ledger::{HistoryBatch, HistoryRow, Ledger};
pub use plausible::{ClampCounts, ClampReason, CountClamp, Factors, PlausibleBounds};
pub use region::{
    BucketView, HOLD_NOISE, HostView, PARTITION_HOLD, RegionCore, RegionStep, SharedInstructions,
    global_sums,
};
pub use rules::{DecodeRules, LinkRules, RulesError, RulesMessage, RulesSnapshot};
pub use sums::{BucketKey, Counts, Intervals, Sums};
pub use tally::{Counted, Tally};
pub use zone::{ClampNotice, NOTICE_EVERY_MS, ZoneCore, ZoneStep, host_shares};
