//! The 3-tier feedback loop on simulated time: simulated clients, zone aggregators and regional
//! controllers, each tier its real sans-IO core, exchanging reports, instructions and global
//! sums over a simulated network. Every run is the same run, so where
//! a test bounds a time it bounds simulated time, with no slack for a busy machine.

use std::time::Duration;

use crate::support::{Fleet, Network, SERVICE, close, config};
use spillway_loop::{BucketKey, Interval, PARTITION_HOLD, Tally};

const INTERVAL: Duration = Duration::from_millis(200);
const L: f64 = 1000.0;

/// 1.5 L spread unevenly over 8 clients: region r1 offers 900/s, region r2 600/s.
const UNEVEN: [f64; 8] = [300.0, 200.0, 250.0, 150.0, 200.0, 100.0, 150.0, 150.0];

fn global_bucket() -> String {
    config(
        200,
        1000,
        &["{ name: global, limit: 1000/s, scope: global }"],
    )
}

#[test]
fn a_global_bucket_at_one_and_a_half_times_its_limit_drops_a_third_everywhere() {
    // Every message's delay varies by up to 5 ms, so reports of one interval arrive apart.
    let network = Network {
        jitter_ms: 5,
        seed: 7,
        ..Network::default()
    };
    let mut fleet = Fleet::start_on(network, &global_bucket(), 2, 2, 2);
    for (client, rate) in fleet.clients.iter_mut().zip(UNEVEN) {
        client.set_rate("global", rate);
    }
    let converged = |fleet: &Fleet| {
        fleet.all_drop("global", 1.0 / 3.0) && close(fleet.admitted("global"), L, 0.05 * L)
    };
    let took = fleet.wait_for(
        3 * INTERVAL,
        "every client drops 1/3 and L is admitted",
        converged,
    );
    eprintln!("converged {took:?} after the load started");
    // And it stays there, every millisecond of five intervals.
    for _ in 0..5 * INTERVAL.as_millis() {
        fleet.step();
        assert!(
            converged(&fleet),
            "left the steady state at {} ms: admitted {}",
            fleet.now_ms(),
            fleet.admitted("global")
        );
    }
    // Both controllers computed the same load from each other's sums.
    for r in 0..2 {
        let view = fleet.controller(r).view()[&BucketKey::new(SERVICE, "global")];
        assert!(close(view.observed_rps, 1.5 * L, 0.05 * L), "{view:?}");
        assert!(close(view.drop_ratio, 1.0 / 3.0, 0.03), "{view:?}");
    }
}

#[test]
fn a_surge_that_starts_mid_interval_gets_its_whole_ratio_from_the_first_instruction() {
    let mut fleet = Fleet::start(&global_bucket(), 2, 2, 2);
    let interval = Interval::new(INTERVAL);
    // 400/s in all, under the limit: nothing is dropped.
    for client in &mut fleet.clients {
        client.set_rate("global", 50.0);
    }
    fleet.wait_for(10 * INTERVAL, "no drops under the limit", |fleet| {
        fleet.clients.iter().all(|c| c.ratio("global") == 0.0)
    });
    // Two whole intervals at that load, so every report carries its tail.
    let calm = interval.sequence_at(fleet.now_ms()) + 2;
    // Then 15 L from 40% into an interval: its count alone would say 9,160/s, a ratio of
    // 0.891; its tail says 15,000/s, the ratio of 14/15.
    fleet.run_until(interval.end_of(calm) + 2 * interval.ms() / 5);
    let surge = interval.sequence_at(fleet.now_ms());
    for client in &mut fleet.clients {
        client.clear_first_drop();
        client.set_rate("global", 1875.0);
    }
    assert!(
        fleet.now_ms() < Tally::tail_start(interval, surge),
        "the surge began before the interval's tail"
    );
    fleet.wait_for(10 * INTERVAL, "every client drops", |fleet| {
        fleet
            .clients
            .iter()
            .all(|c| c.first_drop("global").is_some())
    });
    for client in &fleet.clients {
        let (ratio, at) = client.first_drop("global").unwrap();
        // Interval `surge + 1` is reported at its end: nothing before that comes from it.
        assert!(
            at < interval.end_of(surge + 1),
            "{}'s first instruction came {} ms after the surge's interval ended",
            client.id,
            at - interval.end_of(surge)
        );
        assert!(
            close(ratio, 14.0 / 15.0, 0.03),
            "the first instruction after the surge's interval carries {ratio}"
        );
    }
}

