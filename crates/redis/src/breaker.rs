//! A circuit breaker per Redis endpoint: stop asking a Redis that fails, probe it on a
//! timer, and ramp requests back to it over about a second.
//!
//! The hot path: whether a request may call Redis ([`CircuitBreaker::permit`]) reads one atomic
//! word (the state, the ramp stage and an epoch); in the half-open second it also counts
//! arrivals in a second atomic, to let exactly the stage's share through. Recording an answer
//! is a few atomic operations; only a failure, a transition and the prober take the breaker's
//! lock. Nothing on the path of a request allocates. The state machine takes time as an
//! argument and does no I/O, so its tests drive it on a manual clock.

use std::fmt::{self, Write as _};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a breaker opens and recovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open a closed circuit; in a ramp stage, failures that open it
    /// at once when the stage is below `success_percent`.
    pub failure_threshold: u32,
    /// How often an open circuit pings Redis.
    pub probe_every: Duration,
    /// The half-open stages: stage `i` lets `ramp[i]` percent of requests through (1 to 100).
    pub ramp: Vec<u32>,
    /// How long each ramp stage lasts before it is judged.
    pub stage_for: Duration,
    /// How often a half-open circuit pings Redis, so that a stage has answers to judge
    /// without traffic.
    pub ramp_probe_every: Duration,
    /// Answers (requests' and probes') a stage needs before it is judged.
    pub min_calls_per_stage: u32,
    /// The share of a stage's answers that must succeed for the ramp to go on (80%).
    pub success_percent: u32,
    /// How often failed calls are summarised in the log while they go on.
    pub summarise_errors_every: Duration,
}

impl Default for BreakerConfig {
    /// Trusts a healthy Redis again within about 1.3 s (see the module docs).
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            probe_every: Duration::from_millis(250),
            ramp: vec![10, 25, 50, 75],
            stage_for: Duration::from_millis(250),
            ramp_probe_every: Duration::from_millis(50),
            min_calls_per_stage: 3,
            success_percent: 80,
            summarise_errors_every: Duration::from_secs(10),
        }
    }
}

/// The most stages a ramp may have (the stage shares the state's atomic word).
const MAX_STAGES: usize = 32;

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    /// Ramping: `percent` of requests go to Redis.
    HalfOpen {
        stage: usize,
        percent: u32,
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
    /// Requests' calls that Redis answered.
    pub successes: u64,
    /// Requests' calls that failed with an error other than a timeout.
    pub errors: u64,
    /// Requests' calls that hit the deadline.
    pub timeouts: u64,
    /// Requests decided without asking Redis because the circuit was open or half-open.
    pub short_circuited: u64,
    /// Times the circuit opened, reopenings from a ramp stage included.
    pub opened: u64,
    /// Times the ramp completed and the circuit closed again.
    pub recovered: u64,
    /// Pings the prober sent while the circuit was open or half-open.
    pub probes: u64,
    /// Pings that failed or timed out.
    pub probe_failures: u64,
}

/// Leave to call Redis once. Hand it back with the outcome to [`CircuitBreaker::record`].
#[derive(Debug)]
#[must_use = "the outcome of a permitted call must be recorded"]
pub struct BreakerPermit {
    word: u64,
}

/// Leave for the prober to ping Redis once. Hand it back to [`CircuitBreaker::record_probe`].
#[derive(Debug)]
#[must_use = "the outcome of a probe must be recorded"]
pub struct Probe {
    word: u64,
}

/// How a permitted call or a probe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    Success,
    Error,
    Timeout,
}

/// What the prober should do next, from [`CircuitBreaker::poll`].
#[derive(Debug)]
pub enum BreakerStep {
    /// Ping Redis now and record the answer.
    Probe(Probe),
    /// Nothing before this instant.
    Wait(Instant),
    /// The circuit is closed: the prober may stop.
    Done,
}

// The state word: bits 0-1 the phase, 2-7 the ramp stage, 8-63 an epoch bumped by every
// transition. Answers to permits of an earlier epoch are counted but not judged: a slow failure
// from before the circuit closed must not count against it.
const CLOSED: u64 = 0;
const HALF_OPEN: u64 = 1;
const OPEN: u64 = 2;

fn phase(word: u64) -> u64 {
    word & 0b11
}

fn stage(word: u64) -> usize {
    ((word >> 2) & 0x3f) as usize
}

fn pack(phase: u64, stage: usize, epoch: u64) -> u64 {
    (epoch << 8) | ((stage as u64) << 2) | phase
}

