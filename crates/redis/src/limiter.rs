//! Exact decisions in Redis: one script call per decision, bounded by a short timeout.

use std::time::Duration;

use spillway_core::decision::{NEVER, Verdict};

use crate::algo::ExactAlgo;
use crate::endpoint::{Endpoint, RedisEndpoint};
use crate::key::RedisKey;
use crate::password::{Password, PasswordError};
use crate::script::ScriptKind;

/// Why Redis could not decide. Every variant is a store failure: the caller applies the
/// bucket's `on_store_failure`, it never turns one into a drop by itself.
#[derive(Debug, thiserror::Error)]
pub enum ExactError {
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("redis failed: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(
        "the {script:?} script answered {reply:?}, not [allowed, retry_after_us, remaining, granted]"
    )]
    BadReply { script: ScriptKind, reply: Vec<i64> },
    /// The process's Redis password could not be read (`redis.password_file`).
    #[error("{0}")]
    Password(#[from] PasswordError),
}

impl ExactError {
    /// Whether the failure was the deadline rather than an error Redis or the socket reported.
    pub fn is_timeout(&self) -> bool {
        match self {
            ExactError::Timeout(_) => true,
            ExactError::Redis(e) => e.is_timeout(),
            ExactError::BadReply { .. } | ExactError::Password(_) => false,
        }
    }
}

/// How a limiter talks to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreOptions {
    /// The longest a decision waits for Redis, connecting included. A decision must stay well
    /// under the 10 ms budget of a Redis-backed decision when Redis is healthy; when it is not, this is how long a request
    /// waits before the breaker's policy decides it.
    pub timeout: Duration,
}

impl Default for StoreOptions {
    /// 100 ms: twenty times a healthy Redis round trip across a zone, far below a user's
    /// patience.
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(100),
        }
    }
}

/// Everything a script says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptAnswer {
    /// Allowed, or denied with the time after which the same request fits.
    pub verdict: Verdict,
    /// Units that would still be admitted right after this request (for `ratelimit` headers).
    pub remaining: u64,
    /// Units taken from the bucket: the cost when allowed, 0 when denied, and up to `want` when a
    /// batch was asked for.
    pub granted: u64,
}

/// Decides requests of exact buckets in one Redis endpoint.
/// What a token budget's debit left: how long until one unit has room again (zero when the
/// bucket is not in debt), and the units still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debit {
    pub owed: Duration,
    pub remaining: u64,
}

pub struct RedisLimiter {
    endpoint: Endpoint,
    timeout: Duration,
    /// The target, passwords hidden, for log lines.
    name: String,
}

impl RedisLimiter {
    /// A limiter for `target`. It connects on the first decision, so it can be built while Redis
    /// is down; it fails only on a malformed URL.
    pub fn new(target: RedisEndpoint, options: StoreOptions) -> Result<Self, ExactError> {
        Self::with_password(target, None, options)
    }

    /// Like [`RedisLimiter::new`], authenticating with `password` (which replaces any password
    /// written in the target's URLs): the process's own, from [`Password::resolve`].
    pub fn with_password(
        target: RedisEndpoint,
        password: Option<Password>,
        options: StoreOptions,
    ) -> Result<Self, ExactError> {
        Ok(Self {
            endpoint: Endpoint::new(&target, options.timeout, password.as_ref())?,
            timeout: options.timeout,
            name: target.describe(),
        })
    }

    /// The deadline of one decision.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The target as log lines name it, passwords hidden: `redis://127.0.0.1:6379`,
    /// `sentinel master mymaster via redis://...`, `cluster via redis://..., redis://...`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends Redis a `PING` (on a cluster, every primary), within the timeout: the breaker's
    /// probe, the cheapest call that proves the endpoint answers. Like a decision, it connects
    /// first when there is no connection, and drops a connection that fails.
    pub async fn ping(&self) -> Result<(), ExactError> {
        self.bounded(async {
            let mut con = self.endpoint.connection().await?;
            redis::cmd("PING").query_async::<()>(&mut con).await?;
            Ok(())
        })
        .await
    }

