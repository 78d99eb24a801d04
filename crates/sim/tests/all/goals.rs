//! The accuracy the shared cores reach on the simulator's scenarios, as invariants
//! over several seeds: each bound sits above the scenario's own noise band (`Metrics::noise`),
//! and each names the figure it was measured at with `cargo run -p spillway-sim --example seeds
//! -- SCENARIO 1 8` (docs/simulation.md).

use spillway_sim::{Algorithm, RunResult, Scenario, run};

/// Runs `name` for `seeds`, two at a time.
fn runs(
    name: &str,
    duration_s: Option<f64>,
    algorithm: Algorithm,
    seeds: &[u64],
) -> Vec<RunResult> {
    let scenario = Scenario::named(name, duration_s).unwrap();
    seeds
        .chunks(2)
        .flat_map(|pair| {
            std::thread::scope(|s| {
                let handles: Vec<_> = pair
                    .iter()
                    .map(|&seed| {
                        let scenario = &scenario;
                        s.spawn(move || run(scenario, algorithm, seed, &|_| {}).unwrap())
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect()
}

#[test]
fn the_end_of_a_surge_costs_a_tenth_of_the_wrongful_drops_and_keeps_its_enforcement() {
    // The hosts hold the rate they were granted once their load falls, where the ratio alone
    // kept dropping 93% of a load under the limit for a second: 21,000-29,000 wrongful drops
    // per run of seeds 1-8 before, 1,787-1,989 after (80 s runs).
    for r in runs("surge-15x", Some(40.0), Algorithm::DropRatio, &[1, 2, 3]) {
        let m = r.metrics;
        eprintln!("seed {}: {m:?}", r.seed);
        assert!(m.wrongful_drops <= 2_100, "seed {}: {m:?}", r.seed);
        assert!(
            m.enforcement_delay_s.unwrap() <= 0.2,
            "seed {}: {m:?}",
            r.seed
        );
    }
}

#[test]
fn a_one_and_a_half_times_overload_overshoots_at_most_five_percent() {
    // Peak overshoot 1.8-3.7% over seeds 1-20 (15-16% on some seeds before a silent host's or
    // zone's last counts stood in for its missing report); a 1 s window's own noise at the limit
    // is 3%. Enforcement: 1.0 s on every seed (1.0-1.1 s before the controllers instructed from
    // their own region's rise without waiting for the peers).
    for r in runs(
        "overload-1.5x",
        None,
        Algorithm::DropRatio,
        &[1, 2, 3, 4, 5, 6, 7, 8],
    ) {
        let m = &r.metrics;
        assert!(m.peak_overshoot.unwrap() <= 0.05, "seed {}: {m:?}", r.seed);
        assert!(
            m.enforcement_delay_s.unwrap() <= 1.0 + 1e-9,
            "seed {}: {m:?}",
            r.seed
        );
        assert!(m.steady_error.unwrap() <= 0.01, "seed {}: {m:?}", r.seed);
    }
}

#[test]
fn many_small_callers_are_held_to_their_limit_from_the_second_after_the_first() {
    // 2,000 callers of under a request a second each step from 400 to 1,500/s against 500/s:
    // no host can tell its surge from noise, so the loop enforces it. Its first instruction
    // leaves when the region's own zones are in (a controller does not wait for the peers'
    // sums when its zones show a clear rise), 10-15 ms after the interval's end where it took
    // 100-180 ms: the second after the first admits -5.0% to 11.4% over the limit over seeds
    // 1-20, mean 3.2% (0.6-31.8% before). The second's own noise is 13.4% at three standard
    // deviations, so each seed is held to 10% plus one deviation, and the seeds' mean to 10%.
    // Enforcement reads 1.0 s on 19 of 20 seeds and 1.1 s on 1 (a 100 ms sample's noise is 42%).
    let results = runs(
        "many-callers",
        Some(30.0),
        Algorithm::DropRatio,
        &[1, 2, 3, 4, 5, 6, 7, 8],
    );
    let mut seconds = 0.0;
    for r in &results {
        let m = &r.metrics;
        eprintln!("seed {}: {m:?}", r.seed);
        let second = m.second_after_first.unwrap();
        seconds += second;
        assert!(
            second <= 0.10 + m.noise.second_3sd / 3.0,
            "seed {}: {m:?}",
            r.seed
        );
        assert!(
            m.enforcement_delay_s.unwrap() <= 1.1 + 1e-9,
            "seed {}: {m:?}",
            r.seed
        );
    }
    let mean = seconds / results.len() as f64;
    assert!(mean <= 0.10, "mean second after the first {mean}");
}

#[test]
fn a_lost_region_is_not_counted_beyond_one_interval() {
    // Region 3 is lost at 35 s and its load fails over to the others. Its last sums stood in
    // until the TTL: 6,300-8,000/s of the 10,000/s limit from 36 s to 39 s. Now the interval
    // after its last sums still counts them (36.0-37.0 s admits about 7,500/s) and none after
    // does: from 37.1 s every second admits the limit, within its own noise.
    for r in runs("region-loss", None, Algorithm::DropRatio, &[1, 2, 3, 4]) {
        let m = &r.metrics;
        let samples: Vec<_> = r
            .trace
            .samples
            .iter()
            .filter(|s| (37.1..45.0).contains(&s.t_s))
            .collect();
        for second in samples.windows(10) {
            let admitted: u64 = second.iter().map(|s| s.admitted).sum();
            assert!(
                admitted as f64 >= 10_000.0 * (1.0 - m.noise.second_3sd),
                "seed {}: {admitted} admitted in the second from {:.1} s",
                r.seed,
                second[0].t_s
            );
        }
        assert!(m.peak_overshoot.unwrap() <= 0.05, "seed {}: {m:?}", r.seed);
        assert!(
            m.enforcement_delay_s.unwrap() <= 1.0 + 1e-9,
            "seed {}: {m:?}",
            r.seed
        );
    }
}

#[test]
fn small_callers_get_equal_shares_from_the_drop_schedule() {
    // Jain's index among 2,000 callers of about 0.75 requests/s: 0.998-0.999 over seeds 1-8
    // (one seed here, each run holds 2,000 hosts)
    // with the drop schedule, 0.973-0.979 with independent coins, which the simulator prints
    // as the coins' own band (`Noise::coin_jain`).
    for r in runs("many-callers", Some(60.0), Algorithm::DropRatio, &[1]) {
        let m = r.metrics;
        assert!(m.jain.unwrap() >= 0.99, "seed {}: {m:?}", r.seed);
        assert!(
            m.jain.unwrap() > m.noise.coin_jain.unwrap() + 0.01,
            "seed {}: {m:?}",
            r.seed
        );
    }
    for r in runs("many-callers", Some(60.0), Algorithm::DropRatioCoin, &[1]) {
        let m = r.metrics;
        assert!(m.jain.unwrap() < 0.99, "the coin: {m:?}");
    }
}

#[test]
fn under_overload_the_sheddable_tier_absorbs_the_drops_and_critical_traffic_is_untouched() {
    // 1.5x the limit, 40% of it sheddable (half the hosts send 80%, the other half
    // none, so the split must come from the whole scope's load). The third to drop is about 5/6
    // of the sheddable traffic (the hosts' random weights move the fleet's sheddable share):
    // seeds 1-8 drop 0.0% of critical requests and 78.4-87.0% of sheddable ones, 33.3-33.5% in
    // all (`spillway sim --scenario criticality --seed N`).
    for r in runs("criticality", None, Algorithm::DropRatio, &[1, 2, 3, 4]) {
        let m = r.metrics;
        eprintln!("seed {}: {m:?}", r.seed);
        let tiers = m.tier_drops.expect("the scenario mixes tiers");
        assert!(tiers.critical < 0.01, "seed {}: {tiers:?}", r.seed);
        assert!(
            (0.75..0.9).contains(&tiers.sheddable),
            "seed {}: {tiers:?}",
            r.seed
        );
        // The total is the limit's, as without tiers.
        assert!(m.steady_error.unwrap() < 0.02, "seed {}: {m:?}", r.seed);
    }
    // An adaptive token bucket has no tiers: it drops critical requests as often as sheddable
    // ones, which is what the split saves.
    for r in runs("criticality", None, Algorithm::AdaptiveTokenBucket, &[1]) {
        let tiers = r.metrics.tier_drops.unwrap();
        assert!(tiers.critical > 0.2, "{tiers:?}");
    }
}

#[test]
fn one_hosts_burst_under_the_limit_costs_a_tenth_of_the_wrongful_drops() {
    // host 0 adds 50 times its load while the fleet is at 60% of its limit. Its guard cannot
    // tell that from a fleet-wide surge and holds it to its part; its surge report, answered by
    // the controller from the zones' rates now, lets it go: 80-128 wrongful drops over seeds
    // 1-8, where it was held until the interval's report had counted the burst (2,903-3,704,
    // 2,960 on seed 3).
    for r in runs("host-burst", None, Algorithm::DropRatio, &[1, 2, 3, 4]) {
        let m = &r.metrics;
        assert!(m.wrongful_drops <= 296, "seed {}: {m:?}", r.seed);
    }
}

#[test]
fn a_host_that_leaves_costs_at_most_one_interval_of_under_admission() {
    // Issue 20's release after a host leaves, on the demo's fleet (`sidecar-leaves`: four hosts
    // in two zones at 9x a limit of 200/s; host 4 leaves at 9 s, at an interval's start, and its
    // load moves to the other three). The leaving host's last report counts what it counted of
    // its interval, unscaled, and is no peer in its zone's bound. Measured over seeds 1-20: the
    // second after the leave admits 0.785-0.990 of the limit (the remaining host of that zone is
    // bounded by the limit from then on; real processes at this phase admitted 1.000-1.010, see
    // docs/control-plane.md), and from a second after the leave to the end (5 s) 0.981-1.020:
    // no under-admission past the one interval.
    // `cargo bench -p spillway-cli --bench real_vs_sim` runs the same shape at five phases
    // beside real processes.
    let scenario = Scenario::named("sidecar-leaves", None).unwrap();
    let (leave, step) = (scenario.host_leave.unwrap().1, scenario.step_from_s);
    let seeds: Vec<u64> = (1..=20).collect();
    for r in runs("sidecar-leaves", None, Algorithm::DropRatio, &seeds) {
        let f =
            spillway_sim::StepAndLeave::of_samples(&r.trace.samples, 200.0, step, leave).unwrap();
        assert!(
            (0.95..1.05).contains(&f.after_leave),
            "seed {}: {f:?}",
            r.seed
        );
        assert!(f.leave_second > 0.7, "seed {}: {f:?}", r.seed);
        // The step itself: cut within 0.5 s and held to the limit before the leave.
        assert!(
            f.delay_s.is_some_and(|d| d <= 0.5),
            "seed {}: {f:?}",
            r.seed
        );
        assert!((0.95..1.05).contains(&f.steady), "seed {}: {f:?}", r.seed);
    }
}

#[test]
fn a_killed_leader_is_replaced_at_the_next_epoch_and_its_hosts_hold_their_instructions_until_then()
{
    // Region 1's leader dies at 35 s under a 1.5x overload; its standby leads after the 3 s
    // lease. Seeds 1-3 measured: the standby's first instructions left 3.8-4.1 s after the
    // death (its first interval closed about a second after it led); every second from the
    // death to 47 s admitted 98-103% of the limit over seeds 1-5 (the other regions hold the
    // silent region's last load while its hosts hold their last ratio).
    for r in runs("controller-failover", None, Algorithm::DropRatio, &[1, 2]) {
        let f = r.trace.failover.expect("the scenario kills a leader");
        assert_eq!((f.killed_s, f.led_s, f.epoch), (35.0, 38.0, 2));
        let instructed = f.instructed_s.expect("the standby instructs");
        assert!(
            (38.0..40.0).contains(&instructed),
            "seed {}: the new leader instructed at {instructed} s",
            r.seed
        );
        let reached = f.reached_zone_s.expect("its instructions reach the zones");
        assert!(reached >= instructed && reached < instructed + 0.1);
        let second = |s: usize| -> f64 {
            let admitted: u64 = r.trace.samples[s * 10..s * 10 + 10]
                .iter()
                .map(|x| x.admitted)
                .sum();
            admitted as f64 / r.scenario.limit_rps
        };
        // The hosts held their last instructions (TTL 5 s, from about 35 s): no second failed
        // open, which would admit the whole 1.5x.
        for s in 35..(reached.ceil() as usize) {
            assert!(
                (0.9..1.15).contains(&second(s)),
                "seed {}: second {s} admitted {:.2} of the limit",
                r.seed,
                second(s)
            );
        }
        let settled = reached.ceil() as usize + 2;
        for s in settled..settled + 5 {
            assert!(
                (0.94..1.06).contains(&second(s)),
                "seed {}: second {s} after the new leader admitted {:.2} of the limit",
                r.seed,
                second(s)
            );
        }
    }
}

#[test]
fn a_token_budget_admits_its_budget_over_the_window_and_rarely_refuses_under_it() {
    // Answers of 100 to 2,000 tokens, charged when they end (up to 10.5 s after admission):
    // 0.962-1.074 of the budget over the 50 s window on seeds 1-24, 1.007 on average (0.962-
    // 1.065 on seeds 1-8), inside the window's noise band of ±15.5% (about 470 answers of
    // spread sizes); 18 of 3,313 requests refused while the fleet offered half the budget,
    // every one while it had room (docs/token-budgets.md).
    let results = runs(
        "tokens",
        None,
        Algorithm::DropRatio,
        &[1, 2, 3, 4, 5, 6, 7, 8],
    );
    let mut admitted = 0.0;
    let (mut offered, mut wrongful) = (0, 0);
    for r in &results {
        let m = &r.metrics;
        let t = m.tokens.unwrap();
        eprintln!("seed {}: {t:?}", r.seed);
        assert!(
            (t.admitted - 1.0).abs() <= m.noise.window_3sd,
            "seed {}: {t:?}",
            r.seed
        );
        assert!(t.under_wrongful <= t.under_refused && t.under_refused < t.under_offered);
        admitted += t.admitted / results.len() as f64;
        offered += t.under_offered;
        wrongful += t.under_wrongful;
    }
    assert!((admitted - 1.0).abs() <= 0.03, "{admitted} of the budget");
    assert!(
        (wrongful as f64) < 0.05 * offered as f64,
        "{wrongful} of {offered} refused under the budget"
    );
}
