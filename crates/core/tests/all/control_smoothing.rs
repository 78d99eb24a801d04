//! The controller's drop ratio over simulated intervals, computed as the region's controller
//! computes it (`target_drop`, then `Smoother::update_counted` with the count it came from): a
//! surge is cut in one interval, a clear fall is released at once without undershooting, and a
//! constant load does not make the ratio oscillate.

use spillway_core::criticality::Criticality;
use std::time::Duration;

use spillway_core::algo::{DropRatio, Ratio};
use spillway_core::control::{Smoother, target_drop};

const LIMIT: u64 = 10_000;
const INTERVAL: u64 = 1_000_000_000;

/// One run of the loop: each interval, `offered[i]` requests meet the instruction in force, the
/// controller reads what arrived and sends the next instruction. Returns, per interval, the
/// ratio that was in force and the requests admitted.
fn run(offered: &[u64], seed: u64) -> Vec<(f64, u64)> {
    let limiter = DropRatio::new(Duration::from_secs(1));
    let mut smoother = Smoother::default();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    for (i, &load) in offered.iter().enumerate() {
        let now = i as u64 * INTERVAL;
        let in_force = limiter.current(now).unwrap_or(Ratio::ZERO).as_f64();
        let admitted = (0..load)
            .filter(|_| {
                limiter
                    .decide_with(now, Criticality::Critical, &mut rng)
                    .is_allow()
            })
            .count() as u64;
        out.push((in_force, admitted));
        let target = target_drop(LIMIT as f64, load as f64);
        let next = Ratio::from_f64(smoother.update_counted(target, load as f64));
        limiter.set_for(next, now, Duration::from_secs(5));
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn a_step_up_is_cut_in_one_interval_and_holds_steady() {
    let mut offered = vec![5_000; 5];
    offered.extend([15_000; 30]);
    let trace = run(&offered, 1);
    // Interval 5 is the first surge interval, dropping nothing; from interval 6 on, 1/3.
    assert_eq!(trace[5].0, 0.0);
    for &(ratio, admitted) in &trace[6..] {
        assert!(close(ratio, 1.0 / 3.0), "ratio {ratio}");
        // 15,000 coins: the admitted count is within 3% (over 5 standard deviations).
        assert!(
            admitted.abs_diff(LIMIT) <= LIMIT * 3 / 100,
            "admitted {admitted}"
        );
    }
}

#[test]
fn a_constant_load_gives_one_constant_ratio() {
    let trace = run(&[15_000; 40], 2);
    let steady: Vec<f64> = trace[1..].iter().map(|&(r, _)| r).collect();
    assert!(steady.iter().all(|&r| r == steady[0]), "{steady:?}");
    assert!(close(steady[0], 1.0 / 3.0));
}

#[test]
fn a_noisy_constant_load_stays_within_the_band_of_its_targets() {
    // +-2% jitter around 1.5x: the ratio must stay between the targets of the lowest and highest
    // loads seen, rather than overshoot either way and swing.
    let mut rng = fastrand::Rng::with_seed(3);
    let offered: Vec<u64> = (0..200).map(|_| rng.u64(14_700..=15_300)).collect();
    let low = target_drop(LIMIT as f64, 14_700.0);
    let high = target_drop(LIMIT as f64, 15_300.0);
    let trace = run(&offered, 4);
    for &(ratio, _) in &trace[1..] {
        assert!(
            ratio >= low - 1e-9 && ratio <= high + 1e-9,
            "ratio {ratio} outside [{low}, {high}]"
        );
    }
    let admitted: u64 = trace[1..].iter().map(|&(_, a)| a).sum();
    let mean = admitted as f64 / (trace.len() - 1) as f64;
    // Releasing slowly errs on dropping a little more than needed, never on letting more in.
    assert!(
        mean <= LIMIT as f64 * 1.005 && mean >= LIMIT as f64 * 0.98,
        "mean admitted {mean}"
    );
}

#[test]
fn a_clear_step_down_is_released_at_once_without_undershooting() {
    let mut offered = vec![30_000; 5];
    offered.extend([15_000; 30]);
    let trace = run(&offered, 5);
    let ratios: Vec<f64> = trace.iter().map(|&(r, _)| r).collect();
    assert!(close(ratios[4], 2.0 / 3.0));
    // Interval 5 still has 2/3 in force; the fall to 1/3 is far beyond the noise of 15,000
    // requests, so the next interval has the new target in force, and keeps it.
    assert!(close(ratios[5], 2.0 / 3.0), "{}", ratios[5]);
    for &ratio in &ratios[6..] {
        assert!(close(ratio, 1.0 / 3.0), "ratio {ratio}");
    }
}
