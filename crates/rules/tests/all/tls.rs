//! The rules service over TLS, on real sockets with certificates of the development
//! PKI: answers over https to a client that trusts the CA, nothing to plaintext http, no
//! handshake holding up another, a rotated certificate on the next connection without a
//! restart, and a stop that does not wait for a stalled handshake.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use spillway_rules::client::{CallError, RulesClient};
use spillway_rules::{Bounds, Role, ServerTls, Store};
use spillway_tls::DEFAULT_TRUST_DOMAIN;
use spillway_tls::certs::{self, Leaf, LeafRole};
use tempfile::TempDir;
use tokio::runtime::Runtime;

/// A development CA and a server leaf for the rules service, in a temporary folder.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        certs::init(&dir.path().join("ca"), DEFAULT_TRUST_DOMAIN, false).unwrap();
        let pki = Pki { dir };
        pki.issue(&[]);
        pki
    }

    /// (Re-)issues the server's leaf, with `names` besides localhost and 127.0.0.1.
    fn issue(&self, names: &[&str]) {
        let leaf = Leaf {
            role: LeafRole::Server,
            region: None,
            zone: None,
            host: None,
            names: names.iter().map(|n| n.to_string()).collect(),
            days: 1,
        };
        certs::issue(
            &self.dir.path().join("ca"),
            DEFAULT_TRUST_DOMAIN,
            &leaf,
            &self.dir.path().join("server"),
            true,
        )
        .unwrap();
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("server/cert.pem")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("server/key.pem")
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca/ca.pem")
    }
}

/// The rules service over TLS on `ip`:0, with an SQLite store and one admin.
struct TlsService {
    runtime: Runtime,
    addr: SocketAddr,
    admin: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _db: TempDir,
}

impl TlsService {
    fn start(pki: &Pki, ip: [u8; 4]) -> TlsService {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let db = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", db.path().join("rules.db").display());
        let tls = ServerTls::load(pki.cert(), pki.key()).unwrap();
        let (addr, admin, tx, served) = runtime.block_on(async {
            let store = Store::connect(&url).await.unwrap();
            let (_, admin) = store.create_user("alice", Role::Admin).await.unwrap();
            let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, 0)))
                .await
                .unwrap();
            let addr = listener.local_addr().unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let served = tokio::spawn(spillway_rules::serve_tls(
                listener,
                store,
                Bounds::default(),
                tls,
                async {
                    let _ = rx.await;
                },
            ));
            (addr, admin, tx, served)
        });
        TlsService {
            runtime,
            addr,
            admin,
            shutdown: Some(tx),
            served: Some(served),
            _db: db,
        }
    }

    /// A client of `https://HOST:PORT` that trusts `ca` only.
    fn client(&self, host: &str, ca: &Path, token: Option<&str>) -> RulesClient {
        let url = format!("https://{host}:{}", self.addr.port());
        RulesClient::with_ca(&url, token.map(str::to_owned), ca).unwrap()
    }

    /// Stops the service; returns how long it took to return.
    fn stop(&mut self) -> Duration {
        let started = Instant::now();
        let _ = self.shutdown.take().unwrap().send(());
        let served = self.served.take().unwrap();
        let result = self.runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), served)
                .await
                .expect("the service stops")
        });
        result.unwrap().unwrap();
        started.elapsed()
    }
}

impl Drop for TlsService {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// The DER of the first certificate in a PEM file.
fn der_of(pem: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(pem).unwrap().to_vec()
}

/// The certificate a fresh TLS connection to `addr` is shown, verified against `ca` for `name`.
fn presented(addr: SocketAddr, name: &str, ca: &Path) -> Vec<u8> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(der_of(ca))).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(spillway_tls::files::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).unwrap();
    }
    conn.peer_certificates().unwrap()[0].to_vec()
}

fn tls_error(answer: Result<impl std::fmt::Debug, CallError>) -> String {
    match answer {
        Err(err @ CallError::Tls { .. }) => err.to_string(),
        other => panic!("expected a refused handshake, got {other:?}"),
    }
}