#[test]
fn zone_and_region_scoped_buckets_limit_only_their_zone_or_region() {
    let yaml = config(
        200,
        1000,
        &[
            "{ name: per-zone, match: { procedure: /z }, limit: 100/s, scope: zone }",
            "{ name: per-region, match: { procedure: /r }, limit: 200/s, scope: region }",
        ],
    );
    let mut fleet = Fleet::start(&yaml, 2, 2, 2);
    for client in &mut fleet.clients {
        // Zone r1z1 offers 150/s against 100/s; every other zone 50/s.
        let zone = if client.zone == "r1z1" { 75.0 } else { 25.0 };
        client.set_rate("per-zone", zone);
        // Region r1 offers 300/s against 200/s; r2 offers 160/s.
        let region = if client.region == "r1" { 75.0 } else { 40.0 };
        client.set_rate("per-region", region);
    }
    fleet.wait_for(
        3 * INTERVAL,
        "only the overloaded zone and region drop",
        |fleet| {
            fleet.clients.iter().all(|c| {
                let zone = if c.zone == "r1z1" { 1.0 / 3.0 } else { 0.0 };
                let region = if c.region == "r1" { 1.0 / 3.0 } else { 0.0 };
                close(c.ratio("per-zone"), zone, 0.03) && close(c.ratio("per-region"), region, 0.03)
            })
        },
    );
    let zone_admitted: f64 = fleet
        .clients
        .iter()
        .filter(|c| c.zone == "r1z1")
        .map(|c| c.admitted("per-zone"))
        .sum();
    assert!(
        close(zone_admitted, 100.0, 5.0),
        "zone r1z1 admits {zone_admitted}"
    );
    let region_admitted: f64 = fleet
        .clients_of("r1")
        .map(|c| c.admitted("per-region"))
        .sum();
    assert!(
        close(region_admitted, 200.0, 10.0),
        "region r1 admits {region_admitted}"
    );
}

#[test]
fn a_region_limit_is_enforced_by_its_regions_controller_and_the_others_keep_the_bucket_limit() {
    let yaml = config(
        200,
        1000,
        &["{ name: per-region, limit: 200/s, scope: region, region_limits: { r2: 100/s } }"],
    );
    let mut fleet = Fleet::start(&yaml, 2, 2, 2);
    for client in &mut fleet.clients {
        // 300/s in each region: r1 against the bucket's 200/s, r2 against its own 100/s.
        client.set_rate("per-region", 75.0);
    }
    fleet.wait_for(
        3 * INTERVAL,
        "each region drops down to its own limit",
        |fleet| {
            fleet.clients.iter().all(|c| {
                let region = if c.region == "r1" {
                    1.0 / 3.0
                } else {
                    2.0 / 3.0
                };
                close(c.ratio("per-region"), region, 0.03)
            })
        },
    );
    for (region, limit) in [("r1", 200.0), ("r2", 100.0)] {
        let admitted: f64 = fleet
            .clients_of(region)
            .map(|c| c.admitted("per-region"))
            .sum();
        assert!(
            close(admitted, limit, limit * 0.05),
            "region {region} admits {admitted} against {limit}"
        );
    }
}

#[test]
fn without_the_controller_clients_fail_open_within_the_ttl_and_a_restart_restores_enforcement() {
    let ttl = Duration::from_millis(1000);
    let mut fleet = Fleet::start(&global_bucket(), 1, 2, 2);
    for client in &mut fleet.clients {
        client.set_rate("global", 375.0);
    }
    let enforcing = |fleet: &Fleet| fleet.all_drop("global", 1.0 / 3.0);
    fleet.wait_for(3 * INTERVAL, "enforcement before the kill", enforcing);

    fleet.kill_controller(0);
    let took = fleet.wait_for(ttl + INTERVAL, "every client fails open", |fleet| {
        fleet.clients.iter().all(|c| c.ratio("global") == 0.0)
    });
    eprintln!("failed open {took:?} after the controller stopped");
    // Not a moment before the TTL: the last instructions held for exactly their TTL.
    let last = fleet
        .clients
        .iter()
        .map(|c| c.last_instructions_ms())
        .max()
        .unwrap();
    assert_eq!(fleet.now_ms(), last + ttl.as_millis() as u64);
    assert!(
        fleet.aggregators().all(|a| a.hosts() == 2),
        "the aggregators still hold their clients' streams"
    );

    fleet.restart_controller(0);
    let took = fleet.wait_for(3 * INTERVAL, "enforcement after the restart", enforcing);
    eprintln!("enforcing again {took:?} after the restart");
}

