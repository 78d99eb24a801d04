//! A circuit breaker per Redis endpoint (S8): stop asking a Redis that fails, probe it, ramp back.
//!
//! Closed, every request goes to Redis; `failure_threshold` consecutive failures (errors or
//! timeouts) open the circuit. Open, no request goes to Redis for `open_for`: each is decided at
//! once by its bucket's `on_store_failure`, so a dead Redis costs nothing but a lost limit.
//! Then half-open: the breaker lets one request in `ramp[0]` through as a probe; once
//! `probes_per_stage` probes have answered and at least `success_percent` of them succeeded, it
//! moves to one in `ramp[1]`, and so on; after the last stage it closes. A stage that can no
//! longer reach the threshold opens the circuit again. With the defaults (one in 20, 10, 4, 2
//! and 10 probes a stage), a proxy at 1,000 requests/s is back to full traffic about 0.4 s after
//! Redis recovers, having sent Redis 5%, then 10%, 25% and 50% of its traffic on the way.
//!
//! The state machine takes time as an argument, so its tests drive it without sleeping.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a breaker opens and recovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open a closed circuit.
    pub failure_threshold: u32,
    /// How long an open circuit sends nothing to Redis before probing.
    pub open_for: Duration,
    /// The half-open stages: stage `i` lets one request in `ramp[i]` through.
    pub ramp: Vec<u32>,
    /// Probe answers a stage waits for before it judges them.
    pub probes_per_stage: u32,
    /// The share of a stage's probes that must succeed for the ramp to go on (S8: 80%).
    pub success_percent: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            open_for: Duration::from_secs(1),
            ramp: vec![20, 10, 4, 2],
            probes_per_stage: 10,
            success_percent: 80,
        }
    }
}

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    /// Probing: one request in `one_in` goes to Redis.
    HalfOpen {
        stage: usize,
        one_in: u32,
    },
    Open,
}

impl CircuitState {
    /// The value of the `spillway_circuit_state` gauge: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> i64 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::HalfOpen { .. } => 1,
            CircuitState::Open => 2,
        }
    }
}

/// Counters since the breaker was made, for `spillway_store_errors_total` and friends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerStats {
    pub state: CircuitState,
    /// Calls that Redis answered.
    pub successes: u64,
    /// Calls that failed with an error other than a timeout.
    pub errors: u64,
    /// Calls that hit the deadline.
    pub timeouts: u64,
    /// Requests decided without asking Redis because the circuit was open or half-open.
    pub short_circuited: u64,
    /// Times the circuit opened.
    pub opened: u64,
    /// Times the ramp completed and the circuit closed again.
    pub recovered: u64,
}

/// Leave to call Redis once. Hand it back with the outcome to [`CircuitBreaker::record`].
#[derive(Debug)]
#[must_use = "the outcome of a permitted call must be recorded"]
pub struct Permit {
    epoch: u64,
}

/// How a permitted call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    Success,
    Error,
    Timeout,
}

#[derive(Debug)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    HalfOpen {
        stage: usize,
        arrivals: u64,
        answered: u32,
        succeeded: u32,
    },
}

#[derive(Debug)]
struct Inner {
    state: State,
    // Bumped on every transition; answers to permits of an earlier state are not judged in
    // the new one (a slow failure from before the circuit closed must not count against it).
    epoch: u64,
}

/// The breaker of one endpoint, shared by every bucket that lives there.
#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
    successes: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    short_circuited: AtomicU64,
    opened: AtomicU64,
    recovered: AtomicU64,
}