#[test]
fn a_tls_server_answers_over_https_to_a_client_that_trusts_its_ca() {
    let pki = Pki::new();
    let service = TlsService::start(&pki, [127, 0, 0, 1]);

    for host in ["127.0.0.1", "localhost"] {
        let answer = service
            .client(host, &pki.ca(), None)
            .get("/healthz")
            .unwrap();
        assert_eq!(answer.status, 200, "{host}");
        assert_eq!(answer.body, serde_json::json!("ok\n"));
    }
    // The token goes inside the TLS session and works as over http.
    let client = service.client("127.0.0.1", &pki.ca(), Some(&service.admin));
    let rules = client.get("/v1/rules").unwrap();
    assert_eq!(rules.status, 200, "{}", rules.body);
    assert_eq!(rules.body, serde_json::json!([]));
    let anonymous = service
        .client("127.0.0.1", &pki.ca(), None)
        .get("/v1/rules");
    assert_eq!(anonymous.unwrap().status, 401);

    // A client of another CA refuses the server, and says so.
    let other = Pki::new();
    let refused = service
        .client("127.0.0.1", &other.ca(), None)
        .get("/healthz");
    let error = tls_error(refused);
    assert!(error.contains("does not chain to the CA in"), "{error}");
}

#[test]
fn plaintext_http_to_the_tls_port_gets_no_answer_and_holds_up_nobody() {
    let pki = Pki::new();
    let service = TlsService::start(&pki, [127, 0, 0, 1]);

    let mut plain = TcpStream::connect(service.addr).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let request = format!(
        "GET /healthz HTTP/1.1\r\nhost: {}\r\nconnection: close\r\n\r\n",
        service.addr
    );
    // One write: the server may hang up as soon as the first bytes show it is no handshake, and
    // a later write would then fail with a broken pipe.
    let _ = plain.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plaintext got an HTTP answer: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let over_http = RulesClient::new(&format!("http://{}", service.addr), None).get("/healthz");
    match over_http {
        Err(err @ CallError::NotHttp { .. }) => {
            assert!(err.to_string().contains("use an https:// URL"), "{err}")
        }
        other => panic!("plaintext got an answer: {other:?}"),
    }

    // A client that connects and never says hello does not delay anyone else's handshake.
    let stalled: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(service.addr).unwrap())
        .collect();
    let started = Instant::now();
    let answer = service
        .client("127.0.0.1", &pki.ca(), None)
        .get("/healthz")
        .unwrap();
    assert_eq!(answer.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?} beside stalled handshakes",
        started.elapsed()
    );
    drop(stalled);
}

#[test]
fn an_https_client_of_a_plaintext_server_says_it_does_not_speak_tls() {
    let pki = Pki::new();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let db = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", db.path().join("rules.db").display());
    let addr = runtime.block_on(async {
        let store = Store::connect(&url).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(spillway_rules::serve(
            listener,
            store,
            std::future::pending(),
        ));
        addr
    });
    let client = RulesClient::with_ca(&format!("https://{addr}"), None, &pki.ca()).unwrap();
    let error = tls_error(client.get("/healthz"));
    assert!(error.contains("does not speak TLS"), "{error}");
}

#[test]
fn a_rotated_certificate_serves_the_next_connection_without_a_restart() {
    let pki = Pki::new();
    // 127.0.0.2 is loopback too, but the first leaf names only localhost and 127.0.0.1.
    let service = TlsService::start(&pki, [127, 0, 0, 2]);
    let first = der_of(&pki.cert());
    assert_eq!(presented(service.addr, "localhost", &pki.ca()), first);
    let error = tls_error(service.client("127.0.0.2", &pki.ca(), None).get("/healthz"));
    assert!(
        error.contains("not valid for name") && error.contains("127.0.0.2"),
        "{error}"
    );

    // Rotation: a new leaf (new key, new serial, one more SAN) written over the files.
    pki.issue(&["127.0.0.2"]);
    let second = der_of(&pki.cert());
    assert_ne!(first, second);
    assert_eq!(presented(service.addr, "localhost", &pki.ca()), second);
    let answer = service
        .client("127.0.0.2", &pki.ca(), None)
        .get("/healthz")
        .unwrap();
    assert_eq!(answer.status, 200);

    // A broken write keeps the certificate in force rather than taking the service down.
    std::fs::write(pki.cert(), "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    assert_eq!(presented(service.addr, "localhost", &pki.ca()), second);
}

#[test]
fn the_service_stops_without_waiting_for_a_stalled_handshake() {
    let pki = Pki::new();
    let mut service = TlsService::start(&pki, [127, 0, 0, 1]);
    // One connection idle after a request, one that never finishes its handshake.
    let answer = service
        .client("127.0.0.1", &pki.ca(), None)
        .get("/healthz")
        .unwrap();
    assert_eq!(answer.status, 200);
    let stalled = TcpStream::connect(service.addr).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let took = service.stop();
    assert!(
        took < Duration::from_secs(5),
        "stopping took {took:?}, as if it waited out the 10 s handshake timeout"
    );
    drop(stalled);
    assert!(
        TcpStream::connect_timeout(&service.addr, Duration::from_secs(1)).is_err(),
        "the listener is closed"
    );
}
