//! A controller's dialled peers over mutual TLS: a peer whose server certificate
//! names region r2 may send r2's sums, and is heard; one that sends a third region's sums under
//! that certificate is refused (`spillway_control_plane_rejected_total{reason="region"}`), its
//! stream dropped and redialled, and never heard as a peer. The lying peer is a gRPC server of
//! the project's proto with a real certificate from a development CA.

use crate::support;

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use spillway_control::{Controller, ControllerOptions, FileRules};
use spillway_proto::v1;
use spillway_tls::certs::{self, Leaf, LeafRole};
use spillway_tls::server::{Acceptor, ClientAuth, incoming};
use spillway_tls::{TlsFiles, TlsSource};
use tokio::net::TcpListener;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

const TRUST: &str = "spillway.local";

/// A controller's certificate of `region`, from the development CA in `dir/ca`.
fn controller_cert(dir: &Path, region: &str) -> Arc<TlsSource> {
    if !dir.join("ca/ca.pem").exists() {
        certs::init(&dir.join("ca"), TRUST, false).unwrap();
    }
    let out = dir.join(region);
    let leaf = Leaf {
        role: LeafRole::Controller,
        region: Some(region.into()),
        zone: None,
        host: None,
        names: Vec::new(),
        days: 1,
    };
    certs::issue(&dir.join("ca"), TRUST, &leaf, &out, true).unwrap();
    TlsSource::load(
        TlsFiles {
            cert: out.join("cert.pem"),
            key: out.join("key.pem"),
            ca: Some(out.join("ca.pem")),
        },
        TRUST,
    )
    .unwrap()
}

type SumsStream = Pin<Box<dyn Stream<Item = Result<v1::RegionSums, Status>> + Send>>;
type ZoneStream = Pin<Box<dyn Stream<Item = Result<v1::ZoneInstructions, Status>> + Send>>;

/// A peer that answers every `Exchange` with sums announcing `announces`, every 100 ms.
struct Peer {
    announces: String,
    streams: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl v1::controller_server::Controller for Peer {
    type LinkZoneStream = ZoneStream;
    type ExchangeStream = SumsStream;

    async fn link_zone(
        &self,
        _: Request<Streaming<v1::ZoneReport>>,
    ) -> Result<Response<ZoneStream>, Status> {
        Err(Status::unimplemented("a peer only"))
    }

    async fn exchange(
        &self,
        _: Request<Streaming<v1::RegionSums>>,
    ) -> Result<Response<SumsStream>, Status> {
        self.streams.fetch_add(1, Ordering::Relaxed);
        let region = self.announces.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let sums = v1::RegionSums {
                region,
                ..Default::default()
            };
            // Until the controller drops the stream.
            while tx.send(Ok(sums.clone())).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let sums = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(sums)))
    }
}

/// Starts the fake peer with `cert`, announcing `announces`; its URL and stream count.
async fn peer(cert: Arc<TlsSource>, announces: &str) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let streams = Arc::new(AtomicU64::new(0));
    let service = v1::controller_server::ControllerServer::new(Peer {
        announces: announces.into(),
        streams: streams.clone(),
    });
    let acceptor = Acceptor::new(cert, ClientAuth::Required, &[b"h2"]);
    let conns = incoming(listener, acceptor, Arc::new(|_| {}));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(conns),
    );
    (url, streams)
}

async fn controller(dir: &Path, peer: &str) -> Controller {
    let path = dir.join("rules.yaml");
    std::fs::write(&path, support::rules(100)).unwrap();
    let rules = FileRules::load(&path)
        .unwrap()
        .watch(Duration::from_millis(30));
    let listen = "127.0.0.1:0".parse().unwrap();
    let mut options = ControllerOptions::new(listen, "r1", rules);
    options.peers = vec![peer.to_owned()];
    options.tls = Some(controller_cert(dir, "r1"));
    options.backoff = support::quick_backoff();
    options.admin = Some("127.0.0.1:0".parse().unwrap());
    Controller::start(options).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialled_peer_is_heard_for_its_certificates_region_only() {
    let dir = tempfile::tempdir().unwrap();
    let r2 = controller_cert(dir.path(), "r2");

    // Honest: r2's certificate, r2's sums.
    let (url, _) = peer(r2.clone(), "r2").await;
    let honest = controller(dir.path(), &url).await;
    let start = std::time::Instant::now();
    while honest.live_peers() != ["r2"] {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "r2 never heard: {:?}",
            honest.live_peers()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    honest.shutdown().await;

    // Lying: r2's certificate, r3's sums.
    let (url, streams) = peer(r2, "r3").await;
    let lied_to = controller(dir.path(), &url).await;
    let start = std::time::Instant::now();
    while streams.load(Ordering::Relaxed) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the stream was not redialled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        lied_to.live_peers().is_empty(),
        "{:?}",
        lied_to.live_peers()
    );
    let (_, metrics) = support::get(lied_to.admin_addr().unwrap(), "/metrics").await;
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("spillway_control_plane_rejected_total{reason=\"region\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(refused >= 2, "{metrics}");
    lied_to.shutdown().await;
}
