//! The concurrency limits against a simulated upstream: a fixed number of workers, each serving
//! one request at a time in a fixed service time (with a little jitter), a FIFO queue in front
//! of them, so that past the workers every request more in flight only adds latency. Requests
//! arrive open-loop at twice the upstream's capacity and pass the real [`Gate`], which the
//! simulation updates every 50 ms of simulated time as the proxy does.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use spillway_core::concurrency::{AlgorithmName, ConcurrencySettings, Gate, Permit, UPDATE_EVERY};
use spillway_core::criticality::Criticality;

/// One phase of the upstream: its service time from `from` on.
#[derive(Debug, Clone, Copy)]
struct Phase {
    from: Duration,
    service: Duration,
}

#[derive(Debug, Clone)]
struct Upstream {
    workers: usize,
    phases: Vec<Phase>,
}

impl Upstream {
    fn service(&self, at: Duration) -> Duration {
        self.phases
            .iter()
            .rev()
            .find(|p| p.from <= at)
            .map_or(self.phases[0].service, |p| p.service)
    }
}

/// What one stretch of the run saw.
#[derive(Debug, Default, Clone)]
struct Stretch {
    completed: u64,
    latency_sum: Duration,
    rejected: u64,
}

impl Stretch {
    fn goodput(&self, seconds: f64) -> f64 {
        self.completed as f64 / seconds
    }

    fn mean_latency(&self) -> Duration {
        self.latency_sum / (self.completed.max(1) as u32)
    }
}

struct Run {
    /// Every limit the gate published, with its time.
    limits: Vec<(Duration, u32)>,
    /// The most in flight right after an admission, against the limit then.
    overshoot: Option<(u32, u32)>,
    /// The completions in each second.
    seconds: Vec<Stretch>,
}

/// Runs `upstream` behind a gate of `settings` for `length`, offered `rate` requests a second.
fn run(
    upstream: &Upstream,
    settings: ConcurrencySettings,
    rate: f64,
    length: Duration,
    seed: u64,
) -> Run {
    let gate = Gate::new(Some(settings), Duration::ZERO);
    let mut rng = fastrand::Rng::with_seed(seed);
    // When each worker is next free: FIFO, so a request takes the worker free soonest.
    let mut free_at: BinaryHeap<Reverse<Duration>> = (0..upstream.workers)
        .map(|_| Reverse(Duration::ZERO))
        .collect();
    let mut completions: BinaryHeap<Reverse<(Duration, u64)>> = BinaryHeap::new();
    let mut permits: std::collections::HashMap<u64, (Permit, Duration)> = Default::default();
    let mut out = Run {
        limits: vec![(Duration::ZERO, gate.limit())],
        overshoot: None,
        seconds: vec![Stretch::default(); length.as_secs() as usize + 1],
    };
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut next_arrival = Duration::ZERO;
    let mut next_update = UPDATE_EVERY;
    let mut id = 0u64;
    while next_arrival < length {
        let next_completion = completions.peek().map(|Reverse((at, _))| *at);
        if let Some(at) = next_completion.filter(|at| *at <= next_arrival.min(next_update)) {
            let Reverse((_, done)) = completions.pop().unwrap();
            let (permit, arrived) = permits.remove(&done).unwrap();
            permit.completed(at - arrived);
            let second = &mut out.seconds[at.as_secs() as usize];
            second.completed += 1;
            second.latency_sum += at - arrived;
        } else if next_update <= next_arrival {
            let limit = gate.update(next_update);
            out.limits.push((next_update, limit));
            next_update += UPDATE_EVERY;
        } else {
            let now = next_arrival;
            match gate.try_acquire(Criticality::Critical) {
                Ok(permit) => {
                    let (inflight, limit) = (gate.inflight(), gate.limit());
                    if inflight > limit {
                        out.overshoot.get_or_insert((inflight, limit));
                    }
                    let Reverse(free) = free_at.pop().unwrap();
                    let base = upstream.service(now);
                    let jitter = base.mul_f64(rng.f64() * 0.1);
                    let done = free.max(now) + base + jitter;
                    free_at.push(Reverse(done));
                    completions.push(Reverse((done, id)));
                    permits.insert(id, (permit, now));
                    id += 1;
                }
                Err(_) => out.seconds[now.as_secs() as usize].rejected += 1,
            }
            next_arrival += gap;
        }
    }
    out
}

