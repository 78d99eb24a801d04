//! Property tests on a fake clock: no algorithm admits more than its definition allows.

use std::time::Duration;

use proptest::prelude::*;
use spillway_core::algo::{
    AdaptiveTokenBucket, FixedWindow, Gcra, LeakyBucket, Rate, Ratio, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};
use spillway_core::clock::{Clock, FakeClock, NANOS_PER_SEC, Nanos};
use spillway_core::decision::Verdict;

/// A request: how long after the previous one it arrives (as a fraction of the period, in
/// thousandths, so traffic is dense enough to hit the limits), and its cost.
fn requests(max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..400, 1..=max_cost), 1..80)
}

fn rate() -> impl Strategy<Value = Rate> {
    (1u64..=20, 1u64..=2_000)
        .prop_map(|(count, ms)| Rate::new(count, Duration::from_millis(ms)).unwrap())
}

/// Drives `decide` through `reqs` on a fake clock and returns the admitted (time, cost) pairs.
fn admitted(
    period: Nanos,
    reqs: &[(u64, u64)],
    mut decide: impl FnMut(Nanos, u64) -> Verdict,
) -> Vec<(Nanos, u64)> {
    let clock = FakeClock::new(7 * period + 12_345);
    let mut out = Vec::new();
    for &(gap, cost) in reqs {
        clock.advance_nanos(period / 1000 * gap);
        let now = clock.now();
        if decide(now, cost).is_allow() {
            out.push((now, cost));
        }
    }
    out
}

