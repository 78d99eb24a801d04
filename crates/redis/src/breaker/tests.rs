//! The state machine on a manual clock: instants are passed in, nothing sleeps.

use std::io;
use std::sync::{Arc, Mutex};

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A permitted call at `now` ending as `outcome`; `false` when the breaker refused it.
fn call(b: &CircuitBreaker, now: Instant, outcome: CallOutcome) -> bool {
    match b.permit() {
        Some(p) => {
            b.record(p, outcome, now);
            true
        }
        None => false,
    }
}

/// Five failures (the default threshold) open the circuit at `now`.
fn open(b: &CircuitBreaker, now: Instant) {
    for _ in 0..5 {
        assert!(call(b, now, CallOutcome::Error));
    }
    assert_eq!(b.state(), CircuitState::Open);
}

/// Polls at `now`, expecting a probe, and records it as `outcome` at `now`.
fn probe(b: &CircuitBreaker, now: Instant, outcome: CallOutcome) {
    match b.poll(now) {
        BreakerStep::Probe(p) => b.record_probe(p, outcome, None, now),
        other => panic!("expected a probe at {now:?}, got {other:?}"),
    }
}

/// Polls at `now` and drops any probe unanswered (a ping that never came back).
fn tick(b: &CircuitBreaker, now: Instant) -> BreakerStep {
    b.poll(now)
}

fn half_open(stage: usize, percent: u32) -> CircuitState {
    CircuitState::HalfOpen { stage, percent }
}

/// A breaker opened at `t` and made half-open by the probe at `t + 250 ms`.
fn ramping() -> (CircuitBreaker, Instant) {
    let b = CircuitBreaker::new(BreakerConfig::default());
    let t = Instant::now();
    open(&b, t);
    probe(&b, t + ms(250), CallOutcome::Success);
    assert_eq!(b.state(), half_open(0, 10));
    (b, t + ms(250))
}

/// Drives the ramp's prober from `from` to `until`: a probe whenever one is due, answered at
/// once as `outcome`. Returns the probes sent.
fn probes_until(b: &CircuitBreaker, from: Instant, until: Instant, outcome: CallOutcome) -> u32 {
    let (mut now, mut sent) = (from, 0);
    for _ in 0..10_000 {
        if now > until {
            return sent;
        }
        match b.poll(now) {
            BreakerStep::Probe(p) => {
                b.record_probe(p, outcome, None, now);
                sent += 1;
            }
            BreakerStep::Wait(at) => {
                assert!(at > now, "a wait in the past would spin the prober");
                now = at;
            }
            BreakerStep::Done => return sent,
        }
    }
    panic!("the prober never reached {until:?}");
}

#[test]
fn consecutive_failures_open_and_a_success_resets_the_count() {
    let b = CircuitBreaker::new(BreakerConfig::default());
    let t = Instant::now();
    for _ in 0..4 {
        call(&b, t, CallOutcome::Error);
    }
    call(&b, t, CallOutcome::Success);
    for _ in 0..4 {
        call(&b, t, CallOutcome::Timeout);
    }
    assert_eq!(b.state(), CircuitState::Closed);
    call(&b, t, CallOutcome::Error);
    assert_eq!(b.state(), CircuitState::Open);
    let stats = b.stats();
    assert_eq!((stats.errors, stats.timeouts, stats.successes), (5, 4, 1));
    assert_eq!(stats.opened, 1);
    assert!(
        matches!(b.poll(t), BreakerStep::Wait(_)),
        "an open circuit probes"
    );
}

#[test]
fn a_closed_circuit_needs_no_prober() {
    let b = CircuitBreaker::new(BreakerConfig::default());
    assert!(matches!(b.poll(Instant::now()), BreakerStep::Done));
    assert!(!b.claim_prober());
    open(&b, Instant::now());
    assert!(b.claim_prober());
    assert!(!b.claim_prober(), "one prober at a time");
    b.prober_gone();
    assert!(b.claim_prober());
}

