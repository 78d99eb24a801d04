//! An RLQS host is the client certificate's identity when the listener has TLS: streams on
//! several connections under one certificate are one host, held to its cap on streams, while
//! another certificate is another host.

use crate::support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use spillway_control::{Aggregator, AggregatorOptions};
use spillway_rls::rlqs::pb;
use spillway_rls::{Rlqs, RlqsLimits, serve_rlqs};
use spillway_tls::certs::LeafRole;
use spillway_tls::{Connector, Expect, TlsSource};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Endpoint;

/// A leaf of `role` for host `name` in this test's region and zone.
fn leaf(dir: &Path, name: &str, role: LeafRole) -> Arc<TlsSource> {
    support::leaf(dir, name, role, "r1", "z1")
}

/// Opens a stream on a new connection as `client`: the stream's outbox (kept to hold it open),
/// or the status it was refused with.
async fn open(
    url: &str,
    client: Arc<TlsSource>,
) -> Result<mpsc::Sender<pb::RateLimitQuotaUsageReports>, tonic::Status> {
    let connector = Connector::new(client, Expect::new("the aggregator", |_| Ok(())));
    let channel = Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect_with_connector(connector)
        .await
        .unwrap();
    let mut stub = pb::RateLimitQuotaServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(1);
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        stub.stream_rate_limit_quotas(ReceiverStream::new(rx)),
    )
    .await
    .expect("the stream is answered");
    response.map(|_| tx)
}

#[tokio::test]
async fn one_certificate_is_one_host_across_connections() {
    let dir = tempfile::tempdir().unwrap();
    let server = leaf(dir.path(), "aggregator", LeafRole::Aggregator);
    let envoy = leaf(dir.path(), "envoy-a", LeafRole::Proxy);
    let other = leaf(dir.path(), "envoy-b", LeafRole::Proxy);
    // No controller answers: the streams attach all the same.
    let options = AggregatorOptions::new(
        "127.0.0.1:0".parse().unwrap(),
        "r1",
        "z1",
        "http://127.0.0.1:9".to_owned(),
    );
    let aggregator = Aggregator::start(options).await.unwrap();
    let limits = RlqsLimits {
        streams_per_host: 2,
        ..RlqsLimits::default()
    };
    let (listener, addr) = spillway_net::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let rlqs = serve_rlqs(
        listener,
        Rlqs::new(aggregator.local_clients()).with_limits(limits),
        Some(server),
    );
    let url = format!("https://{addr}");
    // Two connections under one certificate hold the host's two streams; a third is refused.
    let first = open(&url, envoy.clone()).await.unwrap();
    let second = open(&url, envoy.clone()).await.unwrap();
    let third = open(&url, envoy.clone()).await.unwrap_err();
    assert_eq!(third.code(), Code::ResourceExhausted, "{third:?}");
    assert!(
        third
            .message()
            .contains("spiffe://spillway.local/spillway/proxy/r1/z1/envoy-a"),
        "{third:?}"
    );
    // Another certificate is another host.
    let _b = open(&url, other).await.unwrap();
    // A stream that closes makes room for one more.
    drop(first);
    let mut reopened = None;
    for _ in 0..50 {
        match open(&url, envoy.clone()).await {
            Ok(tx) => {
                reopened = Some(tx);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(reopened.is_some(), "no room after a stream closed");
    drop(second);
    rlqs.shutdown().await;
    aggregator.shutdown().await;
}
