//! `store: redis` buckets in a build without the `redis` feature: the items of `store.rs`, none
//! of which can exist, so the rest of the client is the same code in both builds. A configuration
//! that asks for Redis is refused when it loads, naming the bucket that asks.

use std::sync::Arc;

use spillway_core::algo::Rate;
use spillway_core::config::{Bucket, Config, FailurePolicy};
use spillway_core::decision::Verdict;
use spillway_core::pattern::SubjectKind;

use crate::error::ClientError;
use crate::redis_bucket::first_redis_bucket;

/// A request's key in Redis, which no request has in this build, since no bucket is ever exact
/// to make one. Unlike the other stand-ins it has a value, so that the code that would make one
/// is not flagged unreachable.
#[derive(Debug)]
pub(crate) struct RedisKey;

/// The Redis endpoint of a configuration, which this build never has.
#[derive(Debug)]
pub(crate) enum ExactStore {}

impl ExactStore {
    /// None, or why `config` cannot load here: its first `store: redis` bucket, else its `redis`
    /// section.
    pub(crate) fn for_config(
        config: &Config,
        _previous: Option<&Arc<ExactStore>>,
    ) -> Result<Option<Arc<Self>>, ClientError> {
        if let Some((service, bucket)) = first_redis_bucket(config) {
            return Err(not_built(service, bucket));
        }
        match config.redis {
            Some(_) => Err(ClientError::RedisSectionNotBuilt),
            None => Ok(None),
        }
    }

    pub(crate) async fn decide(
        &self,
        _bucket: &ExactBucket,
        _key: Option<&RedisKey>,
        _cost: u64,
        _on_failure: FailurePolicy,
    ) -> Verdict {
        match *self {}
    }

    pub(crate) fn policy_verdict(&self, _policy: FailurePolicy) -> Verdict {
        match *self {}
    }

    pub(crate) async fn decide_remaining(
        &self,
        _bucket: &ExactBucket,
        _key: Option<&RedisKey>,
        _cost: u64,
        _on_failure: FailurePolicy,
    ) -> (Verdict, Option<u64>) {
        match *self {}
    }
}

/// A `store: redis` bucket, which this build never has.
#[derive(Debug)]
pub(crate) enum ExactBucket {}

impl ExactBucket {
    /// Always the error: `ExactStore::for_config` refuses such a configuration first, and a
    /// bucket that got past it is refused here all the same.
    pub(crate) fn new(
        service: &str,
        bucket: &Bucket,
        _rate: Rate,
        _burst: Option<u64>,
    ) -> Result<Self, ClientError> {
        Err(not_built(service, &bucket.name))
    }

    pub(crate) fn subject(&self) -> Option<SubjectKind> {
        match *self {}
    }

    pub(crate) fn subject_key(&self, _value: &str) -> RedisKey {
        match *self {}
    }

    pub(crate) fn per_value(&self) -> bool {
        match *self {}
    }

    pub(crate) fn kind_rate(&self) -> (spillway_core::algo::Kind, Rate) {
        match *self {}
    }
}

fn not_built(service: &str, bucket: &str) -> ClientError {
    ClientError::RedisNotBuilt {
        service: service.to_owned(),
        bucket: bucket.to_owned(),
    }
}
