//! The drop ratio's example: at 1.5x the limit the drop ratio is 1/3 and two thirds of requests get through,
//! on every instance alike; an expired instruction drops nothing.

use spillway_core::criticality::Criticality;
use std::time::Duration;

use spillway_core::algo::{DropRatio, Ratio};
use spillway_core::control::{Smoother, target_drop};

const DECISIONS: u64 = 1_000_000;

fn admitted_fraction(limiter: &DropRatio, now: u64, n: u64) -> f64 {
    let admitted = (0..n)
        .filter(|_| limiter.decide(now, Criticality::Critical).is_allow())
        .count();
    admitted as f64 / n as f64
}

fn within_half_a_percent_of_two_thirds(fraction: f64) -> bool {
    (fraction - 2.0 / 3.0).abs() <= 0.005 * 2.0 / 3.0
}

#[test]
fn one_and_a_half_times_the_limit_admits_two_thirds_of_a_million_decisions() {
    let ratio = target_drop(10_000.0, 15_000.0);
    assert!((ratio - 1.0 / 3.0).abs() < 1e-12, "ratio {ratio}");
    let fixed = Ratio::from_f64(ratio);
    assert!(fixed.raw().abs_diff(Ratio::from_fraction(1, 3).raw()) <= 1);

    let limiter = DropRatio::new(Duration::from_secs(1));
    limiter.set(fixed, u64::MAX);
    let fraction = admitted_fraction(&limiter, 0, DECISIONS);
    assert!(
        within_half_a_percent_of_two_thirds(fraction),
        "admitted {fraction}"
    );
}

#[test]
fn every_instance_drops_the_same_share() {
    // Two threads stand for two hosts; each gets its own thread-local generator and its own
    // stripe of the drop schedule.
    let limiter = DropRatio::new(Duration::from_secs(1));
    limiter.set(Ratio::from_fraction(1, 3), u64::MAX);
    let fractions: Vec<f64> = std::thread::scope(|s| {
        let hosts: Vec<_> = (0..2)
            .map(|_| s.spawn(|| admitted_fraction(&limiter, 0, DECISIONS / 2)))
            .collect();
        hosts.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for f in fractions {
        // Half the decisions per host: allow 0.75% (still over 5 standard deviations).
        assert!(
            (f - 2.0 / 3.0).abs() <= 0.0075 * 2.0 / 3.0,
            "host admitted {f}"
        );
    }
}

#[test]
fn a_seeded_generator_gives_the_same_decisions_every_run() {
    // A fresh limiter per run: the drop schedule carries what it owes from one request to the
    // next, so a second run on the same limiter starts from another state.
    let run = |seed| {
        let limiter = DropRatio::new(Duration::from_secs(1));
        limiter.set(Ratio::from_fraction(1, 3), u64::MAX);
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..DECISIONS)
            .filter(|_| {
                limiter
                    .decide_with(0, Criticality::Critical, &mut rng)
                    .is_allow()
            })
            .count()
    };
    let first = run(42);
    assert_eq!(first, run(42));
    assert!(within_half_a_percent_of_two_thirds(
        first as f64 / DECISIONS as f64
    ));
}

#[test]
fn the_controller_sends_a_third_at_one_and_a_half_times_the_limit() {
    // As the region's controller computes a bucket's ratio: the target, smoothed with the count
    // it came from.
    let mut smoother = Smoother::default();
    let ratio = Ratio::from_f64(smoother.update_counted(target_drop(1_000.0, 1_500.0), 1_500.0));
    assert!(ratio.raw().abs_diff(Ratio::from_fraction(1, 3).raw()) <= 1);
}

#[test]
fn an_expired_instruction_drops_nothing() {
    let limiter = DropRatio::new(Duration::from_secs(1));
    // Drop everything, for 5 s from t = 10 s.
    let ttl = Duration::from_secs(5);
    limiter.set_for(Ratio::ONE, 10_000_000_000, ttl);
    assert_eq!(admitted_fraction(&limiter, 14_999_999_999, 10_000), 0.0);
    assert_eq!(admitted_fraction(&limiter, 15_000_000_000, 10_000), 1.0);
    assert_eq!(limiter.current(15_000_000_000), None);
}
