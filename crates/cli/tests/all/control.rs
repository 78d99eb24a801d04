//! `spillway proxy --aggregator` end to end through the real binary: a controller, a zone
//! aggregator and two linked proxies as processes on loopback, a real upstream, and paced load
//! whose 429s are counted at the proxies.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::support::fleet::{
    Load, Proc, admin_get, aggregator, controller, keep_alive_upstream, linked_proxy, metric,
    wait_for,
};
use crate::support::free_port;
const TTL: Duration = Duration::from_secs(1);

/// One global drop-ratio bucket of `limit`/s, reports every 250 ms, instructions valid 1 s.
fn rules(limit: u32) -> String {
    format!(
        "version: 1\ncontrol:\n  report_interval: 250ms\n  instruction_ttl: 1s\nservices:\n  api:\n    buckets:\n      - {{ name: all, limit: {limit}/s, scope: global }}\n"
    )
}

/// A controller watching a rules file, one aggregator, two linked proxies and an upstream.
struct Fleet {
    dir: tempfile::TempDir,
    controller_port: u16,
    controller: Proc,
    _aggregator: Proc,
    proxies: Vec<(Proc, u16, u16)>,
}

impl Fleet {
    fn start(limit: u32) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules(limit)).unwrap();
        let controller_port = free_port();
        let controller = controller(controller_port, &dir.path().join("rules.yaml"), &[]);
        let aggregator_port = free_port();
        let aggregator = aggregator(aggregator_port, "z1", controller_port, &[]);
        let upstream = keep_alive_upstream();
        let mut fleet = Fleet {
            dir,
            controller_port,
            controller,
            _aggregator: aggregator,
            proxies: Vec::new(),
        };
        for host in ["p1", "p2"] {
            let proxy = fleet.proxy(host, aggregator_port, upstream);
            fleet.proxies.push(proxy);
        }
        fleet
    }

    /// A linked proxy: (process, listen port, admin port). Its file has a limit nobody uses, so
    /// only rules from the control plane can make it drop.
    fn proxy(&self, host: &str, aggregator: u16, upstream: u16) -> (Proc, u16, u16) {
        let file = self.dir.path().join(format!("{host}.yaml"));
        std::fs::write(&file, rules(1_000_000)).unwrap();
        linked_proxy(self.dir.path(), &file, upstream, aggregator, "z1", host)
    }

    fn metrics(&self, i: usize) -> String {
        admin_get(self.proxies[i].2, "/metrics")
    }

    /// Both proxies hear from the control plane and run `limit`.
    fn wait_live(&self, limit: u32) {
        // Bounded generously, as the criticality test's start-up (processes starting on a machine
        // running other tests).
        wait_for(
            Duration::from_secs(30),
            "both proxies linked and running the controller's rules",
            || {
                (0..2).all(|i| {
                    let m = self.metrics(i);
                    metric(&m, "spillway_control_plane_connected", "") == Some(1.0)
                        && metric(&m, "spillway_bucket_limit_rps", "bucket=\"all\"")
                            == Some(f64::from(limit))
                })
            },
        );
    }
}

#[test]
fn two_linked_proxies_at_one_and_a_half_times_a_global_limit_each_drop_a_third() {
    let fleet = Fleet::start(100);
    fleet.wait_live(100);
    // 75/s on each proxy: 150/s against 100/s.
    let loads: Vec<Load> = fleet
        .proxies
        .iter()
        .map(|p| Load::start(p.1, 75.0))
        .collect();
    // Let the loop see the load (a few 250 ms intervals), then measure over 4 s.
    std::thread::sleep(Duration::from_secs(2));
    let before: Vec<(u64, u64)> = loads.iter().map(Load::counts).collect();
    std::thread::sleep(Duration::from_secs(4));
    for (i, (load, before)) in loads.iter().zip(before).enumerate() {
        let (sent, limited) = load.counts();
        let (sent, limited) = (sent - before.0, limited - before.1);
        assert!(sent >= 240, "proxy {i} sent only {sent} requests in 4 s");
        let dropped = limited as f64 / sent as f64;
        assert!(
            (dropped - 1.0 / 3.0).abs() < 0.08,
            "proxy {i} dropped {limited} of {sent} ({dropped:.3}), not about 1/3"
        );
        let ratio = metric(&fleet.metrics(i), "spillway_drop_ratio", "bucket=\"all\"").unwrap();
        assert!((ratio - 1.0 / 3.0).abs() < 0.05, "proxy {i} ratio {ratio}");
    }
}

