//! `store: redis` buckets: their keys and algorithms, and the one Redis endpoint they
//! share, behind its circuit breaker. Built only with the `redis` feature; without it,
//! `store_off.rs` stands in with the same items, none of which can exist.
//!
//! Every exact bucket of a configuration counts in the Redis of its `redis` section, through one
//! [`GuardedLimiter`]: one multiplexed connection and one breaker for the endpoint, since when
//! Redis is down it is down for every bucket. Each request costs one `EVALSHA` per matching
//! exact bucket, so the limit holds exactly across every proxy that shares the Redis, unless the
//! bucket asks for hot-key batching (`batch: N`): then its keys are decided through a
//! [`Batcher`] of its own, which takes up to N tokens per call and spends them locally, trading
//! up to N - 1 tokens per proxy and key of exactness for up to N times fewer calls. The batcher
//! lives with the bucket's state, so a reload that leaves the bucket alone keeps its leases.

use std::sync::Arc;

use spillway_core::algo::Rate;
use spillway_core::config::{Bucket, Config, FailurePolicy, Redis, RedisTarget};
use spillway_core::decision::Verdict;
use spillway_core::pattern::{Pattern, SubjectKind, SubjectValue};
pub(crate) use spillway_redis::RedisKey;
use spillway_redis::{
    BatchConfig, Batcher, BreakerConfig, BreakerStats, ExactAlgo, GuardedLimiter, Password,
    RedisEndpoint, RedisLimiter, StoreOptions,
};

use crate::error::ClientError;
use crate::redis_bucket::first_redis_bucket;

/// The Redis endpoint of a configuration and its breaker.
pub(crate) struct ExactStore {
    redis: Redis,
    guarded: GuardedLimiter,
}

impl std::fmt::Debug for ExactStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExactStore")
            .field("redis", &self.redis)
            .field("circuit", &self.guarded.breaker().state())
            .finish_non_exhaustive()
    }
}

impl ExactStore {
    /// The store of `config`: `previous`'s when the `redis` section did not change (so a reload
    /// keeps the connection and the breaker's state), a new one when it did, none without one.
    /// A `store: redis` bucket in a configuration without a `redis` section is an error.
    pub(crate) fn for_config(
        config: &Config,
        previous: Option<&Arc<ExactStore>>,
    ) -> Result<Option<Arc<Self>>, ClientError> {
        let Some(redis) = &config.redis else {
            // A validated file cannot get here; rules merged from a store into a file can, and
            // compiled anyway, the bucket would admit everything.
            return match first_redis_bucket(config) {
                Some((service, bucket)) => Err(ClientError::NoRedis {
                    service: service.to_owned(),
                    bucket: bucket.to_owned(),
                }),
                None => Ok(None),
            };
        };
        if let Some(previous) = previous
            && previous.redis == *redis
        {
            return Ok(Some(previous.clone()));
        }
        let target = match &redis.target {
            RedisTarget::Single { url } => RedisEndpoint::single(url.clone()),
            RedisTarget::Sentinel { master, nodes } => {
                RedisEndpoint::sentinel(master, nodes.clone())
            }
            RedisTarget::Cluster { nodes } => RedisEndpoint::cluster(nodes.clone()),
        };
        // The process's own password (its `redis.password_file`, or SPILLWAY_REDIS_PASSWORD),
        // read here, when the section is first used or changes.
        let password = Password::resolve(redis.password_file.as_deref())
            .map_err(|e| ClientError::Redis(e.into()))?;
        let limiter = RedisLimiter::with_password(
            target,
            password,
            StoreOptions {
                timeout: redis.timeout,
            },
        )
        .map_err(ClientError::Redis)?;
        Ok(Some(Arc::new(Self {
            redis: redis.clone(),
            guarded: GuardedLimiter::new(limiter, BreakerConfig::default()),
        })))
    }

    /// Decides a request of `cost` to `bucket` in Redis, under `key` (the request's subject key
    /// of a per-subject bucket) or the bucket's own (from its batcher's tokens when it holds
    /// enough), or by `on_failure` when Redis cannot answer.
    pub(crate) async fn decide(
        &self,
        bucket: &ExactBucket,
        key: Option<&RedisKey>,
        cost: u64,
        on_failure: FailurePolicy,
    ) -> Verdict {
        self.decide_remaining(bucket, key, cost, on_failure).await.0
    }