/// The mean of the limits published in `[from, to)` seconds.
fn mean_limit(run: &Run, from: u64, to: u64) -> f64 {
    let range = Duration::from_secs(from)..Duration::from_secs(to);
    let limits: Vec<f64> = run
        .limits
        .iter()
        .filter(|(at, _)| range.contains(at))
        .map(|&(_, l)| f64::from(l))
        .collect();
    limits.iter().sum::<f64>() / limits.len() as f64
}

/// Where a limit near the upstream's capacity lies: from 90% of its workers (fewer would idle
/// them) to `1.5 x workers + 10`, gradient's fixed point `1.5 W + 4` with room for noise (Vegas
/// settles lower, within `W + 6 log10(limit)`).
fn near_capacity(limit: f64, workers: usize) -> bool {
    let w = workers as f64;
    (0.9 * w..=1.5 * w + 10.0).contains(&limit)
}

/// The seconds `[from, to)` summed.
fn stretch(run: &Run, from: u64, to: u64) -> Stretch {
    let mut sum = Stretch::default();
    for s in &run.seconds[from as usize..to as usize] {
        sum.completed += s.completed;
        sum.latency_sum += s.latency_sum;
        sum.rejected += s.rejected;
    }
    sum
}

fn algorithm() -> impl Strategy<Value = AlgorithmName> {
    prop_oneof![Just(AlgorithmName::Gradient), Just(AlgorithmName::Vegas)]
}

/// An upstream of 4 to 64 workers of 5 to 40 ms, and bounds that leave room for its capacity:
/// `min_limit` at most half the workers, `max_limit` at least twice them plus 8, and an initial
/// limit up to 16 times the workers (from 140 times, gradient was once seen still 75% above its
/// fixed point 20 s later).
fn case() -> impl Strategy<Value = (usize, u64, ConcurrencySettings, u64)> {
    (4usize..=64, 5u64..=40, algorithm(), any::<u64>()).prop_flat_map(
        |(workers, service_ms, algorithm, seed)| {
            let w = workers as u32;
            (1..=w / 2, 2 * w + 8..=1000, 1..=16 * w).prop_map(move |(min, max, initial)| {
                let settings = ConcurrencySettings {
                    algorithm,
                    min_limit: min,
                    max_limit: max,
                    initial_limit: initial.clamp(min, max),
                };
                (workers, service_ms, settings, seed)
            })
        },
    )
}

fn steady(workers: usize, service_ms: u64) -> Upstream {
    Upstream {
        workers,
        phases: vec![Phase {
            from: Duration::ZERO,
            service: Duration::from_millis(service_ms),
        }],
    }
}

