//! Spillway's control plane (G5-G13): zone aggregators, regional controllers that coordinate
//! global buckets with their peers, and the client side of the link.
//!
//! ```text
//! client --Report--> Aggregator (zone) --ZoneReport--> Controller (region) <--RegionSums--> peers
//!   ^                    |                                  |
//!   +---Instructions-----+<---------ZoneInstructions--------+
//! ```
//! Every tier works on the same wall-clock intervals ([`timing`]), so sums of one interval meet
//! without coordination, and each tier forwards an interval the moment it is complete. At
//! 1.5x a global limit, every client in every region receives a drop ratio of 1/3 about one
//! network round trip after the interval in which the load arrived.
#![forbid(unsafe_code)]

pub mod admin;
pub mod aggregator;
pub mod controller;
mod error;
pub mod link;
mod net;
pub mod rules;
pub mod sums;
pub mod timing;

pub use aggregator::{Aggregator, AggregatorOptions};
pub use controller::{BucketView, Controller, ControllerOptions, HostView};
pub use error::ControlError;
pub use link::{
    BucketReport, ClientLink, Instruction, InstructionSink, LinkOptions, LinkStatus, ReportSource,
};
pub use net::accept_or_stop;
pub use rules::{FileRules, RulesSnapshot};
pub use sums::{BucketKey, Counts, Sums};
pub use timing::{Backoff, Interval};