impl CircuitBreaker {
    /// A closed breaker. An empty `ramp` closes straight from the first successful probe
    /// stage, so it is treated as `[1]`.
    pub fn new(mut config: BreakerConfig) -> Self {
        if config.ramp.is_empty() {
            config.ramp.push(1);
        }
        for one_in in &mut config.ramp {
            *one_in = (*one_in).max(1);
        }
        config.failure_threshold = config.failure_threshold.max(1);
        config.probes_per_stage = config.probes_per_stage.max(1);
        config.success_percent = config.success_percent.min(100);
        Self {
            config,
            inner: Mutex::new(Inner {
                state: State::Closed { failures: 0 },
                epoch: 0,
            }),
            successes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            short_circuited: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Whether a request at `now` may call Redis. `None`: decide it by policy instead.
    pub fn permit(&self, now: Instant) -> Option<Permit> {
        let mut inner = self.lock();
        if let State::Open { until } = inner.state
            && now >= until
        {
            inner.enter(State::HalfOpen {
                stage: 0,
                arrivals: 0,
                answered: 0,
                succeeded: 0,
            });
        }
        let epoch = inner.epoch;
        let permitted = match &mut inner.state {
            State::Closed { .. } => true,
            State::Open { .. } => false,
            State::HalfOpen {
                stage, arrivals, ..
            } => {
                let one_in = u64::from(self.config.ramp[*stage]);
                let pick = arrivals.is_multiple_of(one_in);
                *arrivals += 1;
                pick
            }
        };
        drop(inner);
        if permitted {
            Some(Permit { epoch })
        } else {
            self.short_circuited.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// Records how a permitted call ended, at `now`.
    pub fn record(&self, permit: Permit, outcome: CallOutcome, now: Instant) {
        let counter = match outcome {
            CallOutcome::Success => &self.successes,
            CallOutcome::Error => &self.errors,
            CallOutcome::Timeout => &self.timeouts,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let ok = outcome == CallOutcome::Success;

        let mut inner = self.lock();
        if permit.epoch != inner.epoch {
            return;
        }
        let open = State::Open {
            until: now + self.config.open_for,
        };
        match &mut inner.state {
            State::Closed { failures } => {
                if ok {
                    *failures = 0;
                } else {
                    *failures += 1;
                    if *failures >= self.config.failure_threshold {
                        inner.enter(open);
                        self.opened.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            State::Open { .. } => {}
            State::HalfOpen {
                stage,
                answered,
                succeeded,
                ..
            } => {
                *answered += 1;
                *succeeded += u32::from(ok);
                let probes = self.config.probes_per_stage;
                let needed = (probes * self.config.success_percent).div_ceil(100);
                let failed = *answered - *succeeded;
                if failed > probes - needed {
                    // This stage can no longer reach the threshold.
                    inner.enter(open);
                    self.opened.fetch_add(1, Ordering::Relaxed);
                } else if *answered >= probes {
                    let next = *stage + 1;
                    if next == self.config.ramp.len() {
                        inner.enter(State::Closed { failures: 0 });
                        self.recovered.fetch_add(1, Ordering::Relaxed);
                    } else {
                        inner.enter(State::HalfOpen {
                            stage: next,
                            arrivals: 0,
                            answered: 0,
                            succeeded: 0,
                        });
                    }
                }
            }
        }
    }

    /// The state now (an open circuit whose time is up reads as open until a request arrives).
    pub fn state(&self) -> CircuitState {
        match self.lock().state {
            State::Closed { .. } => CircuitState::Closed,
            State::Open { .. } => CircuitState::Open,
            State::HalfOpen { stage, .. } => CircuitState::HalfOpen {
                stage,
                one_in: self.config.ramp[stage],
            },
        }
    }

    /// How long a request refused by policy should wait: until probing starts when open, else
    /// one `open_for`.
    pub fn retry_hint(&self, now: Instant) -> Duration {
        match self.lock().state {
            State::Open { until } => until.saturating_duration_since(now),
            _ => self.config.open_for,
        }
        .max(Duration::from_millis(1))
    }

    /// The counters and the state.
    pub fn stats(&self) -> BreakerStats {
        BreakerStats {
            state: self.state(),
            successes: self.successes.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            timeouts: self.timeouts.load(Ordering::Relaxed),
            short_circuited: self.short_circuited.load(Ordering::Relaxed),
            opened: self.opened.load(Ordering::Relaxed),
            recovered: self.recovered.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is a few plain fields updated in one step; a panic elsewhere cannot leave
        // it half-written, so a poisoned lock is still good.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn enter(&mut self, state: State) {
        self.state = state;
        self.epoch += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_secs(1),
            ramp: vec![4, 2],
            probes_per_stage: 5,
            success_percent: 80,
        }
    }

    fn call(b: &CircuitBreaker, now: Instant, outcome: CallOutcome) -> bool {
        match b.permit(now) {
            Some(p) => {
                b.record(p, outcome, now);
                true
            }
            None => false,
        }
    }

    fn open(b: &CircuitBreaker, now: Instant) {
        for _ in 0..3 {
            assert!(call(b, now, CallOutcome::Error));
        }
        assert_eq!(b.state(), CircuitState::Open);
    }

    #[test]
    fn consecutive_failures_open_and_a_success_resets_the_count() {
        let b = CircuitBreaker::new(config());
        let t = Instant::now();
        call(&b, t, CallOutcome::Error);
        call(&b, t, CallOutcome::Timeout);
        call(&b, t, CallOutcome::Success);
        call(&b, t, CallOutcome::Error);
        call(&b, t, CallOutcome::Error);
        assert_eq!(b.state(), CircuitState::Closed);
        call(&b, t, CallOutcome::Timeout);
        assert_eq!(b.state(), CircuitState::Open);
        let stats = b.stats();
        assert_eq!((stats.errors, stats.timeouts, stats.successes), (3, 2, 1));
        assert_eq!(stats.opened, 1);
    }

    #[test]
    fn open_circuit_refuses_until_its_time_is_up() {
        let b = CircuitBreaker::new(config());
        let t = Instant::now();
        open(&b, t);
        assert!(b.permit(t + Duration::from_millis(999)).is_none());
        assert_eq!(
            b.retry_hint(t + Duration::from_millis(400)),
            Duration::from_millis(600)
        );
        assert!(b.permit(t + Duration::from_secs(1)).is_some());
        assert_eq!(
            b.state(),
            CircuitState::HalfOpen {
                stage: 0,
                one_in: 4
            }
        );
        assert_eq!(b.stats().short_circuited, 1);
    }

    #[test]
    fn half_open_ramps_through_its_stages_and_closes() {
        let b = CircuitBreaker::new(config());
        let t = Instant::now();
        open(&b, t);
        let t = t + Duration::from_secs(1);
        // Arrivals until the state changes, and how many of them were probes.
        let stage = |b: &CircuitBreaker| {
            let before = b.state();
            let (mut arrivals, mut probes) = (0, 0);
            while b.state() == before {
                arrivals += 1;
                probes += usize::from(call(b, t, CallOutcome::Success));
            }
            (arrivals, probes)
        };
        // The first arrival after `open_for` is the first probe; at one in 4, the 5th probe
        // is arrival 17.
        assert!(call(&b, t, CallOutcome::Success));
        assert_eq!(stage(&b), (16, 4));
        assert_eq!(
            b.state(),
            CircuitState::HalfOpen {
                stage: 1,
                one_in: 2
            }
        );
        assert_eq!(stage(&b), (9, 5));
        assert_eq!(b.state(), CircuitState::Closed);
        assert_eq!(b.stats().recovered, 1);
    }

    #[test]
    fn a_stage_below_eighty_percent_reopens() {
        let b = CircuitBreaker::new(config());
        let t = Instant::now();
        open(&b, t);
        let t = t + Duration::from_secs(1);
        // 5 probes need 4 successes: the second failure makes that impossible.
        // Stage 0 lets arrivals 0, 4, 8, ... through.
        let mut outcomes = [
            CallOutcome::Success,
            CallOutcome::Error,
            CallOutcome::Timeout,
        ]
        .into_iter();
        for arrival in 0..9 {
            let permitted = b.permit(t);
            assert_eq!(permitted.is_some(), arrival % 4 == 0);
            if let Some(p) = permitted {
                assert!(matches!(b.state(), CircuitState::HalfOpen { .. }));
                b.record(p, outcomes.next().unwrap(), t);
            }
        }
        assert_eq!(b.state(), CircuitState::Open);
        assert_eq!(b.stats().opened, 2);
    }

    #[test]
    fn answers_from_an_earlier_state_are_not_judged() {
        let b = CircuitBreaker::new(config());
        let t = Instant::now();
        let stale = b.permit(t).unwrap();
        open(&b, t);
        let t = t + Duration::from_secs(1);
        assert!(call(&b, t, CallOutcome::Success));
        b.record(stale, CallOutcome::Error, t);
        assert!(matches!(b.state(), CircuitState::HalfOpen { stage: 0, .. }));
        assert_eq!(b.stats().errors, 4, "still counted");
    }
}
