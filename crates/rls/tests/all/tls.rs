//! The RLS listener over mutual TLS: a client certificate that chains to the CA is
//! required, and `--allow-client-san` patterns decide which certificates' URI SANs may call;
//! the others are answered PERMISSION_DENIED, naming their SANs.

use crate::support;

use std::path::Path;
use std::sync::Arc;

use spillway_client::Client;
use spillway_core::config::load_str;
use spillway_rls::pb::{self, Code, RateLimitServiceClient};
use spillway_rls::{Rls, RlsOptions, RlsServer, serve};
use spillway_tls::certs::LeafRole;
use spillway_tls::{Connector, Expect, SanPolicy, TlsSource};
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};

const YAML: &str = "version: 1\nservices:\n  envoy:\n    buckets:\n      - { name: per-ip, limit: 2/h, algorithm: fixed-window, match: { descriptor: { domain: edge, entries: [ {key: remote_address} ] } } }\n";

/// A leaf of `role` for host `name` in this test's region and zone.
fn leaf(dir: &Path, name: &str, role: LeafRole) -> Arc<TlsSource> {
    support::leaf(dir, name, role, "eu", "eu-a")
}

async fn start(server: Arc<TlsSource>, allow: &[&str]) -> (RlsServer, String) {
    let config = load_str(YAML, "test.yaml").unwrap();
    let client = Arc::new(Client::new(config).unwrap());
    let rls = Rls::new(client, RlsOptions::default())
        .with_allowed_sans(SanPolicy::new(allow.iter().map(|p| (*p).to_owned())));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    (serve(listener, rls, Some(server)), url)
}

async fn connect(url: &str, client: Arc<TlsSource>) -> RateLimitServiceClient<Channel> {
    let connector = Connector::new(client, Expect::new("the sidecar", |_| Ok(())));
    let channel = Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect_with_connector(connector)
        .await
        .unwrap();
    RateLimitServiceClient::new(channel)
}

fn request() -> pb::RateLimitRequest {
    pb::request("edge", &[&[("remote_address", "10.0.0.1")]])
}

#[tokio::test]
async fn allowed_sans_are_answered_and_the_others_refused_naming_their_sans() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = leaf(dir.path(), "sidecar", LeafRole::Proxy);
    let caller = leaf(dir.path(), "caller", LeafRole::Aggregator);

    let (_allowing, url) = start(
        sidecar.clone(),
        &[
            "spiffe://cluster.local/ns/*/sa/envoy",
            "spiffe://spillway.local/spillway/aggregator/**",
        ],
    )
    .await;
    let mut rls = connect(&url, caller.clone()).await;
    let answer = rls.should_rate_limit(request()).await.unwrap().into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 1);

    let (_refusing, url) = start(sidecar, &["spiffe://cluster.local/**"]).await;
    let mut rls = connect(&url, caller).await;
    let err = rls.should_rate_limit(request()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied);
    assert!(
        err.message()
            .contains("spiffe://spillway.local/spillway/aggregator/eu/eu-a"),
        "{}",
        err.message()
    );
}