#[test]
fn a_region_whose_peer_died_holds_the_peers_last_load_then_enforces_the_limit_alone() {
    let interval = Duration::from_millis(100);
    let ttl = Duration::from_millis(600);
    let yaml = config(
        100,
        600,
        &["{ name: global, limit: 1000/s, scope: global }"],
    );
    let mut fleet = Fleet::start(&yaml, 2, 2, 2);
    // r1 offers 1,200/s and r2 600/s: together 1.8 L, a drop ratio of 4/9.
    for client in &mut fleet.clients {
        let rate = if client.region == "r1" { 300.0 } else { 150.0 };
        client.set_rate("global", rate);
    }
    fleet.wait_for(3 * interval, "both regions drop 4/9", |fleet| {
        fleet.all_drop("global", 4.0 / 9.0)
    });

    fleet.kill_controller(1);
    let killed = fleet.now_ms();
    // r2 fails open within the TTL. r1's own load holds still, so r2's 600/s cannot have come
    // over: r1 holds r2's last sums and keeps dropping 4/9 for PARTITION_HOLD intervals.
    let held_until = killed + PARTITION_HOLD * interval.as_millis() as u64;
    fleet.run_until(killed + ttl.as_millis() as u64 + 100);
    while fleet.now_ms() < held_until {
        assert!(
            fleet
                .clients_of("r1")
                .all(|c| close(c.ratio("global"), 4.0 / 9.0, 0.03)),
            "r1 let go of its peer's load {} ms after it died",
            fleet.now_ms() - killed
        );
        fleet.step();
    }
    assert!(fleet.clients_of("r2").all(|c| c.ratio("global") == 0.0));
    assert!(fleet.controller(0).live_peers(fleet.now_ms()).is_empty());
    // Past the hold the peer counts for nothing: r1 enforces the limit on its own load, 1/6 of
    // its 1,200/s, and never stops dropping. The smoother releases from 4/9 to 1/6 by 30% of
    // the gap per interval: about 10 intervals to get within 0.03.
    loop {
        let after = fleet.now_ms() - held_until;
        assert!(
            fleet
                .clients_of("r1")
                .all(|c| c.ratio("global") >= 1.0 / 6.0 - 0.03),
            "r1 stopped enforcing {after} ms after the hold"
        );
        if fleet
            .clients_of("r1")
            .all(|c| close(c.ratio("global"), 1.0 / 6.0, 0.03))
        {
            break;
        }
        assert!(
            u128::from(after) < (20 * interval).as_millis(),
            "not settled"
        );
        fleet.step();
    }
    let admitted: f64 = fleet.clients_of("r1").map(|c| c.admitted("global")).sum();
    assert!(close(admitted, L, 0.05 * L), "r1 admits {admitted}");
}