#[test]
fn an_open_circuit_refuses_every_request_and_probes_on_a_timer() {
    let b = CircuitBreaker::new(BreakerConfig::default());
    let t = Instant::now();
    open(&b, t);
    for _ in 0..100 {
        assert!(b.permit().is_none());
    }
    assert_eq!(b.stats().short_circuited, 100);
    let BreakerStep::Wait(at) = tick(&b, t) else {
        panic!("no probe before probe_every");
    };
    assert_eq!(at, t + ms(250));
    assert!(matches!(tick(&b, t + ms(249)), BreakerStep::Wait(_)));
    assert_eq!(b.retry_hint(t + ms(100)), ms(150), "until the next probe");
    probe(&b, t + ms(250), CallOutcome::Error);
    assert_eq!(
        b.state(),
        CircuitState::Open,
        "a failed probe keeps it open"
    );
    let BreakerStep::Wait(at) = tick(&b, t + ms(260)) else {
        panic!("the next probe is one probe_every later");
    };
    assert_eq!(at, t + ms(500));
    probe(&b, t + ms(500), CallOutcome::Timeout);
    let stats = b.stats();
    assert_eq!((stats.probes, stats.probe_failures), (2, 2));
    assert_eq!(
        (stats.errors, stats.timeouts),
        (5, 0),
        "probes are not requests' errors"
    );
    // However long Redis stays down, the circuit stays open and keeps probing.
    let sent = probes_until(&b, t + ms(501), t + ms(60_000), CallOutcome::Error);
    assert_eq!(
        sent, 238,
        "one probe every 250 ms for a minute, less the two above"
    );
    assert_eq!(b.state(), CircuitState::Open);
}

#[test]
fn the_ramp_is_driven_by_time_not_by_traffic() {
    let (b, t) = ramping();
    // A thousand successful requests in the first 100 ms do not end the first stage.
    let through = (0..1_000)
        .filter(|_| call(&b, t + ms(100), CallOutcome::Success))
        .count();
    assert_eq!(through, 100, "10% of them went to Redis");
    assert_eq!(b.state(), half_open(0, 10));
    // Its time does: each stage lasts 250 ms, then the next share applies.
    probes_until(&b, t + ms(100), t + ms(249), CallOutcome::Success);
    assert_eq!(b.state(), half_open(0, 10));
    probes_until(&b, t + ms(250), t + ms(250), CallOutcome::Success);
    assert_eq!(b.state(), half_open(1, 25));
    probes_until(&b, t + ms(251), t + ms(500), CallOutcome::Success);
    assert_eq!(b.state(), half_open(2, 50));
    probes_until(&b, t + ms(501), t + ms(750), CallOutcome::Success);
    assert_eq!(b.state(), half_open(3, 75));
    // Without a request, the probes alone carry the last stage, and the circuit closes.
    probes_until(&b, t + ms(751), t + ms(999), CallOutcome::Success);
    assert_eq!(b.state(), half_open(3, 75));
    probes_until(&b, t + ms(1_000), t + ms(1_000), CallOutcome::Success);
    assert_eq!(b.state(), CircuitState::Closed);
    assert!(matches!(b.poll(t + ms(1_001)), BreakerStep::Done));
    let stats = b.stats();
    assert_eq!((stats.opened, stats.recovered), (1, 1));
    assert!(call(&b, t + ms(1_001), CallOutcome::Success));
}

#[test]
fn each_stage_lets_its_share_of_requests_through_evenly() {
    let (b, t) = ramping();
    for (stage, percent) in [(0, 10), (1, 25), (2, 50), (3, 75)] {
        assert_eq!(b.state(), half_open(stage, percent));
        let now = t + ms(250 * stage as u64 + 1);
        let pattern: Vec<bool> = (0..100)
            .map(|_| call(&b, now, CallOutcome::Success))
            .collect();
        assert_eq!(pattern.iter().filter(|p| **p).count(), percent as usize);
        assert!(pattern[0], "a stage's first arrival is let through");
        // Evenly: no window of 100 / percent arrivals (rounded up) misses out.
        let gap = 100_usize.div_ceil(percent as usize);
        assert!(
            pattern.windows(gap).all(|w| w.contains(&true)),
            "{pattern:?}"
        );
        probes_until(
            &b,
            now,
            t + ms(250 * (stage as u64 + 1)),
            CallOutcome::Success,
        );
    }
    assert_eq!(b.state(), CircuitState::Closed);
}

#[test]
fn a_stage_below_eighty_percent_reopens_and_eighty_percent_passes() {
    let (b, t) = ramping();
    // Stage 0: a request fails, the probes at 50, 100, 150 and 200 ms succeed: 4 of 5 (80%)
    // passes when the stage ends at 250 ms.
    assert!(call(&b, t + ms(10), CallOutcome::Error));
    for i in 1..=4 {
        probe(&b, t + ms(50 * i), CallOutcome::Success);
    }
    probe(&b, t + ms(250), CallOutcome::Success);
    assert_eq!(b.state(), half_open(1, 25));
    // Stage 1: that probe and four requests (one arrival in 4 at 25%), 3 of 5 (60%) in all.
    let mut outcomes = [
        CallOutcome::Error,
        CallOutcome::Success,
        CallOutcome::Timeout,
        CallOutcome::Success,
    ]
    .into_iter();
    for i in 0..13 {
        let permitted = b.permit();
        assert_eq!(permitted.is_some(), i % 4 == 0, "arrival {i}");
        if let Some(p) = permitted {
            b.record(p, outcomes.next().unwrap(), t + ms(260));
        }
    }
    assert_eq!(
        b.state(),
        half_open(1, 25),
        "judged only when the stage ends"
    );
    let BreakerStep::Wait(next) = tick(&b, t + ms(500)) else {
        panic!("a reopened circuit waits for its next probe");
    };
    assert_eq!(b.state(), CircuitState::Open);
    assert_eq!(next, t + ms(750));
    assert_eq!(b.stats().opened, 2);
    assert!(b.permit().is_none());
}