// A stage's tally in one atomic: bits 48-63 the low 16 bits of the epoch it belongs to, 24-47
// the failed answers, 0-23 the successful ones.
const TALLY_MAX: u64 = (1 << 24) - 1;

fn tag(word: u64) -> u64 {
    (word >> 8) & 0xffff
}

fn tally_counts(tally: u64) -> (u64, u64) {
    (tally & TALLY_MAX, (tally >> 24) & TALLY_MAX)
}

/// No summary window open.
const NO_SUMMARY: u64 = u64::MAX;

/// State that only failures, transitions and the prober touch, behind the lock.
#[derive(Debug)]
struct Control {
    /// When the current ramp stage began.
    stage_started: Instant,
    /// When the circuit last left closed.
    out_since: Instant,
    /// The text and time of the latest failure.
    last_error: String,
    last_failure: Instant,
    /// The failure summary's window: when it began, and failures since then.
    window: Option<Instant>,
    failed: u64,
    failed_probes: u64,
}

/// The breaker of one endpoint, shared by every bucket that lives there.
///
/// # States
///
/// **Closed**, every request goes to Redis; `failure_threshold` consecutive failures (errors or
/// timeouts) open the circuit. **Open**, no request goes to Redis: each is decided at once by
/// its bucket's `on_store_failure`, so a dead Redis costs nothing but a lost limit, and a
/// background prober sends Redis a `PING` every `probe_every`, with or without traffic. The
/// first probe that succeeds makes the circuit **half-open**: a ramp of stages, each
/// `stage_for` long, in which a growing share of requests (`ramp`, in percent) goes to Redis
/// while the prober keeps pinging every `ramp_probe_every`. When a stage's time is up, its calls
/// (the requests it let through and the probes together) are judged: with at least
/// `min_calls_per_stage` answers of which at least `success_percent` (80%) succeeded, the
/// ramp moves to the next stage, and after the last one the circuit closes; below that it
/// opens again. A stage with too few answers goes on until it has them. Failures reaching
/// `failure_threshold` in a stage whose share is already below the threshold open the circuit
/// at once, without waiting for the stage's end.
///
/// Time drives recovery, not traffic. With the defaults (a probe every 250 ms while open;
/// stages of 10%, 25%, 50% and 75% of requests, 250 ms each, probed every 50 ms), a Redis that
/// answers again is trusted within 250 ms (the next probe) + 1 s (the ramp) + a ping's round
/// trip, about 1.25 s, whether the proxy serves 5 requests a second, 100,000, or none: an idle
/// proxy's breaker is closed by its probes before its next request arrives. (A ping that hangs
/// on an unreachable host is cut at the store timeout; only a timeout longer than 250 ms can
/// delay the next probe.) On the way, a proxy at 1,000 requests/s sends Redis 25, 63, 125 and
/// 187 of the 250 requests of each stage; the others follow `on_store_failure`.
///
/// # The prober
///
/// [`CircuitBreaker::poll`] tells the breaker's owner when to ping Redis and judges the ramp's
/// stages as their time runs out, [`CircuitBreaker::record_probe`] takes the answers, and
/// [`CircuitBreaker::claim_prober`] says when a prober should start. [`crate::GuardedLimiter`] is
/// that owner: it runs the prober as a task on the Tokio runtime of its Redis calls, from the
/// moment the circuit leaves closed until it closes again.
///
/// # Log lines
///
/// One line per transition, never one per request (`tracing`, with the endpoint as `redis`):
///
/// - warn, closed to open: `Redis circuit opened: 5 consecutive calls failed, the last: ...`;
/// - info, open to half-open: `Redis circuit half-open after 3.2s out: a probe succeeded;
///   ramping requests back through 10%, 25%, 50%, 75% over 1s`;
/// - info, half-open to closed: `Redis circuit closed: Redis trusted again after 4.4s out`;
/// - warn, half-open to open: `Redis circuit reopened: 1 of 5 calls succeeded in ramp stage 2
///   (50% of requests), below 80%; the last error: ...`.
///
/// Failed calls (requests' and probes') are summarised: the first failure after a quiet
/// period is logged at once (`Redis call failed: ...; further failures are summarised every
/// 10s`), later ones once per `summarise_errors_every` (`12 Redis calls failed in the last
/// 10 s (8 of them probes); the last: ...`) while they go on. A ramp stage that passes is a
/// debug line.
///
/// # Metrics
///
/// [`CircuitBreaker::stats`] holds the state and counters since the breaker was made. The
/// proxy exports `spillway_circuit_state` ([`CircuitState::gauge`]: 0 closed, 1 half-open,
/// 2 open), `spillway_store_errors_total{kind="error"|"timeout"}` (`errors`, `timeouts`: the
/// calls of requests, not the probes) and `spillway_store_short_circuited_total`
/// (`short_circuited`: requests decided by policy because the circuit was open or half-open
/// and they were not let through). `opened`, `recovered`, `probes` and `probe_failures` count
/// the openings (reopenings included), the closings, and the prober's pings.
#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    /// The endpoint, for the log lines.
    name: Box<str>,
    /// The origin of the instants kept in atomics as nanoseconds.
    base: Instant,
    word: AtomicU64,
    /// Consecutive failures while closed.
    failures: AtomicU32,
    /// Arrivals in the current ramp stage.
    arrivals: AtomicU64,
    tally: AtomicU64,
    /// When the prober pings next, in nanoseconds since `base`.
    next_probe: AtomicU64,
    /// When the failure summary is due, in nanoseconds since `base`, or `NO_SUMMARY`.
    summary_due: AtomicU64,
    /// Whether a prober runs for this breaker.
    prober: AtomicBool,
    control: Mutex<Control>,
    successes: AtomicU64,
    errors: AtomicU64,
    timeouts: AtomicU64,
    short_circuited: AtomicU64,
    opened: AtomicU64,
    recovered: AtomicU64,
    probes: AtomicU64,
    probe_failures: AtomicU64,
}

