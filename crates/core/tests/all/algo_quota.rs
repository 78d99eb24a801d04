//! What each algorithm reports as remaining and reset after a decision (Envoy's
//! `limit_remaining` and `duration_until_reset`), with worked numbers.

use std::time::Duration;

use spillway_core::algo::{Kind, Limiter, Quota, Rate, Ratio};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

fn quota(remaining: u64, reset_ms: u64) -> Quota {
    Quota {
        remaining,
        reset: Duration::from_millis(reset_ms),
    }
}

#[test]
fn a_fixed_window_counts_down_to_its_end() {
    let rate = Rate::new(100, Duration::from_secs(60)).unwrap();
    let w = Limiter::new(Kind::FixedWindow, rate, None).unwrap();
    assert!(w.decide(45 * SEC, 30).is_allow());
    assert_eq!(w.quota(45 * SEC, rate), quota(70, 15_000));
    assert_eq!(w.quota(60 * SEC, rate), quota(100, 60_000));
}

#[test]
fn a_token_bucket_refills_one_interval_per_missing_token() {
    let rate = Rate::new(10, Duration::from_secs(1)).unwrap();
    let b = Limiter::new(Kind::TokenBucket, rate, None).unwrap();
    assert_eq!(b.quota(0, rate), quota(10, 0));
    assert!(b.decide(0, 4).is_allow());
    assert_eq!(b.quota(0, rate), quota(6, 400));
    assert_eq!(b.quota(100 * MS, rate), quota(7, 300));
    let g = Limiter::new(Kind::Gcra, rate, Some(2)).unwrap();
    assert!(g.decide(0, 2).is_allow());
    assert!(!g.decide(0, 1).is_allow());
    assert_eq!(g.quota(0, rate), quota(0, 200));
}

#[test]
fn a_leaky_bucket_admits_one_more_while_its_queue_is_within_the_burst() {
    let rate = Rate::per_second(100).unwrap();
    let b = Limiter::new(Kind::LeakyBucket, rate, None).unwrap();
    assert_eq!(b.quota(0, rate), quota(1, 0));
    assert!(b.decide(0, 1).is_allow());
    assert_eq!(b.quota(4 * MS, rate), quota(0, 6));
    assert_eq!(b.quota(10 * MS, rate), quota(1, 0));
}

#[test]
fn sliding_windows_free_their_count_when_the_newest_units_leave() {
    let rate = Rate::per_second(10).unwrap();
    let log = Limiter::new(Kind::SlidingWindowLog, rate, None).unwrap();
    assert!(log.decide(0, 6).is_allow());
    assert!(log.decide(400 * MS, 4).is_allow());
    assert_eq!(log.quota(500 * MS, rate), quota(0, 900));
    assert_eq!(log.quota(SEC, rate), quota(6, 400));
    // One unit every 100 ms: at 1.05 s only the first has left the window.
    let paced = Limiter::new(Kind::SlidingWindowLog, rate, None).unwrap();
    for i in 0..10 {
        assert!(paced.decide(i * 100 * MS, 1).is_allow());
    }
    assert_eq!(paced.quota(900 * MS, rate), quota(0, 1_000));
    assert_eq!(paced.quota(1_050 * MS, rate), quota(1, 850));
    assert_eq!(paced.quota(2 * SEC, rate), quota(10, 0));
    let counter = Limiter::new(Kind::SlidingWindowCounter, rate, None).unwrap();
    assert!(counter.decide(0, 10).is_allow());
    assert!(counter.decide(1_500 * MS, 5).is_allow());
    // 10 x 0.5 + 5 = 10 used; the 5 of this second weigh until the end of the next one.
    assert_eq!(counter.quota(1_500 * MS, rate), quota(0, 1_500));
}

#[test]
fn a_drop_ratio_bucket_reports_the_share_its_instruction_admits() {
    let rate = Rate::per_second(300).unwrap();
    let d = Limiter::new(Kind::DropRatio, rate, None).unwrap();
    assert_eq!(d.quota(0, rate), quota(300, 1_000));
    if let Limiter::DropRatio(d) = &d {
        d.set(Ratio::from_fraction(1, 3), 10 * SEC);
    }
    assert_eq!(d.quota(0, rate), quota(199, 1_000));
}
