//! Exact decisions behind the endpoint's circuit breaker, with each bucket's failure policy (S8).

use std::time::{Duration, Instant};

use spillway_core::config::FailurePolicy;
use spillway_core::decision::Verdict;

use crate::algo::ExactAlgo;
use crate::breaker::{BreakerConfig, CallOutcome, CircuitBreaker};
use crate::key::RedisKey;
use crate::limiter::{Answer, RedisLimiter};

/// Why a decision did not come from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The circuit was open (or half-open and this request was not a probe): Redis was not asked.
    CircuitOpen,
    /// Redis was asked and failed or timed out.
    StoreFailed,
}

/// A guarded decision: the verdict, and whether the failure policy made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarded {
    pub verdict: Verdict,
    /// `None` when Redis decided; otherwise the bucket's `on_store_failure` did.
    pub fallback: Option<Fallback>,
    /// Units left in the bucket, when Redis decided.
    pub remaining: Option<u64>,
}

/// A [`RedisLimiter`] and the [`CircuitBreaker`] of its endpoint.
///
/// No decision waits longer than the limiter's timeout: an open circuit answers at once, and
/// a call that reaches Redis is cut at the deadline.
pub struct GuardedLimiter {
    limiter: RedisLimiter,
    breaker: CircuitBreaker,
}

impl GuardedLimiter {
    /// Guards `limiter` with a breaker configured by `config`.
    pub fn new(limiter: RedisLimiter, config: BreakerConfig) -> Self {
        Self {
            limiter,
            breaker: CircuitBreaker::new(config),
        }
    }

    /// The breaker, for its state and counters.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// The unguarded limiter.
    pub fn limiter(&self) -> &RedisLimiter {
        &self.limiter
    }

    /// Decides a request of `cost`; when Redis cannot, `on_failure` does: `Closed` denies with a
    /// retry-after of the time until the breaker probes again, `Open` allows.
    pub async fn decide(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
        on_failure: FailurePolicy,
    ) -> Guarded {
        match self.try_take(key, algo, cost, cost).await {
            Ok(answer) => Guarded {
                verdict: answer.verdict,
                fallback: None,
                remaining: Some(answer.remaining),
            },
            Err(fallback) => Guarded {
                verdict: self.policy_verdict(on_failure),
                fallback: Some(fallback),
                remaining: None,
            },
        }
    }

    /// The verdict of `policy` for a request Redis could not decide.
    pub fn policy_verdict(&self, policy: FailurePolicy) -> Verdict {
        match policy {
            FailurePolicy::Open => Verdict::Allow,
            FailurePolicy::Closed => Verdict::Deny {
                retry_after: self.retry_hint(),
            },
        }
    }

    fn retry_hint(&self) -> Duration {
        self.breaker.retry_hint(Instant::now())
    }

    /// [`RedisLimiter::take`] through the breaker; `Err` says why Redis did not decide.
    pub async fn try_take(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
        want: u64,
    ) -> Result<Answer, Fallback> {
        let Some(permit) = self.breaker.permit(Instant::now()) else {
            return Err(Fallback::CircuitOpen);
        };
        let result = self.limiter.take(key, algo, cost, want).await;
        let outcome = match &result {
            Ok(_) => CallOutcome::Success,
            Err(e) if e.is_timeout() => CallOutcome::Timeout,
            Err(_) => CallOutcome::Error,
        };
        self.breaker.record(permit, outcome, Instant::now());
        result.map_err(|_| Fallback::StoreFailed)
    }
}