#[test]
fn failures_reaching_the_threshold_open_the_circuit_before_the_stage_ends() {
    let (b, t) = ramping();
    probe(&b, t + ms(50), CallOutcome::Success);
    let mut failed = 0;
    for _ in 0..1_000 {
        if call(&b, t + ms(60), CallOutcome::Error) {
            failed += 1;
        }
        if b.state() == CircuitState::Open {
            break;
        }
    }
    assert_eq!(
        failed, 5,
        "the fifth failure (1 of 6 succeeded) opens it at once"
    );
    assert_eq!(b.stats().opened, 2);
}

#[test]
fn a_stage_with_too_few_answers_goes_on_until_it_has_them() {
    let (b, t) = ramping();
    // Probes sent but never answered (Redis hangs): nothing to judge when the time is up.
    for i in 1..=5 {
        let _unanswered = tick(&b, t + ms(50 * i));
    }
    let BreakerStep::Wait(at) = tick(&b, t + ms(260)) else {
        panic!("the next probe is not due yet");
    };
    assert_eq!(at, t + ms(300), "the next probe, not a wait in the past");
    assert_eq!(b.state(), half_open(0, 10));
    probe(&b, t + ms(300), CallOutcome::Success);
    probe(&b, t + ms(350), CallOutcome::Success);
    assert_eq!(b.state(), half_open(0, 10));
    probe(&b, t + ms(400), CallOutcome::Success);
    // The third answer: judged at the next poll.
    let _ = tick(&b, t + ms(401));
    assert_eq!(b.state(), half_open(1, 25));
}

#[test]
fn answers_from_an_earlier_state_are_not_judged() {
    let b = CircuitBreaker::new(BreakerConfig::default());
    let t = Instant::now();
    let stale = b.permit().unwrap();
    open(&b, t);
    let t = t + ms(250);
    probe(&b, t, CallOutcome::Success);
    let from_stage_0 = b.permit().unwrap();
    for i in 1..=3 {
        probe(&b, t + ms(50 * i), CallOutcome::Success);
    }
    // Two failures from before would make the stage 3 of 5.
    b.record(stale, CallOutcome::Error, t + ms(200));
    b.record(from_stage_0, CallOutcome::Success, t + ms(200));
    let _ = tick(&b, t + ms(250));
    assert_eq!(b.state(), half_open(1, 25));
    let late = b.permit().unwrap();
    probes_until(&b, t + ms(251), t + ms(1_000), CallOutcome::Success);
    assert_eq!(b.state(), CircuitState::Closed);
    // A failure permitted in the ramp does not count against the closed circuit.
    b.record(late, CallOutcome::Error, t + ms(1_001));
    for _ in 0..4 {
        call(&b, t + ms(1_001), CallOutcome::Error);
    }
    assert_eq!(b.state(), CircuitState::Closed);
    assert_eq!(b.stats().errors, 5 + 1 + 1 + 4, "still counted");
}

/// Simulates a breaker opened at 0 whose Redis is healthy from `healthy_at`, with `rate`
/// requests a second and a prober whose pings take 1 ms, in steps of 1 ms. Returns when the
/// circuit closed, and how many requests Redis decided in each state before.
fn simulate(rate: u64, healthy_at: Duration) -> (Duration, Vec<(CircuitState, u64)>) {
    let b = CircuitBreaker::new(BreakerConfig::default());
    let t0 = Instant::now();
    open(&b, t0);
    let healthy = |now: Instant| {
        if now >= t0 + healthy_at {
            CallOutcome::Success
        } else {
            CallOutcome::Error
        }
    };
    let mut wake = t0;
    let mut in_flight: Option<(Probe, Instant)> = None;
    let mut decided: Vec<(CircuitState, u64)> = Vec::new();
    let mut due = 0.0;
    for step in 0..20_000 {
        let now = t0 + ms(step);
        if let Some((p, at)) = in_flight.take() {
            if now >= at {
                b.record_probe(p, healthy(now), None, now);
            } else {
                in_flight = Some((p, at));
            }
        }
        if in_flight.is_none() && now >= wake {
            match b.poll(now) {
                BreakerStep::Probe(p) => in_flight = Some((p, now + ms(1))),
                BreakerStep::Wait(at) => wake = at,
                BreakerStep::Done => {}
            }
        }
        due += rate as f64 / 1_000.0;
        while due >= 1.0 {
            due -= 1.0;
            let state = b.state();
            if call(&b, now, healthy(now)) {
                match decided.last_mut() {
                    Some((s, n)) if *s == state => *n += 1,
                    _ => decided.push((state, 1)),
                }
            }
        }
        if now > t0 + healthy_at && b.state() == CircuitState::Closed {
            return (now - t0 - healthy_at, decided);
        }
    }
    panic!("still {:?} after 20 s", b.state());
}

