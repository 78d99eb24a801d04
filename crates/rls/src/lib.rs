//! Envoy's Rate Limit Service v3: `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit` answered from the process's own [`spillway_client::Client`], so a descriptor
//! bucket that counts locally or follows the control plane is decided without a network call,
//! and a `store: redis` one with the one Redis call the HTTP path makes.
//!
//! [`decide`] turns a request into an answer (or a [`BadRequest`]); [`Rls`] is the tonic service
//! around it and [`serve`] runs it on a listener, in plaintext or mutual TLS.
//!
//! Envoy's Rate Limit Quota Service v3 (`StreamRateLimitQuotas`) is here too: [`Rlqs`] makes
//! each RLQS host (a client identity, or a connection, with all its streams) a host of an
//! aggregator's zone ([`quota`] is its sans-IO core), served by [`serve_rlqs`] (`spillway
//! aggregator --rlqs-listen`). The messages are Envoy's own, generated from its .proto files by
//! the `envoy-types` crate ([`pb`]).

#![forbid(unsafe_code)]

mod assign;
mod caps;
mod decide;
mod peer;
pub mod quota;
pub mod rlqs;
mod server;

pub use decide::{BadRequest, MAX_DESCRIPTORS, MAX_ENTRIES, RlsOptions, decide, envoy_unit};
pub use rlqs::{Rlqs, RlqsLimits};
pub use server::{Rls, RlsServer, serve, serve_rlqs, serve_rlqs_with, serve_with};
pub use spillway_net::grpc::GrpcLimits;

/// Envoy's generated messages and services (`envoy-types`), for callers and tests that speak RLS.
pub mod pb {
    pub use envoy_types::pb::envoy::config::core::v3::HeaderValue;
    pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        Code, DescriptorStatus, RateLimit,
    };
    pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
        RateLimitService, RateLimitServiceServer,
    };
    pub use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    pub use envoy_types::pb::google::protobuf::{Duration, UInt64Value};

    /// A request of `domain` with one descriptor per list of `(key, value)` entries and no
    /// `hits_addend` (a cost of 1): `request("edge", &[&[("remote_address", "10.0.0.1")]])`.
    pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(key, value)| Entry {
                            key: (*key).into(),
                            value: (*value).into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }
}