impl CircuitBreaker {
    /// A closed breaker, named `redis` in its log lines. An empty `ramp` is one stage of 100%;
    /// shares are clamped to 1..=100, and a ramp is at most 32 stages.
    pub fn new(config: BreakerConfig) -> Self {
        Self::named(config, "redis")
    }

    /// A closed breaker whose log lines name its endpoint `name` (with any password hidden).
    pub fn named(mut config: BreakerConfig, name: impl Into<String>) -> Self {
        if config.ramp.is_empty() {
            config.ramp.push(100);
        }
        config.ramp.truncate(MAX_STAGES);
        for percent in &mut config.ramp {
            *percent = (*percent).clamp(1, 100);
        }
        config.failure_threshold = config.failure_threshold.max(1);
        config.min_calls_per_stage = config.min_calls_per_stage.max(1);
        config.success_percent = config.success_percent.min(100);
        config.probe_every = config.probe_every.max(Duration::from_millis(1));
        config.ramp_probe_every = config.ramp_probe_every.max(Duration::from_millis(1));
        let now = Instant::now();
        Self {
            config,
            name: name.into().into_boxed_str(),
            base: now,
            word: AtomicU64::new(pack(CLOSED, 0, 0)),
            failures: AtomicU32::new(0),
            arrivals: AtomicU64::new(0),
            tally: AtomicU64::new(0),
            next_probe: AtomicU64::new(0),
            summary_due: AtomicU64::new(NO_SUMMARY),
            prober: AtomicBool::new(false),
            control: Mutex::new(Control {
                stage_started: now,
                out_since: now,
                last_error: String::new(),
                last_failure: now,
                window: None,
                failed: 0,
                failed_probes: 0,
            }),
            successes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            short_circuited: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            probe_failures: AtomicU64::new(0),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Whether a request may call Redis now. `None`: decide it by policy instead.
    pub fn permit(&self) -> Option<BreakerPermit> {
        let word = self.word.load(Ordering::Acquire);
        let permitted = match phase(word) {
            CLOSED => true,
            HALF_OPEN => {
                // Arrival n goes through when n × p crosses a multiple of 100: exactly p% of
                // the stage's arrivals, evenly spaced, the first one included.
                let percent = u64::from(self.config.ramp[stage(word)]);
                let n = self.arrivals.fetch_add(1, Ordering::Relaxed);
                n.wrapping_mul(percent) % 100 < percent
            }
            _ => false,
        };
        if permitted {
            Some(BreakerPermit { word })
        } else {
            self.short_circuited.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// Records how a permitted call ended, at `now`. A failure is logged as "unknown";
    /// [`Self::record_failure`] says what it was.
    pub fn record(&self, permit: BreakerPermit, outcome: CallOutcome, now: Instant) {
        self.settle(permit.word, outcome, None, false, now);
    }

    /// Records a permitted call that failed with `error`, at `now`.
    pub fn record_failure(
        &self,
        permit: BreakerPermit,
        outcome: CallOutcome,
        error: &dyn fmt::Display,
        now: Instant,
    ) {
        self.settle(permit.word, outcome, Some(error), false, now);
    }

    /// What the prober should do at `now`: ping, wait, or stop. Also judges a ramp stage whose
    /// time is up, so the ramp advances without traffic.
    pub fn poll(&self, now: Instant) -> BreakerStep {
        let mut ctl = self.lock();
        self.flush_summary(&mut ctl, now);
        let word = self.word.load(Ordering::Acquire);
        match phase(word) {
            CLOSED => return BreakerStep::Done,
            HALF_OPEN if now >= ctl.stage_started + self.config.stage_for => {
                let (succeeded, failed) = self.stage_counts(word);
                let answered = succeeded + failed;
                if answered >= u64::from(self.config.min_calls_per_stage) {
                    if self.passes(succeeded, answered) {
                        self.advance(&mut ctl, word, now);
                    } else {
                        self.reopen(&mut ctl, word, succeeded, answered, now);
                    }
                }
                // Too few answers: the stage goes on until the probes bring enough.
            }
            _ => {}
        }
        let word = self.word.load(Ordering::Acquire);
        let every = match phase(word) {
            CLOSED => return BreakerStep::Done,
            HALF_OPEN => self.config.ramp_probe_every,
            _ => self.config.probe_every,
        };
        let next = self.at(self.next_probe.load(Ordering::Relaxed));
        if now >= next {
            self.next_probe
                .store(self.nanos(now + every), Ordering::Relaxed);
            return BreakerStep::Probe(Probe { word });
        }
        let stage_end = ctl.stage_started + self.config.stage_for;
        if phase(word) == HALF_OPEN && stage_end > now {
            BreakerStep::Wait(next.min(stage_end))
        } else {
            BreakerStep::Wait(next)
        }
    }

    /// Records how the prober's ping ended, at `now`: while open, a success starts the ramp.
    pub fn record_probe(
        &self,
        probe: Probe,
        outcome: CallOutcome,
        error: Option<&dyn fmt::Display>,
        now: Instant,
    ) {
        self.probes.fetch_add(1, Ordering::Relaxed);
        let ok = outcome == CallOutcome::Success;
        if !ok {
            self.probe_failures.fetch_add(1, Ordering::Relaxed);
        }
        if phase(probe.word) != OPEN {
            return self.settle(probe.word, outcome, error, true, now);
        }
        let mut ctl = self.lock();
        if !ok {
            self.note_failure(&mut ctl, error, true, now);
        } else if self.word.load(Ordering::Acquire) == probe.word {
            self.half_open(&mut ctl, now);
        }
    }

    /// The state now.
    pub fn state(&self) -> CircuitState {
        let word = self.word.load(Ordering::Acquire);
        match phase(word) {
            CLOSED => CircuitState::Closed,
            HALF_OPEN => CircuitState::HalfOpen {
                stage: stage(word),
                percent: self.config.ramp[stage(word)],
            },
            _ => CircuitState::Open,
        }
    }

    /// How long a request refused by policy should wait: until the next probe when open, one
    /// stage when half-open, one `probe_every` after a failure while closed.
    pub fn retry_hint(&self, now: Instant) -> Duration {
        let word = self.word.load(Ordering::Acquire);
        match phase(word) {
            OPEN => self
                .at(self.next_probe.load(Ordering::Relaxed))
                .saturating_duration_since(now),
            HALF_OPEN => self.config.stage_for,
            _ => self.config.probe_every,
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
            probes: self.probes.load(Ordering::Relaxed),
            probe_failures: self.probe_failures.load(Ordering::Relaxed),
        }
    }

    /// For the owner that runs the prober: whether one should start now, because the circuit
    /// is not closed and none runs. `true` hands the caller the prober's slot.
    pub fn claim_prober(&self) -> bool {
        // SeqCst with `release_prober`: a prober that stops as the circuit opens again and a
        // request that sees the circuit open cannot both miss each other.
        phase(self.word.load(Ordering::SeqCst)) != CLOSED
            && !self.prober.load(Ordering::SeqCst)
            && self
                .prober
                .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
    }

    /// For a prober that [`Self::poll`] told to stop: gives its slot back, and takes it again
    /// (returning `true`: go on) when the circuit left closed meanwhile.
    pub fn release_prober(&self) -> bool {
        self.prober.store(false, Ordering::SeqCst);
        self.claim_prober()
    }

    /// For a prober that ended without [`Self::release_prober`] (its runtime shut down, or it
    /// could not start): the next request that finds the circuit open starts another.
    pub fn prober_gone(&self) {
        self.prober.store(false, Ordering::SeqCst);
    }

    /// Judges one answer, a request's or a probe's, of the state `word`.
    fn settle(
        &self,
        word: u64,
        outcome: CallOutcome,
        error: Option<&dyn fmt::Display>,
        probe: bool,
        now: Instant,
    ) {
        if !probe {
            let counter = match outcome {
                CallOutcome::Success => &self.successes,
                CallOutcome::Error => &self.errors,
                CallOutcome::Timeout => &self.timeouts,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        let ok = outcome == CallOutcome::Success;
        if ok {
            match phase(word) {
                CLOSED
                    if self.failures.load(Ordering::Relaxed) != 0
                        && self.word.load(Ordering::Relaxed) == word =>
                {
                    self.failures.store(0, Ordering::Relaxed);
                }
                HALF_OPEN => {
                    self.count(word, true);
                }
                _ => {}
            }
            if self.nanos(now) >= self.summary_due.load(Ordering::Relaxed) {
                self.flush_summary(&mut self.lock(), now);
            }
            return;
        }
        let current = self.word.load(Ordering::Relaxed) == word;
        let mut ctl = self.lock();
        self.note_failure(&mut ctl, error, probe, now);
        match phase(word) {
            CLOSED if current => {
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures >= self.config.failure_threshold
                    && self.word.load(Ordering::Acquire) == word
                {
                    self.trip(&mut ctl, failures, now);
                }
            }
            HALF_OPEN => {
                if let Some((succeeded, failed)) = self.count(word, false) {
                    let answered = succeeded + failed;
                    if failed >= u64::from(self.config.failure_threshold)
                        && !self.passes(succeeded, answered)
                        && self.word.load(Ordering::Acquire) == word
                    {
                        self.reopen(&mut ctl, word, succeeded, answered, now);
                    }
                }
            }
            _ => {}
        }
    }

    /// Adds an answer to the tally of the stage `word`; `None` when the stage is over.
    fn count(&self, word: u64, ok: bool) -> Option<(u64, u64)> {
        let mut tally = self.tally.load(Ordering::Relaxed);
        loop {
            if tally >> 48 != tag(word) {
                return None;
            }
            let (succeeded, failed) = tally_counts(tally);
            let (succeeded, failed) = if ok {
                ((succeeded + 1).min(TALLY_MAX), failed)
            } else {
                (succeeded, (failed + 1).min(TALLY_MAX))
            };
            let next = (tag(word) << 48) | (failed << 24) | succeeded;
            match self.tally.compare_exchange_weak(
                tally,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some((succeeded, failed)),
                Err(seen) => tally = seen,
            }
        }
    }

    /// The successes and failures of the stage `word` so far.
    fn stage_counts(&self, word: u64) -> (u64, u64) {
        let tally = self.tally.load(Ordering::Relaxed);
        if tally >> 48 == tag(word) {
            tally_counts(tally)
        } else {
            (0, 0)
        }
    }

    fn passes(&self, succeeded: u64, answered: u64) -> bool {
        succeeded * 100 >= u64::from(self.config.success_percent) * answered
    }

    /// Moves to `phase` and `stage` in a new epoch, with fresh counts. Under the lock.
    fn enter(&self, _ctl: &mut Control, phase: u64, stage: usize) -> u64 {
        let epoch = (self.word.load(Ordering::Relaxed) >> 8) + 1;
        let word = pack(phase, stage, epoch);
        // The counts first, so no answer of the new epoch is added to the old ones.
        self.tally.store(tag(word) << 48, Ordering::Relaxed);
        self.arrivals.store(0, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        self.word.store(word, Ordering::SeqCst);
        word
    }

    /// Closed to open.
    fn trip(&self, ctl: &mut Control, failures: u32, now: Instant) {
        self.enter(ctl, OPEN, 0);
        self.opened.fetch_add(1, Ordering::Relaxed);
        ctl.out_since = now;
        self.next_probe
            .store(self.nanos(now + self.config.probe_every), Ordering::Relaxed);
        tracing::warn!(
            redis = %self.name,
            "Redis circuit opened: {failures} consecutive calls failed, the last: {}; requests of \
             store: redis buckets follow on_store_failure while Redis is probed every {:?}",
            ctl.last_error,
            self.config.probe_every,
        );
    }

    /// Half-open (at stage `word`) to open.
    fn reopen(&self, ctl: &mut Control, word: u64, succeeded: u64, answered: u64, now: Instant) {
        self.enter(ctl, OPEN, 0);
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.next_probe
            .store(self.nanos(now + self.config.probe_every), Ordering::Relaxed);
        tracing::warn!(
            redis = %self.name,
            "Redis circuit reopened: {succeeded} of {answered} calls succeeded in ramp stage {} \
             ({}% of requests), below {}%; the last error: {}",
            stage(word),
            self.config.ramp[stage(word)],
            self.config.success_percent,
            ctl.last_error,
        );
    }

    /// Open to half-open, after a successful probe.
    fn half_open(&self, ctl: &mut Control, now: Instant) {
        self.enter(ctl, HALF_OPEN, 0);
        ctl.stage_started = now;
        self.next_probe.store(
            self.nanos(now + self.config.ramp_probe_every),
            Ordering::Relaxed,
        );
        let shares: Vec<String> = self.config.ramp.iter().map(|p| format!("{p}%")).collect();
        tracing::info!(
            redis = %self.name,
            "Redis circuit half-open after {:.1?} out: a probe succeeded; ramping requests back \
             through {} over {:?}",
            now.saturating_duration_since(ctl.out_since),
            shares.join(", "),
            self.config.stage_for * self.config.ramp.len() as u32,
        );
    }

    /// The next ramp stage, or closed after the last.
    fn advance(&self, ctl: &mut Control, word: u64, now: Instant) {
        let next = stage(word) + 1;
        if next == self.config.ramp.len() {
            self.enter(ctl, CLOSED, 0);
            self.recovered.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                redis = %self.name,
                "Redis circuit closed: Redis trusted again after {:.1?} out",
                now.saturating_duration_since(ctl.out_since),
            );
        } else {
            self.enter(ctl, HALF_OPEN, next);
            ctl.stage_started = now;
            tracing::debug!(
                redis = %self.name,
                "Redis circuit ramp: stage {next}, {}% of requests",
                self.config.ramp[next],
            );
        }
    }

    /// Keeps a failure's text and counts it in the summary, logging the first of a quiet
    /// period at once.
    fn note_failure(
        &self,
        ctl: &mut Control,
        error: Option<&dyn fmt::Display>,
        probe: bool,
        now: Instant,
    ) {
        // The window that ended is reported with its own last error, before this one.
        self.flush_summary(ctl, now);
        ctl.last_error.clear();
        match error {
            Some(error) => {
                // Writing into a String cannot fail.
                let _ = write!(ctl.last_error, "{error}");
            }
            None => ctl.last_error.push_str("unknown error"),
        }
        ctl.last_failure = now;
        if ctl.window.is_none() {
            tracing::warn!(
                redis = %self.name,
                "Redis call failed: {}; further failures are summarised every {:?}",
                ctl.last_error,
                self.config.summarise_errors_every,
            );
            self.open_window(ctl, now);
        } else {
            ctl.failed += 1;
            ctl.failed_probes += u64::from(probe);
        }
    }

    /// Logs the failures of a summary window that is over, if any. The next window starts now
    /// while failures go on; after a quiet interval there is none, and the next failure is
    /// logged at once.
    fn flush_summary(&self, ctl: &mut Control, now: Instant) {
        let Some(start) = ctl.window else { return };
        let every = self.config.summarise_errors_every;
        let elapsed = now.saturating_duration_since(start);
        if elapsed < every {
            return;
        }
        if ctl.failed > 0 {
            tracing::warn!(
                redis = %self.name,
                "{} Redis calls failed in the last {:.0} s ({} of them probes); the last: {}",
                ctl.failed,
                elapsed.as_secs_f64(),
                ctl.failed_probes,
                ctl.last_error,
            );
        }
        if ctl.failed > 0 && now.saturating_duration_since(ctl.last_failure) < every {
            self.open_window(ctl, now);
        } else {
            ctl.window = None;
            self.summary_due.store(NO_SUMMARY, Ordering::Relaxed);
        }
    }

    fn open_window(&self, ctl: &mut Control, now: Instant) {
        ctl.window = Some(now);
        ctl.failed = 0;
        ctl.failed_probes = 0;
        self.summary_due.store(
            self.nanos(now + self.config.summarise_errors_every),
            Ordering::Relaxed,
        );
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    fn at(&self, nanos: u64) -> Instant {
        self.base + Duration::from_nanos(nanos)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Control> {
        // A few plain fields updated in one step each; a panic elsewhere cannot leave them
        // half-written, so a poisoned lock is still good.
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests;
