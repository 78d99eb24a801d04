//! What the RLS and RLQS tests share: a plaintext RLS server on loopback, and a development CA
//! and leaves issued from it for the TLS tests.

use std::path::Path;
use std::sync::Arc;

use spillway_client::Client;
use spillway_rls::pb::RateLimitServiceClient;
use spillway_rls::{Rls, RlsOptions, RlsServer, serve};
use spillway_tls::certs::{self, Leaf, LeafRole};
use spillway_tls::{TlsFiles, TlsSource};
use tokio::net::TcpListener;
use tonic::transport::Channel;

/// An RLS server for `client` with `options` on a free loopback port, and a client of it.
pub async fn serve_rls(
    client: Arc<Client>,
    options: RlsOptions,
) -> (RlsServer, RateLimitServiceClient<Channel>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = serve(listener, Rls::new(client, options), None);
    let rls = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (server, rls)
}

pub const TRUST: &str = "spillway.local";

/// A development CA in `dir` (made on first use) and a leaf of `role` in `region` and `zone`
/// for host `name`, issued into `dir/NAME`.
pub fn leaf(dir: &Path, name: &str, role: LeafRole, region: &str, zone: &str) -> Arc<TlsSource> {
    if !dir.join("ca/ca.pem").exists() {
        certs::init(&dir.join("ca"), TRUST, false).unwrap();
    }
    let request = Leaf {
        role,
        region: Some(region.into()),
        zone: Some(zone.into()),
        host: Some(name.into()),
        names: Vec::new(),
        days: 1,
    };
    let out = dir.join(name);
    certs::issue(&dir.join("ca"), TRUST, &request, &out, false).unwrap();
    let files = TlsFiles {
        cert: out.join("cert.pem"),
        key: out.join("key.pem"),
        ca: Some(out.join("ca.pem")),
    };
    TlsSource::load(files, TRUST).unwrap()
}