/// Capacity in requests a second, at the mean service time (5% jitter on average).
fn capacity(workers: usize, service_ms: u64) -> f64 {
    workers as f64 / (service_ms as f64 * 1.05 / 1000.0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn concurrency_limit_stays_in_bounds_and_never_admits_past_it((workers, service_ms, settings, seed) in case()) {
        let upstream = steady(workers, service_ms);
        let rate = 2.0 * capacity(workers, service_ms);
        let run = run(&upstream, settings, rate, Duration::from_secs(20), seed);
        for &(at, limit) in &run.limits {
            prop_assert!(
                (settings.min_limit..=settings.max_limit).contains(&limit),
                "limit {limit} at {at:?} outside [{}, {}]", settings.min_limit, settings.max_limit
            );
        }
        prop_assert_eq!(run.overshoot, None, "more in flight than the limit (in flight, limit)");
    }

    #[test]
    fn concurrency_limit_converges_near_the_upstreams_capacity((workers, service_ms, settings, seed) in case()) {
        let upstream = steady(workers, service_ms);
        let cap = capacity(workers, service_ms);
        let run = run(&upstream, settings, 2.0 * cap, Duration::from_secs(30), seed);
        // The last 10 s: the upstream kept busy (goodput within 10% of its capacity), with a
        // limit near its workers, so what was admitted queued little.
        let end = stretch(&run, 20, 30);
        let limit = mean_limit(&run, 20, 30);
        prop_assert!(end.goodput(10.0) >= 0.9 * cap, "goodput {:.0}/s of {cap:.0}/s", end.goodput(10.0));
        prop_assert!(near_capacity(limit, workers), "mean limit {limit:.1} for {workers} workers (mean latency {:?})", end.mean_latency());
        prop_assert!(end.rejected > 0, "twice the capacity offered and nothing refused");
    }

    #[test]
    fn concurrency_limit_recovers_when_the_upstream_speeds_up_again((workers, service_ms, settings, seed) in case()) {
        // 10 s at the normal speed, 10 s three times slower, 15 s at the normal speed again.
        let normal = Duration::from_millis(service_ms);
        let upstream = Upstream {
            workers,
            phases: vec![
                Phase { from: Duration::ZERO, service: normal },
                Phase { from: Duration::from_secs(10), service: normal * 3 },
                Phase { from: Duration::from_secs(20), service: normal },
            ],
        };
        let cap = capacity(workers, service_ms);
        let run = run(&upstream, settings, 2.0 * cap, Duration::from_secs(35), seed);
        let slow = stretch(&run, 15, 20);
        let after = stretch(&run, 28, 35);
        // While slow, the latency stays bounded rather than growing with the queue...
        prop_assert!(slow.mean_latency() <= normal * 3 * 3, "mean latency {:?} while slow", slow.mean_latency());
        // ...and once fast again the upstream is kept busy at its normal latency.
        prop_assert!(after.goodput(7.0) >= 0.9 * cap, "goodput {:.0}/s of {cap:.0}/s after the speed-up", after.goodput(7.0));
        let limit = mean_limit(&run, 28, 35);
        prop_assert!(near_capacity(limit, workers), "mean limit {limit:.1} for {workers} workers after the speed-up");
    }
}

/// Without a limit the same upstream's queue grows for as long as the overload lasts: the
/// simulation measures what the limits prevent (a fixed limit as wide as the whole run's
/// arrivals admits them all).
#[test]
fn concurrency_unlimited_latency_grows_with_the_queue() {
    let upstream = steady(16, 10);
    let cap = capacity(16, 10);
    let run = run(
        &upstream,
        ConcurrencySettings::fixed(1_000_000),
        2.0 * cap,
        Duration::from_secs(10),
        1,
    );
    let late = stretch(&run, 8, 10);
    assert!(
        late.mean_latency() > Duration::from_secs(3),
        "mean latency {:?}",
        late.mean_latency()
    );
}

/// The gate shared by threads: admissions and completions racing each other never leave more
/// in flight than the limit, and every place is given back.
#[test]
fn concurrency_gate_holds_its_limit_across_threads() {
    let gate = Gate::new(Some(ConcurrencySettings::fixed(8)), Duration::ZERO);
    let peak = Arc::new(std::sync::atomic::AtomicU32::new(0));
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let (gate, peak) = (gate.clone(), peak.clone());
            scope.spawn(move || {
                for _ in 0..20_000 {
                    if let Ok(permit) = gate.try_acquire(Criticality::Critical) {
                        peak.fetch_max(gate.inflight(), std::sync::atomic::Ordering::Relaxed);
                        permit.completed(Duration::from_micros(10));
                    }
                }
            });
        }
    });
    assert!(peak.load(std::sync::atomic::Ordering::Relaxed) <= 8);
    assert_eq!(gate.inflight(), 0);
}
