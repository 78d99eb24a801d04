//! An exact `retry_after` for every deterministic algorithm: a denied request sent again exactly `retry_after` later
//! is admitted (if nothing else arrives), and one nanosecond earlier it is not.

use std::time::Duration;

use proptest::prelude::*;
use spillway_core::algo::{AdaptiveTokenBucket, Kind, Limiter, Rate, Ratio};
use spillway_core::clock::Nanos;
use spillway_core::decision::{NEVER, Verdict};

const DETERMINISTIC: [Kind; 7] = [
    Kind::TokenBucket,
    Kind::LeakyBucket,
    Kind::FixedWindow,
    Kind::SlidingWindowLog,
    Kind::SlidingWindowCounter,
    Kind::Gcra,
    Kind::AdaptiveTokenBucket,
];

/// Replays `history` on a fresh limiter and returns it.
fn replay(make: &dyn Fn() -> Limiter, history: &[(Nanos, u64)]) -> Limiter {
    let limiter = make();
    for &(t, c) in history {
        limiter.decide(t, c);
    }
    limiter
}

/// Checks the exact `retry_after` at every denial of `requests` (absolute times, costs). `may_never_fit` says which
/// costs may legitimately be refused forever.
fn check_every_denial(
    make: &dyn Fn() -> Limiter,
    requests: &[(Nanos, u64)],
    may_never_fit: &dyn Fn(u64) -> bool,
) -> Result<usize, TestCaseError> {
    let limiter = make();
    let mut denials = 0;
    for (i, &(t, cost)) in requests.iter().enumerate() {
        let Verdict::Deny { retry_after } = limiter.decide(t, cost) else {
            continue;
        };
        denials += 1;
        if retry_after == NEVER {
            prop_assert!(may_never_fit(cost), "cost {} can fit, yet NEVER", cost);
            continue;
        }
        prop_assert!(retry_after > Duration::ZERO);
        let wait = retry_after.as_nanos() as Nanos;
        // The replays include the denied request itself: "sent again", the case the promise names.
        let on_time = replay(make, &requests[..=i]);
        prop_assert!(
            on_time.decide(t + wait, cost).is_allow(),
            "request {} (cost {}) at {} not admitted after its retry-after {:?}",
            i,
            cost,
            t,
            retry_after
        );
        let early = replay(make, &requests[..=i]);
        prop_assert!(
            !early.decide(t + wait - 1, cost).is_allow(),
            "request {} (cost {}) at {} admitted 1ns before its retry-after {:?}",
            i,
            cost,
            t,
            retry_after
        );
    }
    Ok(denials)
}

fn requests(period_ms: u64) -> impl Strategy<Value = Vec<(Nanos, u64)>> {
    prop::collection::vec((0u64..300, 1u64..=3), 1..40).prop_map(move |gaps| {
        let mut t = 3 * period_ms * 1_000_000 + 777;
        gaps.into_iter()
            .map(|(gap, cost)| {
                t += period_ms * 1_000 * gap;
                (t, cost)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn retry_after_is_exact_for_every_deterministic_algorithm(
        (period_ms, reqs) in (1u64..=3_000).prop_flat_map(|p| (Just(p), requests(p))),
        count in 3u64..=12,
        burst in 3u64..=12,
    ) {
        let rate = Rate::new(count, Duration::from_millis(period_ms)).unwrap();
        for kind in DETERMINISTIC {
            let make = move || Limiter::new(kind, rate, kind.takes_burst().then_some(burst)).unwrap();
            // Costs are at most 3 and every capacity at least 3: all of them fit some day.
            check_every_denial(&make, &reqs, &|_| false)?;
        }
    }

    #[test]
    fn retry_after_is_exact_for_an_adaptive_bucket_with_a_partial_share(
        reqs in requests(1_000),
        count in 3u64..=40,
        history in 1u64..=20,
        share in 1u64..=1000,
    ) {
        let rate = Rate::per_second(count).unwrap();
        let make = move || {
            let b = AdaptiveTokenBucket::new(rate, history).unwrap();
            b.set_share(0, Ratio::from_fraction(share, 1000));
            Limiter::AdaptiveTokenBucket(b)
        };
        // The ring holds more than `history - 1` seconds of earnings only near the end of a
        // second, and never a full `history` seconds, so only costs above the former may never
        // fit.
        let may_never_fit = |cost: u64| cost * 1000 > count * share * (history - 1);
        check_every_denial(&make, &reqs, &may_never_fit)?;
    }
}

#[test]
fn the_generated_traffic_is_dense_enough_to_be_denied() {
    // Guards the properties above against vacuity: 40 requests of cost 3, 0.15 periods apart on
    // average, must hit a limit of 3 per period many times.
    let rate = Rate::new(3, Duration::from_millis(100)).unwrap();
    let reqs: Vec<(Nanos, u64)> = (0..40).map(|i| (i * 15_000_000, 3)).collect();
    for kind in DETERMINISTIC {
        let make = move || Limiter::new(kind, rate, kind.takes_burst().then_some(3)).unwrap();
        let denials = check_every_denial(&make, &reqs, &|_| false).unwrap();
        assert!(denials >= 10, "{}: only {denials} denials", kind.name());
    }
}
