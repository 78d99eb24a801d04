//! `spillway proxy --rls-listen` as a process: Envoy's `ShouldRateLimit` over a real socket with
//! Envoy's generated client (tonic), decided by the sidecar's own engine from
//! `examples/envoy-ratelimit.yaml` and counted in its `/metrics`; the listener's loopback rule
//! and the flags that need it or TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{Proxy, SPILLWAY, free_port, get, upstream};
use spillway_rls::pb::{self, Code, RateLimitServiceClient, Unit, request};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy-ratelimit.yaml")
}

/// Sends each request in turn on one connection and returns the answers.
fn calls(rls: SocketAddr, requests: Vec<pb::RateLimitRequest>) -> Vec<pb::RateLimitResponse> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{rls}"))
            .await
            .unwrap();
        let mut answers = Vec::new();
        for request in requests {
            answers.push(
                client
                    .should_rate_limit(request)
                    .await
                    .unwrap()
                    .into_inner(),
            );
        }
        answers
    })
}

#[test]
fn the_sidecar_answers_envoy_from_its_own_engine_and_counts_in_its_metrics() {
    let rls: SocketAddr = ([127, 0, 0, 1], free_port()).into();
    let proxy = Proxy::start_with(
        &example(),
        upstream(),
        &["--rls-listen", &rls.to_string(), "--rls-response-headers"],
    );
    // README example 2: five marketing messages a day to a number, the sixth over the limit,
    // the number's own count (100 a day) going on beside it.
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061234567")];
    let number: &[(&str, &str)] = &[("to_number", "2061234567")];
    let mut requests: Vec<_> = (0..6)
        .map(|_| request("messaging", &[marketing, number]))
        .collect();
    requests.push(request("no-such-domain", &[&[("a", "b")]]));
    let answers = calls(rls, requests);
    let codes: Vec<Code> = answers
        .iter()
        .map(|a| Code::try_from(a.overall_code).unwrap())
        .collect();
    use Code::{Ok, OverLimit};
    assert_eq!(codes, [Ok, Ok, Ok, Ok, Ok, OverLimit, Ok]);
    let sixth = &answers[5];
    let limit = sixth.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("marketing-per-number", 5, Unit::Day as i32)
    );
    assert_eq!(
        (sixth.statuses[0].code, sixth.statuses[1].code),
        (OverLimit as i32, Ok as i32)
    );
    assert_eq!(sixth.statuses[1].limit_remaining, 94);
    let headers: Vec<(&str, &str)> = sixth
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .take(2)
        .collect();
    assert_eq!(
        headers,
        [("RateLimit-Limit", "5"), ("RateLimit-Remaining", "0")]
    );
    let unknown = &answers[6];
    assert_eq!(unknown.statuses.len(), 1);
    assert_eq!(unknown.statuses[0].current_limit, None);

    let (status, metrics) = get(proxy.admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    for line in [
        "spillway_requests_total{service=\"envoy\",bucket=\"marketing-per-number\",decision=\"allowed\",criticality=\"critical\"} 5",
        "spillway_requests_total{service=\"envoy\",bucket=\"marketing-per-number\",decision=\"dropped\",criticality=\"critical\"} 1",
        "spillway_requests_total{service=\"envoy\",bucket=\"messages-per-number\",decision=\"allowed\",criticality=\"critical\"} 6",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    let status = proxy.terminate();
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn rls_flags_are_checked_before_the_start() {
    let output = Command::new(SPILLWAY)
        .arg("proxy")
        .arg("-c")
        .arg(example())
        .args(["--listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9"])
        .args(["--rls-listen", &format!("0.0.0.0:{}", free_port())])
        .output()
        .expect("spillway proxy runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--rls-listen 0.0.0.0:") && stderr.contains("--insecure-plaintext"),
        "{stderr}"
    );
    // Client SANs are known only over mutual TLS.
    let output = Command::new(SPILLWAY)
        .arg("proxy")
        .arg("-c")
        .arg(example())
        .args(["--listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9"])
        .args(["--rls-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--allow-client-san", "spiffe://cluster.local/**"])
        .output()
        .expect("spillway proxy runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--tls-cert"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Response headers belong to the RLS listener.
    let output = Command::new(SPILLWAY)
        .arg("proxy")
        .arg("-c")
        .arg(example())
        .args(["--listen", "127.0.0.1:0"])
        .args(["--upstream", "http://127.0.0.1:9"])
        .arg("--rls-response-headers")
        .output()
        .expect("spillway proxy runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--rls-listen"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
