//! Criticality tiers end to end through the real binary: a controller, a
//! zone aggregator and four linked proxies on loopback share one global drop-ratio bucket at
//! 1.5x its limit. Two proxies carry only critical traffic; the other two mostly sheddable
//! traffic, named by the client in `rpc-criticality`. The sheddable requests absorb the drops,
//! on every proxy, and critical traffic loses under 1%.

use std::time::Duration;

use crate::support::fleet::{
    Load, Proc, admin_get, aggregator, controller, keep_alive_upstream, linked_proxy, metric,
    wait_for,
};
use crate::support::free_port;

/// One global drop-ratio bucket of `limit`/s, reports every 250 ms.
fn rules(limit: u32) -> String {
    format!(
        "version: 1\ncontrol:\n  report_interval: 250ms\n  instruction_ttl: 2s\nservices:\n  api:\n    buckets:\n      - {{ name: all, limit: {limit}/s, scope: global }}\n"
    )
}

/// The proxy's count of `decision` in `tier` for api/all.
fn requests(metrics: &str, decision: &str, tier: &str) -> f64 {
    metric(
        metrics,
        "spillway_requests_total",
        &format!("bucket=\"all\",decision=\"{decision}\",criticality=\"{tier}\""),
    )
    .unwrap_or(0.0)
}

#[test]
fn at_one_and_a_half_times_the_limit_sheddable_traffic_absorbs_the_drops_across_four_proxies() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yaml"), rules(100)).unwrap();
    let controller_port = free_port();
    let _controller = controller(controller_port, &dir.path().join("rules.yaml"), &[]);
    let aggregator_port = free_port();
    let _aggregator = aggregator(aggregator_port, "z1", controller_port, &[]);
    let upstream = keep_alive_upstream();
    let proxies: Vec<(Proc, u16, u16)> = (1..=4)
        .map(|n| {
            let host = format!("p{n}");
            // A limit nobody reaches: only the controller's rules make a proxy drop.
            let file = dir.path().join(format!("{host}.yaml"));
            std::fs::write(&file, rules(1_000_000)).unwrap();
            linked_proxy(dir.path(), &file, upstream, aggregator_port, "z1", &host)
        })
        .collect();
    // Start-up, bounded generously: four proxies, an aggregator and a controller starting
    // together on a machine running other tests (20 s was missed once in CI, the retry linked in
    // 8.5 s).
    wait_for(
        Duration::from_secs(30),
        "four proxies linked and running the controller's rules",
        || {
            proxies.iter().all(|p| {
                let m = admin_get(p.2, "/metrics");
                metric(&m, "spillway_control_plane_connected", "") == Some(1.0)
                    && metric(&m, "spillway_bucket_limit_rps", "bucket=\"all\"") == Some(100.0)
            })
        },
    );

    // 150/s against 100/s: p1 and p2 send 37.5/s of critical traffic each; p3 and p4 30/s of
    // sheddable and 7.5/s of critical each. Critical is 90/s and sheddable 60/s, so the 50/s to
    // drop are 5/6 of the sheddable traffic and none of the critical.
    let sheddable = "rpc-criticality: sheddable\r\n";
    let loads = [
        Load::start(proxies[0].1, 37.5),
        Load::start(proxies[1].1, 37.5),
        Load::with_headers(proxies[2].1, 30.0, "/orders", sheddable),
        Load::start(proxies[2].1, 7.5),
        Load::with_headers(proxies[3].1, 30.0, "/orders", sheddable),
        Load::start(proxies[3].1, 7.5),
    ];
    // Let the loop see the load, then measure over 5 s from the proxies' own counters.
    std::thread::sleep(Duration::from_secs(3));
    let read = || -> Vec<String> { proxies.iter().map(|p| admin_get(p.2, "/metrics")).collect() };
    let before = read();
    std::thread::sleep(Duration::from_secs(5));
    let after = read();
    drop(loads);

    let delta = |decision: &str, tier: &str| -> f64 {
        after
            .iter()
            .zip(&before)
            .map(|(a, b)| requests(a, decision, tier) - requests(b, decision, tier))
            .sum()
    };
    let offered = |tier: &str| delta("allowed", tier) + delta("dropped", tier);
    let (critical, shed) = (offered("critical"), offered("sheddable"));
    assert!(
        critical >= 300.0 && shed >= 200.0,
        "too little load: {critical} critical, {shed} sheddable in 5 s"
    );
    let critical_lost = delta("dropped", "critical") / critical;
    let shed_lost = delta("dropped", "sheddable") / shed;
    let all_lost =
        (delta("dropped", "critical") + delta("dropped", "sheddable")) / (critical + shed);
    eprintln!(
        "critical {critical} dropped {critical_lost:.4}; sheddable {shed} dropped {shed_lost:.3}; all {all_lost:.3}"
    );
    assert!(
        critical_lost < 0.01,
        "critical lost {critical_lost:.4} of {critical}"
    );
    // The sheddable tier absorbs the drop: 5/6 of it, and the fleet still meets its limit.
    assert!(
        (0.65..=0.95).contains(&shed_lost),
        "sheddable lost {shed_lost:.3}"
    );
    assert!(
        (all_lost - 1.0 / 3.0).abs() < 0.08,
        "the fleet dropped {all_lost:.3}, not about 1/3"
    );
    // A tier nobody sent is counted at zero, and the label has all four values.
    for tier in ["critical_plus", "sheddable_plus"] {
        assert!(
            after[0].contains(&format!(
                "spillway_requests_total{{service=\"api\",bucket=\"all\",decision=\"allowed\",criticality=\"{tier}\"}} 0"
            )),
            "{tier} missing from {}",
            after[0]
        );
    }
}
