//! Spillway's control-plane protocol, `spillway.v1`, generated from `proto/spillway/v1/control.proto`.
//!
//! Clients stream [`v1::Report`]s to their zone's aggregator and receive [`v1::Instructions`];
//! aggregators stream [`v1::ZoneReport`]s to their region's controller; controllers exchange
//! [`v1::RegionSums`] of global buckets with their peers. Drop ratios and shares travel in fixed
//! point, `raw / 2^32`, the core's `Ratio` representation: 1/3 is 1,431,655,766.
#![forbid(unsafe_code)]

/// The generated messages, clients and servers of `spillway.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("spillway.v1");
}

pub mod codec;

/// The aggregator's server of `spillway.v1.Aggregator`, the same service as
/// [`v1::aggregator_server`] on the wire, whose instructions are sent already encoded
/// ([`codec::Encoded`]): an aggregator encodes the zone's instructions once per interval, not
/// once per host.
pub mod encoded {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/spillway.v1.Aggregator.rs"));
}

/// The largest message either side accepts: a report of 100,000 buckets, or a large rules file.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
