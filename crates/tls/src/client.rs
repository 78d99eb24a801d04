//! The dialling side of a control-plane link: mutual TLS that verifies the server by its SPIFFE
//! identity rather than by host name.
//!
//! The server's chain must lead to the process's CA; then its certificate's identity must be the
//! role the link expects (a proxy dials its zone's aggregator, an aggregator its region's
//! controller, a controller other regions' controllers), as X.509-SVID verification does. Host
//! names are not checked: in a cluster the same certificate serves every address of a pod.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::net::TcpStream;

use crate::files::{TlsError, TlsSource, uri_sans};
use crate::identity::Identity;

type Check = dyn Fn(&Identity) -> Result<(), String> + Send + Sync;

/// What a link accepts as the server's identity.
#[derive(Clone)]
pub struct Expect {
    what: String,
    check: Arc<Check>,
}

impl std::fmt::Debug for Expect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.what)
    }
}

impl Expect {
    /// `what` says in words what is expected (it appears in the error of a refused server).
    pub fn new(
        what: impl Into<String>,
        check: impl Fn(&Identity) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            what: what.into(),
            check: Arc::new(check),
        }
    }

    pub fn check(&self, identity: &Identity) -> Result<(), String> {
        (self.check)(identity)
    }
}

#[derive(Debug)]
struct SpiffeVerifier {
    roots: Arc<RootCertStore>,
    trust_domain: String,
    expect: Expect,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SpiffeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let uris = uri_sans(end_entity).map_err(rustls::Error::General)?;
        let identity = Identity::from_uris(&uris, &self.trust_domain)
            .map_err(|e| rustls::Error::General(format!("the server's certificate: {e}")))?;
        self.expect.check(&identity).map_err(|why| {
            rustls::Error::General(format!(
                "the server is {identity}, not {}: {why}",
                self.expect.what
            ))
        })?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client configuration for one link: the process's certificate as its client certificate,
/// the server verified against the CA and `expect`, HTTP/2 by ALPN.
pub fn client_config(source: &TlsSource, expect: &Expect) -> Result<Arc<ClientConfig>, TlsError> {
    let material = source.material();
    let roots = material.roots.clone().ok_or_else(|| {
        TlsError::Config("a control-plane link needs the CA file (--tls-ca)".into())
    })?;
    let verifier = SpiffeVerifier {
        roots,
        trust_domain: source.trust_domain().to_owned(),
        expect: expect.clone(),
        provider: source.crypto().clone(),
    };
    let mut config = ClientConfig::builder_with_provider(source.crypto().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_auth_cert(material.chain.clone(), material.key.clone_key())
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A connector for `tonic::transport::Endpoint::connect_with_connector`: TCP (Nagle off), then
/// a TLS handshake with the configuration of the files as they are now, so a rotated
/// certificate is used from the next connection on.
#[derive(Clone, Debug)]
pub struct Connector {
    source: Arc<TlsSource>,
    expect: Expect,
}

impl Connector {
    pub fn new(source: Arc<TlsSource>, expect: Expect) -> Self {
        Self { source, expect }
    }
}

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let source = self.source.clone();
        let expect = self.expect.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| format!("{uri} has no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let config = client_config(&source, &expect)?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let name = ServerName::try_from(host)?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}
