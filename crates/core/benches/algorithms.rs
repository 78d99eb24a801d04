//! Decision latency of every algorithm on one key, against governor's GCRA and a
//! `Mutex<HashMap>` counter as baselines in the same run, on one thread and on two.
//!
//! Every decision reads the coarse system clock, as the proxy does (governor reads its own,
//! `Instant`). Limits are set high enough that the admit path is measured, except for the 33%
//! drop ratio whose denials are the point. Run: `cargo bench -p spillway-core --bench algorithms -- --warm-up-time 1
//! --measurement-time 3`.

use spillway_core::criticality::Criticality;
use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use spillway_core::algo::{
    AdaptiveTokenBucket, DropRatio, FixedWindow, Gcra, LeakyBucket, Rate, Ratio,
    SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use spillway_core::clock::{Clock, CoarseClock};
use spillway_core::counters::{BucketCounters, Outcome};
use spillway_core::decision::Verdict;

/// A billion per second: nothing is denied over a benchmark's few seconds.
const HIGH: u64 = 1_000_000_000;

fn high_rate() -> Rate {
    Rate::per_second(HIGH).unwrap()
}

/// The naive baseline: one map of counters behind one lock.
struct MutexCounter {
    counts: Mutex<HashMap<u64, u64>>,
    limit: u64,
}

impl MutexCounter {
    fn decide(&self, key: u64) -> bool {
        let mut counts = self.counts.lock().unwrap();
        let n = counts.entry(key).or_insert(0);
        *n += 1;
        *n <= self.limit
    }
}

/// Runs `decide` `iters` times on each of `threads` threads at once and returns the wall time
/// divided by the number of threads: the time per decision of the pair, so "two threads at least
/// 1.8x one" reads as this figure being at most 1/1.8 of the one-thread figure.
fn parallel(threads: u32, iters: u64, decide: &(impl Fn() -> bool + Sync)) -> Duration {
    let barrier = std::sync::Barrier::new(threads as usize + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..iters {
                    black_box(decide());
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // Scoped threads are joined when the scope ends; time until then.
        start
    })
    .elapsed()
        / threads
}

fn allow(v: Verdict) -> bool {
    v.is_allow()
}

fn bench_one_thread(c: &mut Criterion) {
    let clock = CoarseClock::new();
    let mut g = c.benchmark_group("decide/1-thread");

    let governor = RateLimiter::direct(Quota::per_second(NonZeroU32::new(u32::MAX).unwrap()));
    g.bench_function("governor-baseline", |b| b.iter(|| governor.check().is_ok()));
    let naive = MutexCounter {
        counts: Mutex::new(HashMap::new()),
        limit: u64::MAX,
    };
    g.bench_function("mutex-hashmap-baseline", |b| {
        b.iter(|| naive.decide(black_box(7)))
    });

    let tb = TokenBucket::new(high_rate(), None).unwrap();
    g.bench_function("token-bucket", |b| {
        b.iter(|| allow(tb.decide(clock.now(), black_box(1))))
    });
    let gcra = Gcra::new(high_rate(), None).unwrap();
    g.bench_function("gcra", |b| {
        b.iter(|| allow(gcra.decide(clock.now(), black_box(1))))
    });
    let leaky = LeakyBucket::new(high_rate(), Some(HIGH)).unwrap();
    g.bench_function("leaky-bucket", |b| {
        b.iter(|| allow(leaky.decide(clock.now(), black_box(1))))
    });
    let fixed = FixedWindow::new(high_rate()).unwrap();
    g.bench_function("fixed-window", |b| {
        b.iter(|| allow(fixed.decide(clock.now(), black_box(1))))
    });
    let counter = SlidingWindowCounter::new(high_rate()).unwrap();
    g.bench_function("sliding-window-counter", |b| {
        b.iter(|| allow(counter.decide(clock.now(), black_box(1))))
    });
    // 10,000 per 10 µs keeps the log short (a few hundred entries) while admitting everything.
    let log = SlidingWindowLog::new(Rate::new(10_000, Duration::from_micros(10)).unwrap());
    g.bench_function("sliding-window-log", |b| {
        b.iter(|| allow(log.decide(clock.now(), black_box(1))))
    });
    let adaptive = AdaptiveTokenBucket::new(high_rate(), 10).unwrap();
    g.bench_function("adaptive-token-bucket", |b| {
        b.iter(|| allow(adaptive.decide(clock.now(), black_box(1))))
    });

    let none = DropRatio::new(Duration::from_secs(1));
    none.set(Ratio::ZERO, u64::MAX);
    g.bench_function("drop-ratio-0%", |b| {
        b.iter(|| allow(none.decide(clock.now(), Criticality::Critical)))
    });
    let third = DropRatio::new(Duration::from_secs(1));
    third.set(Ratio::from_fraction(1, 3), u64::MAX);
    g.bench_function("drop-ratio-33%", |b| {
        b.iter(|| allow(third.decide(clock.now(), Criticality::Critical)))
    });
    let coin = DropRatio::with_coin(Duration::from_secs(1));
    coin.set(Ratio::from_fraction(1, 3), u64::MAX);
    g.bench_function("drop-ratio-33%-coin", |b| {
        b.iter(|| allow(coin.decide(clock.now(), Criticality::Critical)))
    });
    let counters = BucketCounters::default();
    g.bench_function("drop-ratio-33%+counters", |b| {
        b.iter(|| {
            let v = third.decide(clock.now(), Criticality::Critical);
            counters.record(
                if v.is_allow() {
                    Outcome::Allowed
                } else {
                    Outcome::Dropped
                },
                1,
            );
            allow(v)
        })
    });
    g.finish();
}

fn bench_given_now(c: &mut Criterion) {
    // The algorithms alone: `now` is handed in, moving 1 ns per decision, as when the proxy reads
    // the clock once per request and decides several buckets with it. Governor cannot take a
    // time, so it has no line here.
    let mut g = c.benchmark_group("decide/1-thread-given-now");
    let now = std::cell::Cell::new(1_u64);
    let tick = || {
        let t = now.get() + 1;
        now.set(t);
        t
    };
    let tb = TokenBucket::new(high_rate(), None).unwrap();
    g.bench_function("token-bucket", |b| {
        b.iter(|| allow(tb.decide(tick(), black_box(1))))
    });
    let fixed = FixedWindow::new(high_rate()).unwrap();
    g.bench_function("fixed-window", |b| {
        b.iter(|| allow(fixed.decide(tick(), black_box(1))))
    });
    let none = DropRatio::new(Duration::from_secs(1));
    none.set(Ratio::ZERO, u64::MAX);
    g.bench_function("drop-ratio-0%", |b| {
        b.iter(|| allow(none.decide(tick(), Criticality::Critical)))
    });
    let third = DropRatio::new(Duration::from_secs(1));
    third.set(Ratio::from_fraction(1, 3), u64::MAX);
    g.bench_function("drop-ratio-33%", |b| {
        b.iter(|| allow(third.decide(tick(), Criticality::Critical)))
    });
    // The independent coin the drop schedule replaced, in the same run.
    let coin = DropRatio::with_coin(Duration::from_secs(1));
    coin.set(Ratio::from_fraction(1, 3), u64::MAX);
    g.bench_function("drop-ratio-33%-coin", |b| {
        b.iter(|| allow(coin.decide(tick(), Criticality::Critical)))
    });
    g.finish();
}

fn bench_two_threads(c: &mut Criterion) {
    let clock = CoarseClock::new();
    let mut g = c.benchmark_group("decide/2-threads");

    let governor = RateLimiter::direct(Quota::per_second(NonZeroU32::new(u32::MAX).unwrap()));
    g.bench_function("governor-baseline", |b| {
        b.iter_custom(|iters| parallel(2, iters, &|| governor.check().is_ok()))
    });
    let naive = MutexCounter {
        counts: Mutex::new(HashMap::new()),
        limit: u64::MAX,
    };
    g.bench_function("mutex-hashmap-baseline", |b| {
        b.iter_custom(|iters| parallel(2, iters, &|| naive.decide(black_box(7))))
    });
    let tb = TokenBucket::new(high_rate(), None).unwrap();
    g.bench_function("token-bucket", |b| {
        b.iter_custom(|iters| parallel(2, iters, &|| allow(tb.decide(clock.now(), 1))))
    });
    let third = DropRatio::new(Duration::from_secs(1));
    third.set(Ratio::from_fraction(1, 3), u64::MAX);
    g.bench_function("drop-ratio-33%", |b| {
        b.iter_custom(|iters| {
            parallel(2, iters, &|| {
                allow(third.decide(clock.now(), Criticality::Critical))
            })
        })
    });
    let coin = DropRatio::with_coin(Duration::from_secs(1));
    coin.set(Ratio::from_fraction(1, 3), u64::MAX);
    g.bench_function("drop-ratio-33%-coin", |b| {
        b.iter_custom(|iters| {
            parallel(2, iters, &|| {
                allow(coin.decide(clock.now(), Criticality::Critical))
            })
        })
    });
    let counters = BucketCounters::default();
    g.bench_function("drop-ratio-33%+counters", |b| {
        b.iter_custom(|iters| {
            parallel(2, iters, &|| {
                let v = third.decide(clock.now(), Criticality::Critical);
                counters.record(
                    if v.is_allow() {
                        Outcome::Allowed
                    } else {
                        Outcome::Dropped
                    },
                    1,
                );
                allow(v)
            })
        })
    });
    g.finish();
}

fn bench_one_thread_custom(c: &mut Criterion) {
    // The one-thread figures measured the same way as the two-thread ones (threads spawned per
    // sample), so the scaling ratio compares like with like.
    let clock = CoarseClock::new();
    let mut g = c.benchmark_group("decide/1-thread-spawned");
    let governor = RateLimiter::direct(Quota::per_second(NonZeroU32::new(u32::MAX).unwrap()));
    g.bench_function("governor-baseline", |b| {
        b.iter_custom(|iters| parallel(1, iters, &|| governor.check().is_ok()))
    });
    let tb = TokenBucket::new(high_rate(), None).unwrap();
    g.bench_function("token-bucket", |b| {
        b.iter_custom(|iters| parallel(1, iters, &|| allow(tb.decide(clock.now(), 1))))
    });
    let third = DropRatio::new(Duration::from_secs(1));
    third.set(Ratio::from_fraction(1, 3), u64::MAX);
    let counters = BucketCounters::default();
    g.bench_function("drop-ratio-33%+counters", |b| {
        b.iter_custom(|iters| {
            parallel(1, iters, &|| {
                let v = third.decide(clock.now(), Criticality::Critical);
                counters.record(
                    if v.is_allow() {
                        Outcome::Allowed
                    } else {
                        Outcome::Dropped
                    },
                    1,
                );
                allow(v)
            })
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_one_thread,
    bench_given_now,
    bench_one_thread_custom,
    bench_two_threads
);
criterion_main!(benches);