    /// Like [`ExactStore::decide`], with the units Redis says are left (`None` when the failure
    /// policy decided).
    pub(crate) async fn decide_remaining(
        &self,
        bucket: &ExactBucket,
        key: Option<&RedisKey>,
        cost: u64,
        on_failure: FailurePolicy,
    ) -> (Verdict, Option<u64>) {
        let key = key.unwrap_or_else(|| bucket.key());
        let guarded = match bucket.batcher() {
            Some(batcher) => {
                batcher
                    .decide(&self.guarded, key, bucket.algo(), cost, on_failure)
                    .await
            }
            None => {
                self.guarded
                    .decide(key, bucket.algo(), cost, on_failure)
                    .await
            }
        };
        (guarded.verdict, guarded.remaining)
    }

    /// Debits `cost` units a response reported from a token budget in Redis (at `key`, a
    /// subject's, or the bucket's own): one script call through the breaker. How long the
    /// bucket (or subject) is in debt, `None` when Redis could not take the debit.
    pub(crate) async fn debit(
        &self,
        bucket: &ExactBucket,
        key: Option<&RedisKey>,
        cost: u64,
    ) -> Option<std::time::Duration> {
        self.guarded
            .debit(key.unwrap_or_else(|| bucket.key()), bucket.algo(), cost)
            .await
            .map(|debit| debit.owed)
    }

    /// What `policy` answers without asking Redis.
    pub(crate) fn policy_verdict(&self, policy: FailurePolicy) -> Verdict {
        self.guarded.policy_verdict(policy)
    }

    /// The breaker's state and counters.
    pub(crate) fn stats(&self) -> BreakerStats {
        self.guarded.breaker().stats()
    }
}

/// One `store: redis` bucket: its algorithm and where its key comes from.
#[derive(Debug)]
pub(crate) struct ExactBucket {
    algo: ExactAlgo,
    /// The service the bucket belongs to, so two services' buckets never share a key.
    service: Box<str>,
    /// The Redis key's `{scope}`: the bucket's subject, or `caller` when it has none.
    scope: &'static str,
    /// The Redis key's `{api}`: the bucket's procedure, `*` for every procedure.
    api: Box<str>,
    /// `Some` for per-subject buckets (`user: "*"`), whose key holds the request's value.
    each: Option<SubjectKind>,
    /// A descriptor bucket whose key holds the request's counted values.
    per_value: bool,
    /// The key of a bucket that is one counter for every request it matches.
    key: RedisKey,
    /// The leases of a bucket with `batch: N`, for every key of the bucket.
    batcher: Option<Batcher>,
}

impl ExactBucket {
    pub(crate) fn new(
        service: &str,
        bucket: &Bucket,
        rate: Rate,
        burst: Option<u64>,
    ) -> Result<Self, ClientError> {
        let algo = ExactAlgo::new(bucket.algorithm, rate, burst).map_err(|source| {
            ClientError::ExactAlgorithm {
                service: service.to_owned(),
                bucket: bucket.name.clone(),
                source,
            }
        })?;
        if let Some(descriptor) = &bucket.descriptor {
            // `rl:{svc:descriptor:VALUES:rl: foo, bar=banned}:fixed-window`: the descriptor as
            // the api, so two buckets whose counted values agree never share a key.
            let api: Box<str> = descriptor.to_string().into();
            return Ok(Self {
                key: RedisKey::qualified(service, "descriptor", "-", &api, bucket.algorithm.name()),
                algo,
                service: service.into(),
                scope: "descriptor",
                api,
                each: None,
                per_value: descriptor.is_per_value(),
                batcher: bucket.batch.map(|n| Batcher::new(BatchConfig::up_to(n))),
            });
        }
        let spec = &bucket.match_spec;
        let (scope, value, each) = match &spec.subject {
            Some(subject) => (
                subject.kind.key(),
                subject.value.as_str(),
                (subject.value == SubjectValue::Each).then_some(subject.kind),
            ),
            None => (
                "caller",
                spec.caller.as_ref().map_or("*", Pattern::as_str),
                None,
            ),
        };
        let api: Box<str> = spec.procedure.as_ref().map_or("*", Pattern::as_str).into();
        Ok(Self {
            key: RedisKey::qualified(service, scope, value, &api, bucket.algorithm.name()),
            algo,
            service: service.into(),
            scope,
            api,
            each,
            per_value: false,
            batcher: bucket.batch.map(|n| Batcher::new(BatchConfig::up_to(n))),
        })
    }

    /// Whether a descriptor bucket keys each request's counted values apart.
    pub(crate) fn per_value(&self) -> bool {
        self.per_value
    }

    /// The algorithm's kind and rate, to tell Envoy when the bucket resets.
    pub(crate) fn kind_rate(&self) -> (spillway_core::algo::Kind, Rate) {
        (self.algo.kind(), self.algo.rate())
    }

    /// The bucket's batcher, when it has `batch: N`.
    pub(crate) fn batcher(&self) -> Option<&Batcher> {
        self.batcher.as_ref()
    }

