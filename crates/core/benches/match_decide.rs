//! The whole hot path of one request in `spillway-core`: match the request against the rule set,
//! then decide every matching bucket (drop-ratio at 33%, the default algorithm under overload) and
//! count the outcome, on one thread and on two, for 1 bucket and for 1,000.
//!
//! One clock read serves every bucket of a request, as in the proxy: the precise clock
//! (`Instant`, about 22 ns here) or the coarse one (about 2 ns, millisecond resolution). Run:
//! `cargo bench -p spillway-core --bench match_decide -- --warm-up-time 1 --measurement-time 3`.

use spillway_core::criticality::Criticality;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use spillway_core::algo::{DropRatio, Ratio};
use spillway_core::clock::{Clock, CoarseClock, SystemClock};
use spillway_core::counters::{BucketCounters, Outcome};
use spillway_core::decision::{Decision, Mode};
use spillway_core::matcher::{Matcher, Matches};
use spillway_core::pattern::{MatchSpec, RequestAttrs};

mod common;
use common::{one_bucket, one_bucket_hit, thousand_buckets, thousand_buckets_hit};

/// A compiled rule set: the matcher, and per bucket its limiter and counters.
struct RuleSet {
    matcher: Matcher,
    limiters: Vec<DropRatio>,
    counters: Vec<BucketCounters>,
}

impl RuleSet {
    fn new(specs: &[MatchSpec]) -> Self {
        let limiters = specs
            .iter()
            .map(|_| {
                let limiter = DropRatio::new(Duration::from_secs(1));
                limiter.set(Ratio::from_fraction(1, 3), u64::MAX);
                limiter
            })
            .collect();
        RuleSet {
            matcher: Matcher::compile(specs),
            limiters,
            counters: specs.iter().map(|_| BucketCounters::default()).collect(),
        }
    }

    fn decide(&self, clock: &impl Clock, request: &RequestAttrs<'_>, out: &mut Matches) -> bool {
        self.matcher.find(request, out);
        let now = clock.now();
        let mut decision = Decision::Allow;
        for bucket in out.iter() {
            let i = bucket.index();
            let verdict = self.limiters[i].decide(now, Criticality::Critical);
            self.counters[i].record(Outcome::of(verdict, Mode::Enforce), 1);
            decision = decision.combine(verdict.into_decision(bucket, Mode::Enforce));
        }
        decision.forwards()
    }
}

/// Runs `iters` requests on each of `threads` threads at once; wall time divided by the thread
/// count, so two threads at 1.8x one read as at most 1/1.8 of the one-thread figure.
fn parallel(
    threads: u32,
    iters: u64,
    rules: &RuleSet,
    request: &RequestAttrs<'_>,
    clock: &impl Clock,
) -> Duration {
    let barrier = std::sync::Barrier::new(threads as usize + 1);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut out = rules.matcher.matches_buffer();
                barrier.wait();
                for _ in 0..iters {
                    black_box(rules.decide(clock, black_box(request), &mut out));
                }
            });
        }
        barrier.wait();
        Instant::now()
    })
    .elapsed()
        / threads
}

fn bench(c: &mut Criterion) {
    let system = SystemClock::new();
    let coarse = CoarseClock::new();
    for (name, specs, request) in [
        ("1_bucket", one_bucket(), one_bucket_hit()),
        ("1000_buckets", thousand_buckets(), thousand_buckets_hit()),
    ] {
        let rules = RuleSet::new(&specs);
        let mut out = rules.matcher.matches_buffer();
        rules.matcher.find(&request, &mut out);
        assert!(!out.is_empty(), "{name}: the request must hit a bucket");
        c.bench_function(&format!("match+decide/1-thread/{name}"), |b| {
            b.iter(|| rules.decide(&system, black_box(&request), &mut out))
        });
        c.bench_function(&format!("match+decide/1-thread-coarse-clock/{name}"), |b| {
            b.iter(|| rules.decide(&coarse, black_box(&request), &mut out))
        });
        for threads in [1, 2] {
            c.bench_function(
                &format!("match+decide/{threads}-threads-spawned/{name}"),
                |b| b.iter_custom(|iters| parallel(threads, iters, &rules, &request, &coarse)),
            );
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
