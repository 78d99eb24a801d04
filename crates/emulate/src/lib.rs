//! `spillway emulate`: a fleet of hosts in one process on real sockets, to measure what a fleet
//! costs the control plane (an aggregator's CPU and memory at ten thousand hosts, a reconnect
//! storm, how fast a 15x step is cut) without ten thousand sidecars.
//!
//! Each emulated host is what a sidecar's control link is, minus the proxy: a
//! `spillway_link::ClientLink`, with its own `HostCore`, its own stream to the aggregator (over
//! mutual TLS with a certificate of its own when asked), its surge guard and its reconnects. Only
//! the load is emulated ([`host`]): each host offers its share of the fleet's rate as a fluid,
//! shaped by [`LoadShape`], and admits what its limiter's drop ratio keeps. The run is read every
//! 100 ms and summed up as JSON ([`FleetSummary`]): hosts linked, reports sent, instruction sets
//! received, and the fleet's admitted rate against the limit per second.
#![forbid(unsafe_code)]

mod fleet;
pub mod host;
mod record;
mod shape;

pub use fleet::{EmulateError, FleetOptions, HostCerts, control_buckets, host_id, run};
pub use record::{FleetSummary, Record, Second, StepEnforcement};
pub use shape::{LoadShape, LoadStep, LoadStepError};
pub use spillway_link::Backoff;
