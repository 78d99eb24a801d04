//! Exact decisions behind the endpoint's circuit breaker, with each bucket's failure policy
//!, and the breaker's prober.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use spillway_core::config::FailurePolicy;
use spillway_core::decision::Verdict;

use crate::algo::ExactAlgo;
use crate::breaker::{BreakerConfig, BreakerStep, CallOutcome, CircuitBreaker};
use crate::key::RedisKey;
use crate::limiter::ExactError;
use crate::limiter::{Debit, RedisLimiter, ScriptAnswer};

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
///
/// From the moment the circuit leaves closed until it closes again, a prober task pings Redis
/// on the breaker's timer (every 250 ms while open, every 50 ms during the ramp, with the
/// defaults) and judges the ramp's stages as their time runs out, so the circuit recovers
/// within a bounded time whatever the traffic, none included. The task runs on the Tokio
/// runtime of the call that opened the circuit, beside the connection's own driver task; it
/// holds the limiter only while a ping is in flight and ends on its own once the limiter is
/// dropped.
pub struct GuardedLimiter {
    shared: Arc<Shared>,
}

struct Shared {
    limiter: RedisLimiter,
    breaker: CircuitBreaker,
}

impl GuardedLimiter {
    /// Guards `limiter` with a breaker configured by `config`, which names the limiter's
    /// target in its log lines.
    pub fn new(limiter: RedisLimiter, config: BreakerConfig) -> Self {
        let breaker = CircuitBreaker::named(config, limiter.name());
        Self {
            shared: Arc::new(Shared { limiter, breaker }),
        }
    }

    /// The breaker, for its state and counters.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.shared.breaker
    }

    /// The unguarded limiter.
    pub fn limiter(&self) -> &RedisLimiter {
        &self.shared.limiter
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
        self.breaker().retry_hint(Instant::now())
    }

    /// [`RedisLimiter::take`] through the breaker; `Err` says why Redis did not decide.
    pub async fn try_take(
        &self,
        key: &RedisKey,
        algo: &ExactAlgo,
        cost: u64,
        want: u64,
    ) -> Result<ScriptAnswer, Fallback> {
        let breaker = self.breaker();
        let Some(permit) = breaker.permit() else {
            // The prober normally runs already (one atomic load); this starts another if its
            // runtime went away.
            self.ensure_prober();
            return Err(Fallback::CircuitOpen);
        };
        match self.limiter().take(key, algo, cost, want).await {
            Ok(answer) => {
                breaker.record(permit, CallOutcome::Success, Instant::now());
                Ok(answer)
            }
            Err(e) => {
                breaker.record_failure(permit, outcome(&e), &e, Instant::now());
                self.ensure_prober();
                Err(Fallback::StoreFailed)
            }
        }
    }

    /// [`RedisLimiter::debit`] through the breaker; `None` when Redis could not take it (the
    /// caller keeps the units for its next debit; the bucket's debt is meanwhile what other
    /// debits made it).
    pub async fn debit(&self, key: &RedisKey, algo: &ExactAlgo, cost: u64) -> Option<Debit> {
        let breaker = self.breaker();
        let permit = breaker.permit()?;
        match self.limiter().debit(key, algo, cost).await {
            Ok(debit) => {
                breaker.record(permit, CallOutcome::Success, Instant::now());
                Some(debit)
            }
            Err(e) => {
                breaker.record_failure(permit, outcome(&e), &e, Instant::now());
                self.ensure_prober();
                None
            }
        }
    }

    /// Starts the prober when the circuit is not closed and none runs.
    fn ensure_prober(&self) {
        if !self.shared.breaker.claim_prober() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(probe(Arc::downgrade(&self.shared)));
            }
            // Not reachable from `try_take`, which runs on a runtime; should it happen, the
            // next request that finds the circuit open tries again.
            Err(_) => self.shared.breaker.prober_gone(),
        }
    }
}

fn outcome(e: &ExactError) -> CallOutcome {
    if e.is_timeout() {
        CallOutcome::Timeout
    } else {
        CallOutcome::Error
    }
}

/// The prober: does what the breaker's [`CircuitBreaker::poll`] says until the circuit closes
/// or the limiter is dropped.
async fn probe(shared: Weak<Shared>) {
    let mut slot = Slot {
        shared: shared.clone(),
        held: true,
    };
    while let Some(guarded) = shared.upgrade() {
        let breaker = &guarded.breaker;
        match breaker.poll(Instant::now()) {
            BreakerStep::Done => {
                if !breaker.release_prober() {
                    slot.held = false;
                    return;
                }
            }
            BreakerStep::Probe(probe) => {
                let result = guarded.limiter.ping().await;
                let now = Instant::now();
                match &result {
                    Ok(()) => breaker.record_probe(probe, CallOutcome::Success, None, now),
                    Err(e) => breaker.record_probe(probe, outcome(e), Some(e), now),
                }
            }
            BreakerStep::Wait(until) => {
                drop(guarded);
                tokio::time::sleep_until(until.into()).await;
            }
        }
    }
    // The limiter is gone, and its breaker with it.
    slot.held = false;
}

/// Gives the prober's slot back if its task is dropped midway (its runtime shut down), so
/// that a later request starts another.
struct Slot {
    shared: Weak<Shared>,
    held: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.held
            && let Some(shared) = self.shared.upgrade()
        {
            shared.breaker.prober_gone();
        }
    }
}