#[test]
fn each_side_of_a_partition_keeps_its_part_of_the_limit_and_nothing_moves_when_it_heals() {
    // Three regions offering 1,600/s each against 3,200/s: every client drops 1/3. r3 is cut
    // off from the others for 30 intervals. The two still together hold r3's last 1,600/s and
    // r3 holds their 3,200/s, so every side keeps dropping 1/3: 3,200/s admitted in all, where
    // each side enforcing the whole limit alone would admit all 4,800/s. (A silent side must
    // offer more than the noise of the global count, HOLD_NOISE deviations: 160 requests an
    // interval here against 3 x sqrt(480) = 66.)
    let interval = Interval::new(Duration::from_millis(100));
    let yaml = config(
        100,
        600,
        &["{ name: global, limit: 3200/s, scope: global }"],
    );
    let mut fleet = Fleet::start(&yaml, 3, 1, 2);
    for client in &mut fleet.clients {
        client.set_rate("global", 800.0);
    }
    fleet.wait_for(
        interval.duration() * 20,
        "every region drops 1/3",
        |fleet| fleet.all_drop("global", 1.0 / 3.0),
    );
    fleet.partition(2, true);
    let cut = fleet.now_ms();
    let heal = cut + 30 * interval.ms();
    while fleet.now_ms() < heal {
        let admitted = fleet.admitted("global");
        assert!(
            close(admitted, 3200.0, 160.0),
            "{admitted}/s admitted {} ms into the partition",
            fleet.now_ms() - cut
        );
        fleet.step();
    }
    // Each side counted the other's load as it was, past the TTL.
    for r in 0..3 {
        let view = fleet.controller(r).view()[&BucketKey::new(SERVICE, "global")];
        assert!(
            close(view.observed_rps, 4800.0, 250.0),
            "r{}: {view:?}",
            r + 1
        );
    }
    fleet.partition(2, false);
    while fleet.now_ms() < heal + 10 * interval.ms() {
        let admitted = fleet.admitted("global");
        assert!(
            close(admitted, 3200.0, 160.0),
            "{admitted}/s after the heal"
        );
        fleet.step();
    }
    assert!(fleet.all_drop("global", 1.0 / 3.0));
}

#[test]
fn a_partition_longer_than_the_hold_leaves_each_side_enforcing_the_whole_limit() {
    // The bound of the hold: past PARTITION_HOLD intervals each side counts only its own load,
    // and at 1,600/s (the cut-off region) and 3,200/s (the others) against 3,200/s neither
    // drops.
    let interval = Interval::new(Duration::from_millis(100));
    let yaml = config(
        100,
        600,
        &["{ name: global, limit: 3200/s, scope: global }"],
    );
    let mut fleet = Fleet::start(&yaml, 3, 1, 2);
    for client in &mut fleet.clients {
        client.set_rate("global", 800.0);
    }
    fleet.wait_for(
        interval.duration() * 20,
        "every region drops 1/3",
        |fleet| fleet.all_drop("global", 1.0 / 3.0),
    );
    fleet.partition(2, true);
    let cut = fleet.now_ms();
    fleet.run_until(cut + (PARTITION_HOLD - 5) * interval.ms());
    assert!(
        fleet.all_drop("global", 1.0 / 3.0),
        "let go within the hold"
    );
    fleet.wait_for(
        interval.duration() * 20,
        "every side lets all through",
        |fleet| fleet.clients.iter().all(|c| c.ratio("global") < 0.01),
    );
}

#[test]
fn a_rule_change_reaches_every_client_and_the_controllers_show_it_live_everywhere() {
    let mut fleet = Fleet::start(&global_bucket(), 2, 2, 2);
    for client in &mut fleet.clients {
        client.set_rate("global", 187.5);
    }
    let first = fleet.rules().version;
    fleet.wait_for(5 * INTERVAL, "every client runs the first rules", |fleet| {
        fleet
            .clients
            .iter()
            .all(|c| c.rules_version() == first && first > 0)
    });

    let after = config(
        200,
        1000,
        &["{ name: global, limit: 750/s, scope: global }"],
    );
    let second = fleet.set_rules(&after);
    assert!(second > first);
    let took = fleet.wait_for(
        10 * INTERVAL,
        "every client runs the new rules and halves its load",
        |fleet| {
            fleet.all_drop("global", 0.5)
                && fleet
                    .clients
                    .iter()
                    .all(|c| c.rules_version() == second && c.runs_rules_of(&after))
        },
    );
    eprintln!("rules live everywhere {took:?} after the edit");

    // Each controller's hosts view: its own four hosts, all on the new version.
    fleet.wait_for(10 * INTERVAL, "both hosts views converge", |fleet| {
        (0..2).all(|r| {
            let core = fleet.controller(r);
            core.hosts().iter().all(|h| h.rules_version == second)
        })
    });
    for r in 0..2 {
        let core = fleet.controller(r);
        assert_eq!(core.rules().version, second);
        let hosts = core.hosts();
        assert_eq!(hosts.len(), 4, "{hosts:?}");
        for host in &hosts {
            assert!(
                host.host_id.starts_with(&format!("r{}", r + 1)),
                "{} in region {}",
                host.host_id,
                r + 1
            );
            assert_eq!(host.rules_version, second, "{host:?}");
        }
        let view = core.view()[&BucketKey::new(SERVICE, "global")];
        assert_eq!(view.limit_rps, 750.0);
        assert!(close(view.drop_ratio, 0.5, 0.03), "{view:?}");
    }
}

