//! The 3-tier feedback loop end to end over real gRPC on loopback: simulated clients linked by
//! `ClientLink`, zone aggregators and regional controllers exchanging global sums, and what the
//! controllers show on their admin listeners.
//!
//! The loop's numbers and its timing are pinned on simulated time by `spillway-loop`'s
//! `tests/feedback.rs`; here each test waits, with a deadline of tens of intervals, for the
//! same outcome to come true over real streams and servers, so a busy machine makes a test
//! slower, never red.

use crate::support::{Fleet, close, get, rewrite, rules, wait_for, wait_get, wait_json};

const L: f64 = 1000.0;

/// 1.5 L spread unevenly over 8 clients: region r1 offers 900/s, region r2 600/s.
const UNEVEN: [f64; 8] = [300.0, 200.0, 250.0, 150.0, 200.0, 100.0, 150.0, 150.0];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_bucket_at_one_and_a_half_times_its_limit_drops_a_third_everywhere() {
    let fleet = Fleet::start(&rules(1000), 2, 2, 2).await;
    fleet.wait_linked().await;
    for (client, rate) in fleet.clients.iter().zip(UNEVEN) {
        client.set_rate("global", rate);
    }
    let took = wait_for(
        fleet.patience(),
        "every client drops 1/3 and L is admitted",
        || {
            fleet.clients.iter().all(|c| c.drops("global", 1.0 / 3.0))
                && close(fleet.admitted("global"), L, 0.05 * L)
        },
    )
    .await;
    eprintln!("converged {took:?} after the load started");
    // Both controllers computed the same load from each other's sums.
    wait_for(
        fleet.patience(),
        "both controllers see 1.5 L and drop 1/3",
        || {
            (0..2).all(|r| {
                let views = fleet.controller_of(r).buckets();
                views.values().next().is_some_and(|view| {
                    close(view.observed_rps, 1.5 * L, 0.05 * L)
                        && close(view.drop_ratio, 1.0 / 3.0, 0.03)
                })
            })
        },
    )
    .await;
    // What the dashboard shows: /v1/buckets, and the page on / that polls it.
    let admin = fleet.controller_of(0).admin_addr().unwrap();
    let doc = wait_json(admin, "/v1/buckets", fleet.patience(), |doc| {
        let bucket = &doc["buckets"][0];
        bucket["drop_ratio"]
            .as_f64()
            .is_some_and(|r| close(r, 1.0 / 3.0, 0.03))
            && bucket["offered_rps"]
                .as_f64()
                .is_some_and(|o| close(o, 1.5 * L, 0.05 * L))
    })
    .await;
    let bucket = &doc["buckets"][0];
    assert_eq!(bucket["service"], "api");
    assert_eq!(bucket["bucket"], "global");
    assert_eq!(bucket["scope"], "global");
    assert_eq!(bucket["limit_rps"], 1000.0);
    assert_eq!(doc["interval_ms"], 200);
    let (status, page) = get(admin, "/").await;
    assert_eq!(status, 200);
    assert!(page.starts_with("<!doctype html>") && page.contains("<script src=\"/dashboard.js\">"));
    let (status, script) = get(admin, "/dashboard.js").await;
    assert_eq!(status, 200);
    assert!(script.contains("fetch('/v1/buckets')"));
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_change_reaches_every_client_and_the_controllers_show_it_live_everywhere() {
    let fleet = Fleet::start(&rules(1000), 2, 2, 2).await;
    fleet.wait_linked().await;
    for client in &fleet.clients {
        client.set_rate("global", 187.5);
    }
    wait_for(
        fleet.patience(),
        "every client runs the first rules",
        || {
            let first = fleet.clients[0].rules_version();
            first > 0 && fleet.clients.iter().all(|c| c.rules_version() == first)
        },
    )
    .await;
    let first = fleet.clients[0].rules_version();

    let after = rules(750);
    rewrite(&fleet.rules, &after);
    let took = wait_for(
        fleet.patience(),
        "every client runs the new rules and halves its load",
        || {
            fleet.clients.iter().all(|c| c.drops("global", 0.5))
                && fleet
                    .clients
                    .iter()
                    .all(|c| c.rules_version() > first && c.runs_rules_of(&after))
        },
    )
    .await;
    eprintln!("rules live everywhere {took:?} after the edit");
    let second = fleet.clients[0].rules_version();

    for r in 0..2 {
        let admin = fleet.controller_of(r).admin_addr().unwrap();
        let hosts = wait_json(admin, "/v1/hosts", fleet.patience(), |doc| {
            doc["converged"] == true && doc["rules_version"] == second
        })
        .await;
        let map = hosts["hosts"].as_object().unwrap();
        assert_eq!(map.len(), 4, "{hosts}");
        for (host, entry) in map {
            assert!(
                host.starts_with(&format!("r{}", r + 1)),
                "{host} in region {}",
                r + 1
            );
            assert_eq!(entry["rules_version"], second, "{host}");
        }
        let ratio = "spillway_drop_ratio{service=\"api\",bucket=\"global\"}";
        let metrics = wait_get(admin, "/metrics", fleet.patience(), |text| {
            metric(text, ratio).is_some_and(|r| close(r, 0.5, 0.03))
        })
        .await;
        assert!(
            metrics.contains(&format!("spillway_rules_version {second}")),
            "{metrics}"
        );
        assert!(
            metrics.contains("spillway_bucket_limit_rps{service=\"api\",bucket=\"global\"} 750"),
            "{metrics}"
        );
        assert_eq!(get(admin, "/healthz").await.0, 200);
        assert_eq!(get(admin, "/readyz").await.0, 200);
    }
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_controller_clients_fail_open_and_a_restart_restores_enforcement() {
    let mut fleet = Fleet::start(&rules(1000), 1, 2, 2).await;
    fleet.wait_linked().await;
    for client in &fleet.clients {
        client.set_rate("global", 375.0);
    }
    wait_for(fleet.patience(), "enforcement before the kill", || {
        fleet.clients.iter().all(|c| c.drops("global", 1.0 / 3.0))
    })
    .await;

    fleet.kill_controller(0).await;
    // The instructions' TTL is 1 s; then every client admits everything.
    let took = wait_for(fleet.patience(), "every client fails open", || {
        fleet.clients.iter().all(|c| c.ratio("global") == 0.0)
    })
    .await;
    eprintln!("failed open {took:?} after the controller stopped");
    assert!(
        fleet.links.iter().all(|l| l.connected()),
        "the aggregators are still up"
    );

    fleet.restart_controller(0).await;
    let took = wait_for(fleet.patience(), "enforcement after the restart", || {
        fleet.clients.iter().all(|c| c.drops("global", 1.0 / 3.0))
    })
    .await;
    eprintln!("enforcing again {took:?} after the restart");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_a_client_leaves_the_ratio_falls_to_the_new_load_at_once() {
    // 1.5 L over 8 clients drops 1/3; the busiest (300/s) leaves, and 1.2 L drops 1/6. The
    // controller takes that fall at once (it is many deviations of the count's noise,
    // `Smoother::update_counted`), so between 1/3 and 1/6 a client sees at most the ratio of
    // the interval the client left in (part of it at each load, about 0.3), never the steps
    // of an eased release (0.283, 0.248, 0.223, ...), during which the fleet admitted less
    // than its limit.
    let fleet = Fleet::start(&rules(1000), 2, 2, 2).await;
    fleet.wait_linked().await;
    for (client, rate) in fleet.clients.iter().zip(UNEVEN) {
        client.set_rate("global", rate);
    }
    wait_for(fleet.patience(), "every client drops 1/3", || {
        fleet.clients.iter().all(|c| c.drops("global", 1.0 / 3.0))
    })
    .await;
    fleet.clients[0].set_rate("global", 0.0);
    let mut seen = Vec::new();
    let took = wait_for(fleet.patience(), "every other client drops 1/6", || {
        let ratio = fleet.clients[1].ratio("global");
        if seen.last() != Some(&ratio) {
            seen.push(ratio);
        }
        fleet.clients[1..]
            .iter()
            .all(|c| close(c.ratio("global"), 1.0 / 6.0, 0.01))
    })
    .await;
    eprintln!("ratios seen after the client left: {seen:?}, 1/6 after {took:?}");
    // The interval the client left in counts part of it at each load, so its ratio may be
    // anywhere between 1/3 and 1/6 (0.2 when it left a sixth of the way in): one ratio in
    // between is that interval, an eased release is several.
    assert!(
        seen.iter().filter(|&&r| (0.2..0.29).contains(&r)).count() <= 1,
        "an eased release: {seen:?}"
    );
    assert!(close(fleet.admitted("global"), L, 0.02 * L));
    fleet.shutdown().await;
}

/// The value of one sample in a Prometheus text exposition.
fn metric(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(sample))
        .and_then(|value| value.trim().parse().ok())
}