    pub(crate) fn algo(&self) -> &ExactAlgo {
        &self.algo
    }

    /// The subject whose every value has its own key, for per-subject buckets.
    pub(crate) fn subject(&self) -> Option<SubjectKind> {
        self.each
    }

    /// The key of a bucket without per-subject keys.
    pub(crate) fn key(&self) -> &RedisKey {
        &self.key
    }

    /// The key of subject value `value` of a per-subject bucket:
    /// `rl:{search:user:alice:/search}:sliding-window-log`, with a value longer than 256 bytes
    /// replaced by its SHA-256 ([`crate::subjects::subject_key`]), as every proxy does.
    pub(crate) fn subject_key(&self, value: &str) -> RedisKey {
        let mut hex = [0; 64];
        RedisKey::qualified(
            &self.service,
            self.scope,
            crate::subjects::subject_key(value, &mut hex),
            &self.api,
            self.algo.kind().name(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(yaml: &str) -> ExactBucket {
        let config = spillway_core::config::load_str(
            &format!(
                "version: 1\nredis: {{ url: redis://127.0.0.1:1 }}\nservices:\n  api:\n    buckets:\n      - {yaml}\n"
            ),
            "test.yaml",
        )
        .unwrap();
        let b = &config.services[0].buckets[0];
        let rate = Rate::new(b.limit.count.get(), b.limit.period).unwrap();
        ExactBucket::new("api", b, rate, b.burst.map(|n| n.get())).unwrap()
    }

    #[test]
    fn keys_follow_s5_with_the_service_and_the_algorithm() {
        let per_user = bucket(
            "{ name: q, match: { user: \"*\", procedure: /search }, limit: 5/s, algorithm: token-bucket, store: redis }",
        );
        assert_eq!(per_user.subject(), Some(SubjectKind::User));
        assert_eq!(
            per_user.subject_key("alice").as_str(),
            "rl:{api:user:alice:/search}:token-bucket"
        );
        // A value of more than 256 bytes keys by its SHA-256, the same on every proxy.
        assert_eq!(
            per_user.subject_key(&"a".repeat(257)).as_str(),
            "rl:{api:user:e8d95cc2b4bc198c54b40bd214df958afb65f5e73d2c2eafe0593cf5c635c1f0:/search}:token-bucket"
        );
        let one_org = bucket(
            "{ name: q, match: { org: acme }, limit: 5/s, algorithm: fixed-window, store: redis }",
        );
        assert_eq!(one_org.subject(), None);
        assert_eq!(one_org.key().as_str(), "rl:{api:org:acme:*}:fixed-window");
        let caller = bucket(
            "{ name: q, match: { caller: gw, procedure: /pay }, limit: 5/s, algorithm: sliding-window-log, store: redis }",
        );
        assert_eq!(
            caller.key().as_str(),
            "rl:{api:caller:gw:/pay}:sliding-window-log"
        );
    }

    #[test]
    fn only_a_bucket_with_batch_gets_a_batcher_of_that_size() {
        let exact = bucket(
            "{ name: q, match: { procedure: /search }, limit: 5/s, algorithm: token-bucket, store: redis }",
        );
        assert!(exact.batcher().is_none());
        let hot = bucket(
            "{ name: q, match: { procedure: /search, user: \"*\" }, limit: 5000/s, algorithm: token-bucket, store: redis, batch: 10 }",
        );
        let batcher = hot.batcher().expect("batch: 10");
        assert_eq!(batcher.config().max_batch, 10);
        assert_eq!(batcher.config().min_batch, 1, "a quiet key stays exact");
    }

    #[test]
    fn two_services_and_two_algorithms_never_share_a_key() {
        let config = spillway_core::config::load_str(
            "version: 1\nredis: { url: redis://127.0.0.1:1 }\nservices:\n  orders:\n    buckets:\n      - { name: q, match: { ip: \"*\" }, limit: 5/s, algorithm: token-bucket, store: redis }\n  search:\n    buckets:\n      - { name: q, match: { ip: \"*\" }, limit: 5/s, algorithm: gcra, store: redis }\n",
            "test.yaml",
        )
        .unwrap();
        let keys: Vec<String> = config
            .services
            .iter()
            .map(|service| {
                let b = &service.buckets[0];
                let rate = Rate::new(b.limit.count.get(), b.limit.period).unwrap();
                let exact = ExactBucket::new(&service.name, b, rate, None).unwrap();
                exact.subject_key("10.0.0.7").as_str().to_owned()
            })
            .collect();
        assert_eq!(
            keys,
            [
                "rl:{orders:ip:10.0.0.7:*}:token-bucket",
                "rl:{search:ip:10.0.0.7:*}:gcra"
            ]
        );
    }
}