#[test]
fn adaptive_token_bucket_shares_follow_each_hosts_part_of_the_global_load() {
    let yaml = config(
        200,
        1000,
        &["{ name: adaptive, limit: 1000/s, scope: global, algorithm: adaptive-token-bucket }"],
    );
    let mut fleet = Fleet::start(&yaml, 2, 2, 1);
    // 500/s in all: each host's share is its part of it.
    let rates = [250.0, 125.0, 75.0, 50.0];
    for (client, rate) in fleet.clients.iter_mut().zip(rates) {
        client.set_rate("adaptive", rate);
    }
    fleet.wait_for(
        3 * INTERVAL,
        "every host's share is its offered / global offered",
        |fleet| {
            fleet.clients.iter().zip(rates).all(|(c, rate)| {
                c.share("adaptive")
                    .is_some_and(|share| close(share, rate / 500.0, 0.02))
            })
        },
    );
    // An adaptive bucket is never sent a drop ratio: its shares do the limiting.
    assert!(fleet.clients.iter().all(|c| c.ratio("adaptive") == 0.0));
}

/// 2 regions of 3 zones of 2 clients, 200 ms intervals, 60 ms between the controllers: every
/// client offers `rps` to the global bucket of 1,000/s until calm.
fn far_apart_fleet(rps: f64) -> Fleet {
    let network = Network {
        peer_ms: 60,
        ..Network::default()
    };
    let mut fleet = Fleet::start_on(network, &global_bucket(), 2, 3, 2);
    for client in &mut fleet.clients {
        client.set_rate("global", rps);
    }
    // Two whole intervals at that load after the first instruction.
    fleet.wait_for(10 * INTERVAL, "every client is instructed", |fleet| {
        fleet.clients.iter().all(|c| c.last_instructions_ms() > 0)
    });
    let interval = Interval::new(INTERVAL);
    fleet.run_until(interval.end_of(interval.sequence_at(fleet.now_ms()) + 2));
    fleet
}

#[test]
fn a_rise_every_zone_sees_is_instructed_before_the_peers_sums_arrive() {
    // 480/s, then 1,500/s from the start of an interval: every zone sees about 3 times its load.
    let mut fleet = far_apart_fleet(40.0);
    let interval = Interval::new(INTERVAL);
    let surge = interval.sequence_at(fleet.now_ms());
    for client in &mut fleet.clients {
        client.clear_first_drop();
        client.set_rate("global", 125.0);
    }
    fleet.wait_for(5 * INTERVAL, "every client drops", |fleet| {
        fleet
            .clients
            .iter()
            .all(|c| c.first_drop("global").is_some())
    });
    for client in &fleet.clients {
        let (ratio, at) = client.first_drop("global").unwrap();
        // The peers' sums of the surge's interval cross 60 ms; the provisional instructions
        // leave when this region's zones are in.
        assert!(
            at < interval.end_of(surge) + 30,
            "{}'s first instruction came {} ms after the surge's interval ended",
            client.id,
            at - interval.end_of(surge)
        );
        // The peer's load estimated as its last, scaled by this region's rise: about right.
        assert!(close(ratio, 1.0 / 3.0, 0.05), "{}: {ratio}", client.id);
    }
    for r in 0..2 {
        assert!(fleet.controller(r).provisionals() >= 1);
    }
    // The instructions from the real sums follow and hold.
    fleet.run_until(interval.end_of(surge + 3));
    assert!(fleet.all_drop("global", 1.0 / 3.0));
}