#[test]
fn killing_the_controller_makes_the_proxies_fail_open_within_the_ttl() {
    let mut fleet = Fleet::start(100);
    fleet.wait_live(100);
    let loads: Vec<Load> = fleet
        .proxies
        .iter()
        .map(|p| Load::start(p.1, 75.0))
        .collect();
    wait_for(Duration::from_secs(5), "both proxies dropping", || {
        loads.iter().all(|l| l.counts().1 > 10)
    });
    fleet.controller.kill();
    let killed: Vec<Duration> = loads.iter().map(|l| l.started.elapsed()).collect();
    // Within the TTL plus a report interval, no proxy drops any more and both say so.
    wait_for(
        TTL + Duration::from_secs(2),
        "control_plane_connected 0 on both proxies",
        || {
            (0..2).all(|i| {
                metric(&fleet.metrics(i), "spillway_control_plane_connected", "") == Some(0.0)
            })
        },
    );
    let quiet_from: Vec<u64> = loads.iter().map(|l| l.counts().1).collect();
    std::thread::sleep(Duration::from_secs(2));
    for (i, (load, before)) in loads.iter().zip(quiet_from).enumerate() {
        let (_, limited) = load.counts();
        assert_eq!(limited, before, "proxy {i} still drops after its TTL");
        let last = Duration::from_millis(load.last_limited_ms.load(Ordering::Relaxed));
        assert!(
            last <= killed[i] + TTL + Duration::from_millis(500),
            "proxy {i} dropped {:?} after the controller died (TTL {TTL:?})",
            last.saturating_sub(killed[i])
        );
        let m = fleet.metrics(i);
        assert!(
            metric(&m, "spillway_instructions_expired_total", "").unwrap_or(0.0) >= 1.0,
            "proxy {i} counted no expired instruction:\n{m}"
        );
        assert_eq!(
            metric(&m, "spillway_drop_ratio", "bucket=\"all\""),
            Some(0.0)
        );
    }
    // A restarted controller brings enforcement back.
    fleet.controller = controller(
        fleet.controller_port,
        &fleet.dir.path().join("rules.yaml"),
        &[],
    );
    let before: Vec<u64> = loads.iter().map(|l| l.counts().1).collect();
    wait_for(Duration::from_secs(10), "enforcement back on both", || {
        loads
            .iter()
            .zip(&before)
            .all(|(l, b)| l.counts().1 > b + 10)
    });
}

#[test]
fn a_rule_change_reaches_both_proxies_and_a_restarted_proxy_starts_with_it() {
    let mut fleet = Fleet::start(100);
    fleet.wait_live(100);
    let path = fleet.dir.path().join("rules.yaml");
    std::fs::write(&path, rules(250)).unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(1))
        .unwrap();
    let took = wait_for(
        Duration::from_secs(10),
        "both proxies run the new limit",
        || {
            (0..2).all(|i| {
                metric(
                    &fleet.metrics(i),
                    "spillway_bucket_limit_rps",
                    "bucket=\"all\"",
                ) == Some(250.0)
            })
        },
    );
    eprintln!("the change reached both proxies in {took:?}");
    let version = metric(&fleet.metrics(0), "spillway_rules_version", "").unwrap();
    assert!(version > 1.0, "the control plane's version, got {version}");

    // Without any control plane, a restarted proxy enforces the last good rules at once.
    fleet.controller.kill();
    let (mut proc, listen, admin) = fleet.proxies.remove(0);
    proc.kill();
    let dead = free_port();
    let file = fleet.dir.path().join("p1.yaml");
    let state = fleet.dir.path().join("p1-state");
    let _restarted = Proc::spawn(&[
        "proxy",
        "-c",
        &file.display().to_string(),
        "--listen",
        &format!("127.0.0.1:{listen}"),
        "--upstream",
        "http://127.0.0.1:9",
        "--aggregator",
        &format!("http://127.0.0.1:{dead}"),
        "--region",
        "r1",
        "--zone",
        "z1",
        "--state-dir",
        &state.display().to_string(),
        "--admin",
        &format!("127.0.0.1:{admin}"),
    ]);
    wait_for(
        Duration::from_secs(10),
        "the restarted proxy runs the saved rules",
        || {
            let m = admin_get(admin, "/metrics");
            metric(&m, "spillway_bucket_limit_rps", "bucket=\"all\"") == Some(250.0)
                && metric(&m, "spillway_rules_version", "") == Some(version)
                && metric(&m, "spillway_control_plane_connected", "") == Some(0.0)
        },
    );
}

