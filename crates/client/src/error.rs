//! The client's errors: a configuration that cannot be compiled, and instructions that name no
//! bucket able to follow them.

use spillway_core::algo::ParamError;
use spillway_core::config::ConfigError;

// With the `redis` feature, spillway-redis's errors; without it, `Infallible`, so the variants
// that carry them exist in every build (a `match` needs no `cfg`) and are never produced.
#[cfg(feature = "redis")]
use spillway_redis::{ExactError, UnsupportedAlgorithm};

/// Without the `redis` feature no Redis address is ever parsed, so [`ClientError::Redis`] is
/// never produced.
#[cfg(not(feature = "redis"))]
type ExactError = std::convert::Infallible;
/// Without the `redis` feature no exact bucket is ever built, so
/// [`ClientError::ExactAlgorithm`] is never produced.
#[cfg(not(feature = "redis"))]
type UnsupportedAlgorithm = std::convert::Infallible;

/// Why rules were not loaded or compiled. The old rules, if any, stay in force.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The file could not be read or is invalid; the message names `FILE:LINE:COLUMN`.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configuration is valid but a bucket's numbers do not fit its algorithm.
    #[error("service {service}, bucket {bucket}: {source}")]
    Bucket {
        service: String,
        bucket: String,
        #[source]
        source: ParamError,
    },
    /// A `store: redis` bucket uses an algorithm that has no Redis script.
    #[error("service {service}, bucket {bucket}: {source}")]
    ExactAlgorithm {
        service: String,
        bucket: String,
        #[source]
        source: UnsupportedAlgorithm,
    },
    /// The `redis` section names a server that cannot be addressed.
    #[error("redis: {0}")]
    Redis(#[source] ExactError),
    /// A `store: redis` bucket arrived (from a rules store merged into the proxy's own file)
    /// while the configuration has no `redis` section to decide it with.
    #[error(
        "service {service}, bucket {bucket}: store: redis needs a top-level `redis` section in this proxy's configuration, like `redis: {{ url: redis://127.0.0.1:6379 }}`"
    )]
    NoRedis { service: String, bucket: String },
    /// A `store: redis` bucket, and this build of spillway-client was made without the `redis`
    /// feature. Only produced without it.
    #[error(
        "service {service}, bucket {bucket}: store: redis, but this build of spillway-client has no Redis support; build it with the `redis` feature (the `spillway` binary's default features have it)"
    )]
    RedisNotBuilt { service: String, bucket: String },
    /// A `redis` section that no bucket uses, and this build of spillway-client was made without
    /// the `redis` feature (a bucket that uses it is [`ClientError::RedisNotBuilt`]). Refused
    /// rather than ignored, so a build without Redis fails when it starts, not when rules with
    /// `store: redis` buckets arrive later. Only produced without the feature.
    #[error(
        "redis: this build of spillway-client has no Redis support; build it with the `redis` feature (the `spillway` binary's default features have it), or remove the `redis` section"
    )]
    RedisSectionNotBuilt,
}

/// Why an instruction from the control plane was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstructionError {
    #[error("no bucket {bucket} in service {service} in the rules in force")]
    UnknownBucket { service: String, bucket: String },
    #[error(
        "bucket {bucket} of service {service} uses {algorithm}, which takes no drop ratio; only drop-ratio buckets follow drop ratios"
    )]
    NotDropRatio {
        service: String,
        bucket: String,
        algorithm: &'static str,
    },
}
