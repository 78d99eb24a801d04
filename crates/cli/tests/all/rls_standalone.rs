//! `spillway rls` as a process: Envoy's `ShouldRateLimit` without the proxy, over a
//! real socket with Envoy's generated client, decided from `examples/envoy-ratelimit.yaml`,
//! reloaded when the file changes, counted in its `/metrics`; linked to a real controller and
//! aggregator, a host of its zone whose drop-ratio descriptor bucket follows the fleet; and its
//! listener's loopback rule.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::fleet::{admin_get, aggregator, controller, metric, wait_for};
use crate::support::{SPILLWAY, free_port, get};
use spillway_rls::pb::{self, Code, RateLimitServiceClient, request};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy-ratelimit.yaml")
}

/// A running `spillway rls`, killed when dropped.
struct Service {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
}

impl Service {
    fn start(config: &Path, extra: &[&str]) -> Service {
        let listen: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let child = Command::new(SPILLWAY)
            .arg("rls")
            .arg("-c")
            .arg(config)
            .args(["--listen", &listen.to_string()])
            .args(["--admin", &admin.to_string()])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .expect("spillway rls starts");
        let mut service = Service {
            child,
            listen,
            admin,
        };
        wait_for(Duration::from_secs(15), "spillway rls is ready", || {
            assert!(
                service.child.try_wait().unwrap().is_none(),
                "spillway rls exited early"
            );
            get(admin, "/readyz").is_ok_and(|(status, _)| status == 200)
        });
        service
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        crate::support::terminate(&mut self.child, Duration::from_secs(15))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends each request in turn on one connection and returns the answers' overall codes.
fn codes(rls: SocketAddr, requests: Vec<pb::RateLimitRequest>) -> Vec<Code> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{rls}"))
            .await
            .unwrap();
        let mut codes = Vec::new();
        for request in requests {
            let answer = client
                .should_rate_limit(request)
                .await
                .unwrap()
                .into_inner();
            codes.push(Code::try_from(answer.overall_code).unwrap());
        }
        codes
    })
}

#[test]
fn the_service_without_the_proxy_decides_reloads_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rls.yaml");
    std::fs::copy(example(), &config).unwrap();
    let service = Service::start(&config, &["--response-headers"]);
    // envoyproxy/ratelimit's README example 2: five marketing messages a day to a number, the
    // sixth over the limit.
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061234567")];
    let requests = (0..6).map(|_| request("messaging", &[marketing])).collect();
    use Code::{Ok, OverLimit};
    assert_eq!(
        codes(service.listen, requests),
        [Ok, Ok, Ok, Ok, Ok, OverLimit]
    );
    let (status, metrics) = get(service.admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    for line in [
        "spillway_requests_total{service=\"envoy\",bucket=\"marketing-per-number\",decision=\"allowed\",criticality=\"critical\"} 5",
        "spillway_requests_total{service=\"envoy\",bucket=\"marketing-per-number\",decision=\"dropped\",criticality=\"critical\"} 1",
        "spillway_control_plane_connected 0",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    // The file is the rules: a new limit is in force after a reload.
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("limit: 5/d", "limit: 7/d");
    std::fs::write(&config, text).unwrap();
    wait_for(Duration::from_secs(15), "the rules reload", || {
        let (_, metrics) = get(service.admin, "/metrics").unwrap();
        metrics.contains("spillway_rules_version 2")
    });
    // A new number under the new limit: seven, then over.
    let other: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2069999999")];
    let requests = (0..8).map(|_| request("messaging", &[other])).collect();
    assert_eq!(
        codes(service.listen, requests),
        [Ok, Ok, Ok, Ok, Ok, Ok, Ok, OverLimit]
    );
    let status = service.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn linked_to_an_aggregator_it_is_a_host_of_its_zone() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    // One drop-ratio descriptor bucket of 20/s, reports every 250 ms.
    std::fs::write(
        &rules,
        "version: 1\ncontrol:\n  report_interval: 250ms\n  instruction_ttl: 2s\nservices:\n  edge:\n    buckets:\n      - name: checkout\n        match: { descriptor: { domain: edge, entries: [ {key: route, value: checkout} ] } }\n        limit: 20/s\n",
    )
    .unwrap();
    let (controller_port, controller_admin, aggregator_port) =
        (free_port(), free_port(), free_port());
    let _controller = controller(
        controller_port,
        &rules,
        &["--admin", &format!("127.0.0.1:{controller_admin}")],
    );
    let _aggregator = aggregator(aggregator_port, "z1", controller_port, &[]);
    // Its own file has no buckets: the control plane's rules come down the link.
    let own = dir.path().join("own.yaml");
    std::fs::write(&own, "version: 1\nservices: {}\n").unwrap();
    let service = Service::start(
        &own,
        &[
            "--aggregator",
            &format!("http://127.0.0.1:{aggregator_port}"),
            "--region",
            "r1",
            "--zone",
            "z1",
            "--host-id",
            "rls-1",
        ],
    );
    wait_for(
        Duration::from_secs(30),
        "the controller lists rls-1",
        || admin_get(controller_admin, "/v1/hosts").contains("rls-1"),
    );
    wait_for(
        Duration::from_secs(30),
        "the rules came down the link",
        || {
            let (_, metrics) = get(service.admin, "/metrics").unwrap();
            metrics.contains("bucket=\"checkout\"")
                && metric(&metrics, "spillway_control_plane_connected", "")
                    .is_some_and(|v| v == 1.0)
        },
    );
    // Offered 60/s against 20/s for a few seconds: the controller's ratio reaches about 2/3
    // and the service answers OVER_LIMIT for about that share.
    let checkout: &[(&str, &str)] = &[("route", "checkout")];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (over, total) = runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{}", service.listen))
            .await
            .unwrap();
        let mut every = tokio::time::interval(Duration::from_millis(1000 / 60));
        let (mut over, mut total) = (0u32, 0u32);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(8) {
            every.tick().await;
            let answer = client
                .should_rate_limit(request("edge", &[checkout]))
                .await
                .unwrap()
                .into_inner();
            // Counted once the loop has had 4 s to settle.
            if started.elapsed() > Duration::from_secs(4) {
                total += 1;
                over += u32::from(answer.overall_code == Code::OverLimit as i32);
            }
        }
        (over, total)
    });
    let share = f64::from(over) / f64::from(total);
    assert!(
        (0.5..=0.8).contains(&share),
        "{over} of {total} over the limit, where about 2/3 should be"
    );
    let status = service.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn the_listener_is_loopback_only_without_tls() {
    let output = Command::new(SPILLWAY)
        .arg("rls")
        .arg("-c")
        .arg(example())
        .args(["--listen", &format!("0.0.0.0:{}", free_port())])
        .output()
        .expect("spillway rls runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--listen 0.0.0.0:") && stderr.contains("--insecure-plaintext"),
        "{stderr}"
    );
    let output = Command::new(SPILLWAY)
        .arg("rls")
        .arg("-c")
        .arg(example())
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--allow-client-san", "spiffe://cluster.local/**"])
        .output()
        .expect("spillway rls runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--tls-cert"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A configuration that does not load: exit 2 with the file named.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "version: 1\nservices: [\n").unwrap();
    let output = Command::new(SPILLWAY)
        .arg("rls")
        .arg("-c")
        .arg(&bad)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .output()
        .expect("spillway rls runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("bad.yaml"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