#[test]
fn a_healthy_redis_is_trusted_again_within_a_bounded_time_whatever_the_rate() {
    // The bound: the next probe (250 ms) + the ramp (4 x 250 ms) + a ping's round trip, here
    // 1 ms; at most 1.26 s whenever Redis comes back, and the same for every rate, idle
    // included.
    for rate in [0, 5, 100, 10_000] {
        for healthy_at in [ms(3_000), ms(3_001), ms(3_100), ms(3_249)] {
            let (took, _) = simulate(rate, healthy_at);
            assert!(
                took <= ms(1_252),
                "{took:?} at {rate}/s, healthy from {healthy_at:?}"
            );
            assert!(took >= ms(1_000), "{took:?}: the ramp takes 1 s");
        }
    }
    // At 100 requests/s, the stages let 10%, 25%, 50% and 75% of their 25 requests through.
    let (_, decided) = simulate(100, ms(3_100));
    assert_eq!(
        decided,
        [
            (half_open(0, 10), 3),
            (half_open(1, 25), 7),
            (half_open(2, 50), 13),
            (half_open(3, 75), 19),
        ]
    );
}

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The lines `f` logs at info and above.
fn logged(f: impl FnOnce()) -> Vec<String> {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .without_time()
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_owned).collect()
}

#[test]
fn one_log_line_per_transition_and_failures_summarised_every_ten_seconds() {
    let lines = logged(|| {
        let b = CircuitBreaker::named(BreakerConfig::default(), "redis://127.0.0.1:6379");
        let t = Instant::now();
        for i in 0..3 {
            assert!(call(&b, t + ms(i), CallOutcome::Success));
        }
        let refused = "connection refused";
        for i in 0..5 {
            let p = b.permit().unwrap();
            b.record_failure(p, CallOutcome::Error, &refused, t + ms(10 + i));
        }
        for _ in 0..1_000 {
            assert!(b.permit().is_none());
        }
        // Redis stays down for 12 s: 47 failed probes, then it answers.
        let sent = probes_until(&b, t + ms(10), t + ms(12_000), CallOutcome::Error);
        assert_eq!(sent, 47);
        probes_until(&b, t + ms(12_001), t + ms(14_000), CallOutcome::Success);
        assert_eq!(b.state(), CircuitState::Closed);
        for i in 0..1_000 {
            assert!(call(&b, t + ms(14_000 + i), CallOutcome::Success));
        }
        // Quiet for longer than the interval: the next failure is logged at once again.
        let p = b.permit().unwrap();
        b.record_failure(p, CallOutcome::Timeout, &"timed out", t + ms(30_000));
    });
    let redis = "redis=redis://127.0.0.1:6379";
    let expected = [
        "WARN spillway_redis::breaker: Redis call failed: connection refused; further failures are summarised every 10s",
        "WARN spillway_redis::breaker: Redis circuit opened: 5 consecutive calls failed, the last: connection refused; requests of store: redis buckets follow on_store_failure while Redis is probed every 250ms",
        "WARN spillway_redis::breaker: 43 Redis calls failed in the last 10 s (39 of them probes); the last: unknown error",
        "INFO spillway_redis::breaker: Redis circuit half-open after 12.0s out: a probe succeeded; ramping requests back through 10%, 25%, 50%, 75% over 1s",
        "INFO spillway_redis::breaker: Redis circuit closed: Redis trusted again after 13.0s out",
        "WARN spillway_redis::breaker: 8 Redis calls failed in the last 20 s (8 of them probes); the last: unknown error",
        "WARN spillway_redis::breaker: Redis call failed: timed out; further failures are summarised every 10s",
    ];
    assert_eq!(lines.len(), expected.len(), "{lines:#?}");
    for (line, expected) in lines.iter().zip(expected) {
        let (level, message) = expected.split_once(' ').unwrap();
        let (target, message) = message.split_once(' ').unwrap();
        assert_eq!(
            line.split_whitespace().take(2).collect::<Vec<_>>(),
            [level, target],
            "{line}"
        );
        assert!(line.contains(message), "{line}\nwanted: {message}");
        assert!(line.contains(redis), "{line}");
    }
}
