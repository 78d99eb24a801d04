//! Real handshakes on loopback between certificates of the development PKI.

use std::path::Path;
use std::sync::Arc;

use spillway_tls::certs::{self, Leaf, LeafRole};
use spillway_tls::server::{Acceptor, ClientAuth};
use spillway_tls::{Connector, Expect, Identity, TlsFiles, TlsSource, WorkloadRole};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower_service::Service;

const TD: &str = "spillway.local";

fn leaf(role: LeafRole, region: &str, zone: Option<&str>, host: Option<&str>) -> Leaf {
    Leaf {
        role,
        region: Some(region.into()),
        zone: zone.map(Into::into),
        host: host.map(Into::into),
        names: vec![],
        days: 1,
    }
}

fn source(dir: &Path) -> Arc<TlsSource> {
    TlsSource::load(
        TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            ca: Some(dir.join("ca.pem")),
        },
        TD,
    )
    .unwrap()
}

/// Serves one handshake on `listener`; returns the client's identity or the server's error.
async fn serve_one(listener: TcpListener, acceptor: Acceptor) -> Result<Option<Identity>, String> {
    let (tcp, _) = listener.accept().await.unwrap();
    let (mut tls, peer) = acceptor.accept(tcp).await?;
    let mut byte = [0u8; 1];
    tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
    tls.write_all(&byte).await.map_err(|e| e.to_string())?;
    tls.flush().await.map_err(|e| e.to_string())?;
    Ok(peer.identity)
}

async fn dial(
    client: Arc<TlsSource>,
    server: Arc<TlsSource>,
    expect: Expect,
) -> (Result<(), String>, Result<Option<Identity>, String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = Acceptor::new(server, ClientAuth::Required, &[b"h2"]);
    let served = tokio::spawn(serve_one(listener, acceptor));
    let mut connector = Connector::new(client, expect);
    let uri: http::Uri = format!("https://{addr}").parse().unwrap();
    let dialled = async {
        let io = connector.call(uri).await.map_err(|e| e.to_string())?;
        let mut tls = io.into_inner();
        tls.write_all(b"x").await.map_err(|e| e.to_string())?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
        Ok(())
    }
    .await;
    (dialled, served.await.unwrap())
}

fn any() -> Expect {
    Expect::new("any identity", |_| Ok(()))
}

#[tokio::test]
async fn both_sides_learn_each_others_identity_and_strangers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    certs::init(&ca, TD, false).unwrap();
    assert_eq!(
        certs::ca_trust_domain(&ca.join("ca.pem"))
            .unwrap()
            .as_deref(),
        Some(TD)
    );
    let agg = dir.path().join("agg");
    let proxy = dir.path().join("proxy");
    certs::issue(
        &ca,
        TD,
        &leaf(LeafRole::Aggregator, "eu", Some("a"), None),
        &agg,
        false,
    )
    .unwrap();
    certs::issue(
        &ca,
        TD,
        &leaf(LeafRole::Proxy, "eu", Some("a"), Some("h1")),
        &proxy,
        false,
    )
    .unwrap();
    assert_eq!(
        source(&agg).identity().unwrap().role,
        WorkloadRole::Aggregator {
            region: "eu".into(),
            zone: "a".into()
        }
    );

    // A proxy dials its aggregator: each side sees the other's identity.
    let expect_agg = Expect::new("the aggregator of eu/a", |id| match &id.role {
        WorkloadRole::Aggregator { region, zone } if region == "eu" && zone == "a" => Ok(()),
        _ => Err("wrong role".into()),
    });
    let (client, server) = dial(source(&proxy), source(&agg), expect_agg).await;
    client.unwrap();
    let seen = server.unwrap().unwrap();
    assert_eq!(seen.uri(), "spiffe://spillway.local/spillway/proxy/eu/a/h1");

    // The proxy refuses a server that is not the role it expects.
    let expect_ctl = Expect::new("the controller of eu", |id| match &id.role {
        WorkloadRole::Controller { region } if region == "eu" => Ok(()),
        _ => Err("wrong role".into()),
    });
    let (client, _) = dial(source(&proxy), source(&agg), expect_ctl).await;
    let err = client.unwrap_err();
    assert!(err.contains("not the controller of eu"), "{err}");

    // A client whose certificate comes from another CA fails the handshake.
    let other_ca = dir.path().join("other-ca");
    certs::init(&other_ca, TD, false).unwrap();
    let stranger = dir.path().join("stranger");
    certs::issue(
        &other_ca,
        TD,
        &leaf(LeafRole::Proxy, "eu", Some("a"), Some("h1")),
        &stranger,
        false,
    )
    .unwrap();
    // The stranger trusts the real CA (so only the server's check can refuse it).
    std::fs::copy(ca.join("ca.pem"), stranger.join("ca.pem")).unwrap();
    let (client, server) = dial(source(&stranger), source(&agg), any()).await;
    assert!(client.is_err(), "a certificate of another CA is refused");
    assert!(server.is_err());
}

#[tokio::test]
async fn a_rewritten_certificate_is_used_from_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    certs::init(&ca, TD, false).unwrap();
    let agg = dir.path().join("agg");
    let proxy = dir.path().join("proxy");
    certs::issue(
        &ca,
        TD,
        &leaf(LeafRole::Aggregator, "eu", Some("a"), None),
        &agg,
        false,
    )
    .unwrap();
    certs::issue(
        &ca,
        TD,
        &leaf(LeafRole::Proxy, "eu", Some("a"), Some("h1")),
        &proxy,
        false,
    )
    .unwrap();
    let client = source(&proxy);
    let server = source(&agg);
    let (_, seen) = dial(client.clone(), server.clone(), any()).await;
    assert_eq!(seen.unwrap().unwrap().role.host(), Some("h1"));
    assert_eq!(client.generation(), 0);

    // Rotate the proxy's files in place: the same process presents the new certificate.
    certs::issue(
        &ca,
        TD,
        &leaf(LeafRole::Proxy, "eu", Some("a"), Some("h2")),
        &proxy,
        true,
    )
    .unwrap();
    let (_, seen) = dial(client.clone(), server.clone(), any()).await;
    assert_eq!(seen.unwrap().unwrap().role.host(), Some("h2"));
    assert_eq!(client.generation(), 1);

    // A broken rewrite keeps the certificate in force.
    std::fs::write(proxy.join("cert.pem"), "not a certificate").unwrap();
    let (client_result, seen) = dial(client.clone(), server, any()).await;
    client_result.unwrap();
    assert_eq!(seen.unwrap().unwrap().role.host(), Some("h2"));
    assert_eq!(client.generation(), 1);
}

#[test]
fn a_leaf_without_its_segments_says_which_flag_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    certs::init(dir.path(), TD, false).unwrap();
    let err = certs::issue(
        dir.path(),
        TD,
        &leaf(LeafRole::Proxy, "eu", Some("a"), None),
        dir.path(),
        false,
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "--role proxy needs --host");
    let err = certs::issue(
        dir.path(),
        TD,
        &leaf(LeafRole::Controller, "e/u", None, None),
        dir.path(),
        false,
    )
    .unwrap_err();
    assert!(err.to_string().contains("\"e/u\""), "{err}");
    let err = certs::init(dir.path(), TD, false).unwrap_err();
    assert!(err.to_string().contains("--force"), "{err}");
}