#[test]
fn a_rise_in_one_zone_of_three_is_not_taken_for_the_fleets() {
    // 720/s, then one zone of r1 offers 5 times its load: 1,200/s in all, a ratio of 1/6. Taken
    // for the whole fleet's rise (its mean over r1's zones is 2.3), the peer's estimated load
    // would give 0.3; the median zone saw none.
    let mut fleet = far_apart_fleet(60.0);
    for client in fleet.clients.iter_mut().filter(|c| c.zone == "r1z1") {
        client.set_rate("global", 300.0);
    }
    for client in &mut fleet.clients {
        client.clear_first_drop();
    }
    fleet.wait_for(5 * INTERVAL, "every client drops", |fleet| {
        fleet
            .clients
            .iter()
            .all(|c| c.first_drop("global").is_some())
    });
    for client in &fleet.clients {
        let (ratio, _) = client.first_drop("global").unwrap();
        assert!(close(ratio, 1.0 / 6.0, 0.03), "{}: {ratio}", client.id);
    }
}

#[test]
fn a_lost_peer_regions_load_failed_over_is_counted_once_two_intervals_after_its_last_sums() {
    // 100 ms intervals and a TTL of 600 ms. r1 offers 1,200/s and r2 600/s: both drop 4/9.
    let interval = Interval::new(Duration::from_millis(100));
    let yaml = config(
        100,
        600,
        &["{ name: global, limit: 1000/s, scope: global }"],
    );
    let mut fleet = Fleet::start(&yaml, 2, 2, 2);
    for client in &mut fleet.clients {
        let rate = if client.region == "r1" { 300.0 } else { 150.0 };
        client.set_rate("global", rate);
    }
    fleet.wait_for(interval.duration() * 3, "both regions drop 4/9", |fleet| {
        fleet.all_drop("global", 4.0 / 9.0)
    });
    // r2 is lost and its callers fail over to r1: 1,800/s on r1 alone.
    fleet.kill_controller(1);
    for client in &mut fleet.clients {
        let rate = if client.region == "r1" { 450.0 } else { 0.0 };
        client.set_rate("global", rate);
    }
    let lost = interval.sequence_at(fleet.now_ms());
    // r2's last sums are of the interval before `lost` at the latest. From `lost + 2` on they
    // no longer count as its own, and r1's load rose by all of them: r2's load has come over
    // and is not held as well (1,800/s counted, not 2,400/s), although r2 is still live by the
    // TTL, six intervals.
    fleet.run_until(interval.end_of(lost + 2) + 5);
    let view = fleet.controller(0).view()[&BucketKey::new(SERVICE, "global")];
    assert!(close(view.observed_rps, 1800.0, 60.0), "{view:?}");
    assert!(
        fleet.controller(0).live_peers(fleet.now_ms()) == ["r2"],
        "still live by the TTL"
    );
}

#[test]
fn one_hosts_burst_under_the_limit_is_let_go_once_its_surge_report_is_answered() {
    // 360/s against 1,000/s; then one client of r1 steps from 30/s to 500/s: 830/s in all,
    // still under the limit. Its guard cannot tell that from a fleet-wide surge and holds it to
    // its part (30/s plus a twelfth of the headroom, 83/s) until the control plane has counted
    // the burst: its surge report, answered from the zones' rates now, lets it go within a few
    // milliseconds, where it used to wait for the interval's report (up to 200 ms here, and a
    // whole second at 1 s reports).
    let mut fleet = far_apart_fleet(30.0);
    let interval = Interval::new(INTERVAL);
    let surge = interval.sequence_at(fleet.now_ms());
    let burst = fleet.clients.iter().position(|c| c.zone == "r1z1").unwrap();
    fleet.run_until(interval.end_of(surge - 1) + 20);
    fleet.clients[burst].set_rate("global", 500.0);
    let from = fleet.now_ms();
    let mut held_ms = 0;
    while fleet.now_ms() < interval.end_of(surge) + 100 {
        fleet.step();
        if fleet.clients[burst].ratio("global") > 0.0 {
            held_ms += 1;
        }
    }
    assert!(fleet.controller(0).provisionals() >= 1, "no surge answered");
    // Held from its guard's engaging (one or two 50 ms ticks after the step) until the answer
    // came back: a few milliseconds, not the rest of the interval.
    assert!(
        held_ms <= 30,
        "the bursting client dropped for {held_ms} ms of the {} since its burst",
        fleet.now_ms() - from
    );
    assert!(fleet.clients.iter().all(|c| c.ratio("global") == 0.0));
}
