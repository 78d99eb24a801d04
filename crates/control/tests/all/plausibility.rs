//! A compromised proxy against a real aggregator and controller over gRPC on loopback:
//! four honest clients report 100/s each to a bucket of 1,000/s, and one more client of the same
//! zone reports `offered = 1e9` every interval. The drop ratio the honest clients receive stays
//! within the bound of `spillway_loop::plausible`, `1 - L / (R + max(L, k x m))`, here
//! `1 - 1,000 / (400 + 1,000) = 0.286` (without the bound it was 0.9999996), and the aggregator
//! counts the clamps on `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use spillway_control::{Aggregator, AggregatorOptions, Controller, ControllerOptions};
use spillway_core::algo::Ratio;
use spillway_loop::RulesSnapshot;
use spillway_proto::v1;
use spillway_proto::v1::aggregator_client::AggregatorClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

const INTERVAL_MS: u64 = 200;
const RULES: &str = "version: 1\ncontrol:\n  report_interval: 200ms\n  instruction_ttl: 1s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 1000/s, scope: region }\n";
const HONEST: usize = 4;
/// 100/s over a 200 ms interval.
const HONEST_OFFERED: u64 = 20;
/// `1 - L / (R + max(L, k x m))` with L = 1,000/s, R = 400/s, k x m = 400/s.
const BOUND: f64 = 1.0 - 1000.0 / 1400.0;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn report(host: &str, sequence: u64, offered: u64, tail: u64) -> v1::Report {
    v1::Report {
        surge: false,
        host_id: host.into(),
        zone: "r1z1".into(),
        region: "r1".into(),
        rules_version: 1,
        sequence,
        interval_ms: INTERVAL_MS,
        buckets: vec![v1::BucketCounts {
            service: "api".into(),
            bucket: "all".into(),
            offered,
            allowed: offered,
            shadow_dropped: 0,
            offered_tail: Some(tail),
            offered_squares: None,
            hosts: None,
            tier_offered: Vec::new(),
            id: 0,
        }],
    }
}

/// A client's stream: reports go in through the sender, every `all` ratio that came down is
/// forwarded to `ratios`.
async fn link(
    aggregator: SocketAddr,
    ratios: mpsc::UnboundedSender<f64>,
) -> mpsc::Sender<v1::Report> {
    let channel = spillway_link::endpoint(&format!("http://{aggregator}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = AggregatorClient::new(channel);
    let (tx, rx) = mpsc::channel(16);
    let mut inbound = client
        .link(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tokio::spawn(async move {
        while let Ok(Some(instructions)) = inbound.message().await {
            for b in instructions.buckets.iter().filter(|b| b.bucket == "all") {
                let _ = ratios.send(Ratio::from_raw(b.drop_ratio).as_f64());
            }
        }
    });
    tx
}

/// A GET on an admin listener: its body.
async fn get(addr: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// The value of the sample `name{reason="REASON"}` in a metrics text.
fn clamped(metrics: &str, reason: &str) -> u64 {
    let prefix = format!("spillway_control_plane_clamped_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reporting_a_billion_moves_the_honest_ratio_no_further_than_the_bound() {
    let rules = Arc::new(RulesSnapshot::parse(1, RULES, "rules.yaml").unwrap());
    let (_rules_tx, rules_rx) = watch::channel(rules);
    let controller_addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let controller = Controller::start(ControllerOptions::new(controller_addr, "r1", rules_rx))
        .await
        .unwrap();
    let mut options = AggregatorOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        "r1",
        "r1z1",
        format!("http://{controller_addr}"),
    );
    options.admin = Some("127.0.0.1:0".parse().unwrap());
    let aggregator = Aggregator::start(options).await.unwrap();
    let (ratios_tx, mut ratios) = mpsc::unbounded_channel();
    let mut honest = Vec::new();
    for _ in 0..HONEST {
        honest.push(link(aggregator.local_addr(), ratios_tx.clone()).await);
    }
    let (ignored, _keep) = mpsc::unbounded_channel();
    let liar = link(aggregator.local_addr(), ignored).await;

    // Report at every interval boundary for 4 s (20 intervals), as real clients do.
    let mut seen = Vec::new();
    let deadline = now_ms() + 4_000;
    while now_ms() < deadline {
        let now = now_ms();
        let next = (now / INTERVAL_MS + 1) * INTERVAL_MS;
        tokio::time::sleep(Duration::from_millis(next - now)).await;
        let sequence = next / INTERVAL_MS - 1;
        for (i, tx) in honest.iter().enumerate() {
            let host = format!("h{i}");
            let _ = tx
                .send(report(&host, sequence, HONEST_OFFERED, HONEST_OFFERED / 4))
                .await;
        }
        let _ = liar
            .send(report("liar", sequence, 1_000_000_000, 1_000_000_000))
            .await;
        while let Ok(r) = ratios.try_recv() {
            seen.push(r);
        }
    }
    let highest = seen.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "{} instructions to honest clients, highest ratio {highest:.4}, bound {BOUND:.4}",
        seen.len()
    );
    // Every honest client was instructed all along, and never over the bound (the fixed point
    // rounds to 2^-32).
    assert!(seen.len() >= HONEST * 10, "{} instructions", seen.len());
    assert!(highest <= BOUND + 1e-6, "{highest} over {BOUND}");
    // The liar still counts for the bucket's limit: the bound is reached, not dodged.
    assert!(highest >= BOUND - 0.01, "{highest}");

    let metrics = get(aggregator.admin_addr().unwrap(), "/metrics").await;
    assert!(clamped(&metrics, "over_peers") >= 10, "{metrics}");
    assert!(clamped(&metrics, "host_capacity") >= 10, "{metrics}");
    assert!(
        metrics.contains("spillway_control_plane_clamped_total{reason=\"shadow_over_offered\"} 0"),
        "every reason is shown, at 0 when it never happened: {metrics}"
    );

    aggregator.shutdown().await;
    controller.shutdown().await;
}