/// Reports p1 has sent (one per interval) and its drop ratio for the bucket.
fn reports_and_ratio(fleet: &Fleet) -> (f64, f64) {
    let m = fleet.metrics(0);
    (
        metric(&m, "spillway_control_plane_reports", "").unwrap_or(0.0),
        metric(&m, "spillway_drop_ratio", "bucket=\"all\"").unwrap_or(-1.0),
    )
}

#[test]
fn when_one_proxys_load_stops_the_other_is_released_within_an_interval_and_holds_steady_before() {
    // Issue 20's release: p1 offers 110/s and p2 40/s against 100/s, a ratio of 1/3. When p2's
    // load stops, p1 alone is over by 10%, a ratio of 1/11: easing by 30% of the gap per interval
    // took 9 intervals to get there, admitting 82-98/s of the 100/s meanwhile. p1's ratio (the
    // instruction's, or its surge guard's when that holds the rate granted) must reach it
    // within three of p1's reports after the stop: the interval it stopped in, the whole one
    // after, and one in flight. Measured: two reports, 0.074-0.107 (1/11 within a 250 ms
    // interval's count of about 27), with the controller's fast fall (`Smoother::update_counted`)
    // and without it alike: the values are p1's surge guard's, `1 - part / count`, holding the
    // rate it was granted.
    let fleet = Fleet::start(100);
    fleet.wait_live(100);
    let p1 = Load::start(fleet.proxies[0].1, 110.0);
    let p2 = Load::start(fleet.proxies[1].1, 40.0);
    wait_for(Duration::from_secs(10), "p1 drops about 1/3", || {
        (reports_and_ratio(&fleet).1 - 1.0 / 3.0).abs() < 0.06
    });
    // No oscillation at the steady overload: 12 intervals of samples stay near 1/3.
    let start = reports_and_ratio(&fleet).0;
    let mut ratios = Vec::new();
    while reports_and_ratio(&fleet).0 < start + 12.0 {
        ratios.push(reports_and_ratio(&fleet).1);
        std::thread::sleep(Duration::from_millis(25));
    }
    let (low, high) = ratios
        .iter()
        .fold((1.0_f64, 0.0_f64), |(l, h), &r| (l.min(r), h.max(r)));
    assert!(
        low > 0.22 && high < 0.45,
        "p1's ratio ranged {low:.3}-{high:.3} at a steady 1.5x"
    );
    drop(p2);
    let stopped = reports_and_ratio(&fleet).0;
    wait_for(
        Duration::from_secs(10),
        "p1's ratio falls to about 1/11",
        || reports_and_ratio(&fleet).1 < 0.16,
    );
    let (released, ratio) = reports_and_ratio(&fleet);
    eprintln!(
        "released to {ratio:.3} after {} reports; steady {low:.3}-{high:.3}",
        released - stopped
    );
    assert!(
        released - stopped <= 3.0,
        "released to {ratio:.3} after {} reports",
        released - stopped
    );
    // And p1 is still held to the limit, not let go.
    assert!(ratio > 0.02, "p1 alone is 10% over the limit: {ratio}");
    drop(p1);
}
