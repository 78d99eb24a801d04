//! The listening side: TLS handshakes off the accept loop, and each connection's verified peer
//! identity handed to the services (gRPC handlers read it from the request's extensions as
//! [`PeerInfo`]).
//!
//! With mutual TLS a client must present a certificate that chains to the CA, or the handshake
//! fails; which roles and regions may do what is the services' decision, made on [`PeerInfo`].
//! A handshake that fails or stalls (ten seconds at most) is reported to the listener's
//! `on_reject` hook, to be logged and counted, and never blocks the handshakes of others.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::files::{TlsError, TlsSource, uri_sans};
use crate::identity::{Identity, SanPolicy};

/// How long a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a listener asks its clients for certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// Mutual TLS: a certificate chaining to the CA is required (the control plane).
    Required,
    /// Server TLS only (an admin port or the rules service, whose clients bring bearer tokens).
    None,
}

/// The peer of one connection, as its certificate names it.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub remote: Option<SocketAddr>,
    /// The URI SANs of the client's certificate (none without mutual TLS).
    pub uris: Arc<[String]>,
    /// The Spillway identity among them, if any.
    pub identity: Option<Identity>,
}

impl PeerInfo {
    /// Whether the certificate's URI SANs match `policy` (the `--allow-client-san` hook of
    /// listeners that serve Envoy).
    pub fn allowed_by(&self, policy: &SanPolicy) -> bool {
        policy.allows(&self.uris)
    }

    /// A name for logs: the identity, or else the first URI SAN, or else the address.
    pub fn name(&self) -> String {
        match (&self.identity, self.uris.first(), self.remote) {
            (Some(id), _, _) => id.to_string(),
            (None, Some(uri), _) => uri.clone(),
            (None, None, Some(addr)) => addr.to_string(),
            (None, None, None) => "an unknown peer".into(),
        }
    }
}

/// The configuration of a listener, built from the files as they are now.
pub fn server_config(
    source: &TlsSource,
    auth: ClientAuth,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let material = source.material();
    let builder = ServerConfig::builder_with_provider(source.crypto().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match auth {
        ClientAuth::None => builder.with_no_client_auth(),
        ClientAuth::Required => {
            let roots = material.roots.clone().ok_or_else(|| {
                TlsError::Config("mutual TLS needs the CA file (--tls-ca)".into())
            })?;
            let verifier =
                WebPkiClientVerifier::builder_with_provider(roots, source.crypto().clone())
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(material.chain.clone(), material.key.clone_key())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A handshake that did not complete.
#[derive(Debug, Clone)]
pub struct HandshakeRejected {
    pub remote: SocketAddr,
    pub error: String,
}

/// What a listener does with a failed handshake (log it, count it).
pub type OnReject = Arc<dyn Fn(&HandshakeRejected) + Send + Sync>;

/// Accepts TLS connections for one listener.
#[derive(Clone)]
pub struct Acceptor {
    source: Arc<TlsSource>,
    auth: ClientAuth,
    alpn: Vec<&'static [u8]>,
}

impl Acceptor {
    /// `alpn`: the protocols offered, `h2` for gRPC.
    pub fn new(source: Arc<TlsSource>, auth: ClientAuth, alpn: &[&'static [u8]]) -> Self {
        Self {
            source,
            auth,
            alpn: alpn.to_vec(),
        }
    }

    pub fn source(&self) -> &Arc<TlsSource> {
        &self.source
    }

    /// Runs the handshake on `tcp` (at most [`HANDSHAKE_TIMEOUT`]).
    pub async fn accept(
        &self,
        tcp: TcpStream,
    ) -> Result<(tokio_rustls::server::TlsStream<TcpStream>, PeerInfo), String> {
        let remote = tcp.peer_addr().ok();
        let config =
            server_config(&self.source, self.auth, &self.alpn).map_err(|e| e.to_string())?;
        let handshake = tokio_rustls::TlsAcceptor::from(config).accept(tcp);
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(err)) => return Err(err.to_string()),
            Err(_) => return Err("the handshake did not complete within 10 s".into()),
        };
        let uris: Vec<String> = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| uri_sans(leaf).unwrap_or_default())
            .unwrap_or_default();
        let identity = Identity::from_uris(&uris, self.source.trust_domain()).ok();
        let info = PeerInfo {
            remote,
            uris: uris.into(),
            identity,
        };
        Ok((tls, info))
    }
}

/// One accepted TLS connection with its peer, for tonic's `serve_with_incoming`.
pub struct TlsConn {
    inner: tokio_rustls::server::TlsStream<TcpStream>,
    info: PeerInfo,
}

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The connections of `listener` that completed a handshake, for a gRPC server; the accept loop
/// ends when the stream is dropped (the server stopped).
pub fn incoming(
    listener: TcpListener,
    acceptor: Acceptor,
    on_reject: OnReject,
) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut closed = std::pin::pin!(tx.closed());
        while let Some((tcp, remote)) = crate::stop::accept_until(&listener, &mut closed).await {
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            let on_reject = on_reject.clone();
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok((inner, info)) => {
                        let _ = tx.send(Ok(TlsConn { inner, info })).await;
                    }
                    Err(error) => on_reject(&HandshakeRejected { remote, error }),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
