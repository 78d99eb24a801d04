//! Which bucket of a configuration asks for the Redis store: what the store (and, without the
//! `redis` feature, its stand-in that refuses such a configuration) looks for first.

use spillway_core::config::{Config, StateStore};

/// The service and name of the configuration's first `store: redis` bucket.
pub(crate) fn first_redis_bucket(config: &Config) -> Option<(&str, &str)> {
    config.services.iter().find_map(|service| {
        service
            .buckets
            .iter()
            .find(|b| b.store == StateStore::Redis)
            .map(|b| (service.name.as_str(), b.name.as_str()))
    })
}