    /// Decides a request of `cost` units against the bucket at `key`, charging it when allowed.
    pub async fn decide(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
    ) -> Result<Verdict, ExactError> {
        Ok(self.decide_detailed(key, algo, cost).await?.verdict)
    }

    /// Like [`Self::decide`], with what remains in the bucket.
    pub async fn decide_detailed(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
    ) -> Result<ScriptAnswer, ExactError> {
        self.take(key, algo, cost, cost).await
    }

    /// Decides a request of `cost` and, when it fits, takes up to `want` units at once (at least
    /// `cost`), for the caller to spend locally. Only the token bucket takes more than
    /// `cost`; the other algorithms grant exactly `cost`.
    pub async fn take(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
        want: u64,
    ) -> Result<ScriptAnswer, ExactError> {
        self.bounded(self.call(key, algo, cost, want)).await
    }

    /// Debits `cost` units a response reported from the token budget at `key`, whatever it
    /// holds: one call of the debit script. Answers how long the bucket is in debt.
    pub async fn debit(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
    ) -> Result<Debit, ExactError> {
        self.bounded(async {
            let mut con = self.endpoint.connection().await?;
            let reply = ScriptKind::Debit
                .run(&mut con, &[key.as_str()], &algo.debit_args(cost))
                .await?;
            match reply.as_slice() {
                [owed, remaining] => Ok(Debit {
                    owed: Duration::from_micros(u64::try_from(*owed).unwrap_or(0)),
                    remaining: u64::try_from(*remaining).unwrap_or(0),
                }),
                _ => Err(ExactError::BadReply {
                    script: ScriptKind::Debit,
                    reply,
                }),
            }
        })
        .await
    }

    /// Runs `call` within the timeout, dropping the connection when the failure says so.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, ExactError>>,
    ) -> Result<T, ExactError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                if let ExactError::Redis(e) = &e {
                    self.endpoint.after_error(e);
                }
                Err(e)
            }
            Err(_) => {
                // The socket may be stuck behind a dead peer; start afresh next time.
                self.endpoint.forget();
                Err(ExactError::Timeout(self.timeout))
            }
        }
    }

    async fn call(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
        want: u64,
    ) -> Result<ScriptAnswer, ExactError> {
        let mut con = self.endpoint.connection().await?;
        let script = algo.script();
        let companion;
        let keys: &[&str] = match script {
            ScriptKind::SlidingWindowLog => {
                companion = key.companion("meta");
                &[key.as_str(), &companion]
            }
            _ => &[key.as_str()],
        };
        let reply = script.run(&mut con, keys, &algo.args(cost, want)).await?;
        parse(script, reply)
    }
}

fn parse(script: ScriptKind, reply: Vec<i64>) -> Result<ScriptAnswer, ExactError> {
    let &[allowed, retry_us, remaining, granted] = reply.as_slice() else {
        return Err(ExactError::BadReply { script, reply });
    };
    let verdict = match (allowed, retry_us) {
        (1, _) => Verdict::Allow,
        (0, -1) => Verdict::Deny { retry_after: NEVER },
        (0, us) if us >= 0 => Verdict::Deny {
            retry_after: Duration::from_micros(us.unsigned_abs()),
        },
        _ => return Err(ExactError::BadReply { script, reply }),
    };
    Ok(ScriptAnswer {
        verdict,
        remaining: u64::try_from(remaining).unwrap_or(0),
        granted: u64::try_from(granted).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_map_to_verdicts() {
        let s = ScriptKind::TokenBucket;
        assert_eq!(parse(s, vec![1, 0, 9, 1]).unwrap().verdict, Verdict::Allow);
        assert_eq!(
            parse(s, vec![0, 1_500, 0, 0]).unwrap().verdict,
            Verdict::Deny {
                retry_after: Duration::from_micros(1_500)
            }
        );
        assert_eq!(
            parse(s, vec![0, -1, 3, 0]).unwrap().verdict,
            Verdict::Deny { retry_after: NEVER }
        );
        assert!(matches!(
            parse(s, vec![1, 0]),
            Err(ExactError::BadReply { .. })
        ));
        assert!(matches!(
            parse(s, vec![0, -7, 0, 0]),
            Err(ExactError::BadReply { .. })
        ));
    }
}
