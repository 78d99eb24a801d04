//! Spillway's control plane servers: zone aggregators and regional controllers that
//! coordinate global buckets with their peers.
//!
//! ```text
//! client --Report--> Aggregator (zone) --ZoneReport--> Controller (region) <--RegionSums--> peers
//!   ^                    |                                  |
//!   +---Instructions-----+<---------ZoneInstructions--------+
//! ```
//! Each server is a thin driver of a sans-IO core of `spillway-loop` (`ZoneCore`, `RegionCore`):
//! it moves messages between streams and the core, gives the core the wall clock, and serves
//! what the core knows on its admin listener. The simulator drives the same cores in simulated
//! time. Every tier works on the same wall-clock intervals, so sums of one interval meet
//! without coordination, and each tier forwards an interval the moment it is complete. At 1.5x
//! a global limit, every client in every region receives a drop ratio of 1/3 about one network
//! round trip after the interval in which the load arrived.
#![forbid(unsafe_code)]

pub mod aggregator;
pub mod controller;
mod error;
mod intervals;
/// The bounds and serving of every gRPC listener, kept by spillway-net.
pub use spillway_net::grpc as listener;
pub mod rules;
mod serve;
pub mod trust;

pub use aggregator::{Aggregator, AggregatorOptions, InstructionsRx, LocalClient, LocalClients};
pub use controller::{Controller, ControllerOptions};
pub use error::ControlError;
pub use listener::{CallKind, GrpcLimits, Listener, serve_grpc};
pub use rules::FileRules;
pub use spillway_tls::TlsSource;