/// The largest cost admitted in any half-open window `[t, t + len)`.
fn max_in_window(adm: &[(Nanos, u64)], len: Nanos) -> u64 {
    adm.iter()
        .map(|&(start, _)| {
            adm.iter()
                .filter(|&&(t, _)| t >= start && t < start + len)
                .map(|&(_, c)| c)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// The largest cost admitted in any one aligned window `[k x len, (k+1) x len)`.
fn max_in_aligned_window(adm: &[(Nanos, u64)], len: Nanos) -> u64 {
    let mut per = std::collections::BTreeMap::<u64, u64>::new();
    for &(t, c) in adm {
        *per.entry(t / len).or_default() += c;
    }
    per.into_values().max().unwrap_or(0)
}

/// `admitted between two admissions <= burst + rate x elapsed`, in whole intervals.
fn meter_bound_holds(adm: &[(Nanos, u64)], interval: Nanos, capacity: u64) -> bool {
    (0..adm.len()).all(|i| {
        let mut sum = 0u128;
        (i..adm.len()).all(|k| {
            sum += u128::from(adm[k].1);
            sum * u128::from(interval)
                <= u128::from(capacity * interval) + u128::from(adm[k].0 - adm[i].0)
        })
    })
}

proptest! {
    #[test]
    fn token_bucket_stays_within_capacity_plus_refill_and_never_below_zero(
        rate in rate(), capacity in 1u64..=30, reqs in requests(8),
    ) {
        let bucket = TokenBucket::new(rate, Some(capacity)).unwrap();
        let mut lowest = i64::MAX;
        let adm = admitted(rate.period_ns(), &reqs, |now, cost| {
            let v = bucket.decide(now, cost);
            lowest = lowest.min(bucket.tokens(now));
            v
        });
        prop_assert!(lowest >= 0, "tokens went down to {lowest}");
        prop_assert!(max_in_window(&adm, rate.period_ns()) <= rate.count() + capacity);
        prop_assert!(meter_bound_holds(&adm, bucket.interval_ns(), capacity));
    }

    #[test]
    fn gcra_stays_within_burst_plus_rate(
        rate in rate(), burst in 1u64..=30, reqs in requests(8),
    ) {
        let gcra = Gcra::new(rate, Some(burst)).unwrap();
        let adm = admitted(rate.period_ns(), &reqs, |now, cost| gcra.decide(now, cost));
        prop_assert!(max_in_window(&adm, rate.period_ns()) <= rate.count() + burst);
        prop_assert!(meter_bound_holds(&adm, gcra.interval_ns(), burst));
    }

    #[test]
    fn leaky_bucket_stays_within_rate_plus_burst_plus_one_request(
        rate in rate(), burst in 0u64..=10, reqs in requests(5),
    ) {
        let bucket = LeakyBucket::new(rate, Some(burst)).unwrap();
        let adm = admitted(rate.period_ns(), &reqs, |now, cost| bucket.decide(now, cost));
        let largest = reqs.iter().map(|&(_, c)| c).max().unwrap();
        // The last request of a window may overfill it by all but one unit of its cost.
        prop_assert!(max_in_window(&adm, rate.period_ns()) < rate.count() + burst + largest);
        // Admissions are spaced by the work in front of them, beyond the tolerated backlog.
        for pair in adm.windows(2) {
            let ((t0, c0), (t1, _)) = (pair[0], pair[1]);
            if burst == 0 {
                prop_assert!(t1 - t0 >= c0 * bucket.interval_ns());
            }
        }
    }

    #[test]
    fn fixed_window_admits_at_most_the_count_per_window(rate in rate(), reqs in requests(6)) {
        let window = FixedWindow::new(rate).unwrap();
        let adm = admitted(rate.period_ns(), &reqs, |now, cost| window.decide(now, cost));
        prop_assert!(max_in_aligned_window(&adm, rate.period_ns()) <= rate.count());
        prop_assert!(max_in_window(&adm, rate.period_ns()) <= 2 * rate.count());
    }

    #[test]
    fn sliding_log_admits_at_most_the_count_in_any_window(rate in rate(), reqs in requests(6)) {
        let log = SlidingWindowLog::new(rate);
        let adm = admitted(rate.period_ns(), &reqs, |now, cost| log.decide(now, cost));
        prop_assert!(max_in_window(&adm, rate.period_ns()) <= rate.count());
        // Memory is bounded by the count, whatever the traffic.
        prop_assert!(log.entries() as u64 <= rate.count());
    }

    #[test]
    fn sliding_counter_keeps_its_documented_bounds(rate in rate(), reqs in requests(6)) {
        let counter = SlidingWindowCounter::new(rate).unwrap();
        let adm = admitted(rate.period_ns(), &reqs, |now, cost| counter.decide(now, cost));
        prop_assert!(max_in_aligned_window(&adm, rate.period_ns()) <= rate.count());
        prop_assert!(max_in_window(&adm, rate.period_ns()) < 2 * rate.count());
    }

    #[test]
    fn adaptive_bucket_spends_no_more_than_it_earned_in_its_history(
        count in 1u64..=50, history in 1u64..=20, quarter in 1u64..=4, gaps in prop::collection::vec((0u64..300, 1u64..=5), 1..80),
    ) {
        let rate = Rate::per_second(count).unwrap();
        let bucket = AdaptiveTokenBucket::new(rate, history).unwrap();
        bucket.set_share(0, Ratio::from_fraction(quarter, 4));
        // Gaps in milliseconds, so the ring turns over during a case.
        let clock = FakeClock::new(0);
        let mut adm = Vec::new();
        for &(gap, cost) in &gaps {
            clock.advance(Duration::from_millis(gap * 10));
            if bucket.decide(clock.now(), cost).is_allow() {
                adm.push((clock.now(), cost));
            }
        }
        // Earnings are count x share per second. Between two admissions the bucket can spend
        // what it held (its starting second of tokens, at the full share it starts with, plus at
        // most `history` seconds of earnings) and what it earned meanwhile.
        for i in 0..adm.len() {
            let mut sum = 0u128;
            for k in i..adm.len() {
                sum += u128::from(adm[k].1);
                let span = u128::from(adm[k].0 - adm[i].0 + history * NANOS_PER_SEC);
                let earned = span * u128::from(count * quarter) / u128::from(4 * NANOS_PER_SEC);
                let bound = u128::from(count) + earned + 1;
                prop_assert!(sum <= bound, "{sum} spent, at most {bound} held and earned");
            }
        }
    }
}

#[test]
fn fixed_window_lets_twice_the_limit_across_a_boundary_and_the_sliding_log_does_not() {
    // 100 per minute, spent at the last nanosecond of one window and the first of the next.
    let rate = Rate::new(100, Duration::from_secs(60)).unwrap();
    let period = rate.period_ns();
    let fixed = FixedWindow::new(rate).unwrap();
    let log = SlidingWindowLog::new(rate);
    let mut fixed_admitted = 0;
    let mut log_admitted = 0;
    for now in [period - 1, period] {
        for _ in 0..100 {
            fixed_admitted += u64::from(fixed.decide(now, 1).is_allow());
            log_admitted += u64::from(log.decide(now, 1).is_allow());
        }
    }
    // Both happened within 2 ns, far inside one minute.
    assert_eq!(fixed_admitted, 200);
    assert_eq!(log_admitted, 100);
}
