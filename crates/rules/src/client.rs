//! A small blocking client of the rules service, for the `spillway rules` and `spillway
//! configure` commands and tests: typed calls for rules ([`RulesClient::rules`],
//! [`RulesClient::create_rule`], [`RulesClient::replace_rule`], on core's
//! [`Rule`](spillway_core::rule::Rule)), and [`RulesClient::send`] for any route.
//!
//! An `https://` server's certificate must chain to the CA the client is given (`--ca`), or
//! else to one of the system's roots, and name the host dialled. An `http://` server is spoken to
//! in plaintext: [`plaintext_off_loopback`] tells when that sends the token across a network.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::{CertificateError, RootCertStore};
use serde::de::DeserializeOwned;
use serde_json::Value;
use spillway_core::rule::{Rule, RuleBody};
use ureq::Agent;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

/// Why a call to the rules API did not return what was asked: the caller's side of the
/// service's [`ApiError`](crate::problem::ApiError) answers, plus the calls that got none.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot reach the rules service at {server}: {source}")]
    Transport {
        server: String,
        #[source]
        source: ureq::Error,
    },
    /// The TLS handshake failed: the server's certificate was refused, or it spoke no TLS.
    #[error("cannot reach the rules service at {server} over TLS: {what}")]
    Tls { server: String, what: String },
    /// An `http://` URL whose server answered something other than HTTP: TLS, most likely.
    #[error(
        "the rules service at {server} does not answer plaintext http ({source}): if it serves \
         TLS, use an https:// URL"
    )]
    NotHttp {
        server: String,
        #[source]
        source: ureq::Error,
    },
    /// The service answered with an error status; `detail` is its problem document's.
    #[error("{status}: {detail}")]
    Status { status: u16, detail: String },
    #[error("the rules service answered something that is not JSON: {0}")]
    Body(String),
    /// The service answered JSON, but not the shape asked for (a rule, a list of rules).
    #[error("the rules service answered JSON this client does not read: {0}")]
    Unexpected(String),
    #[error("cannot write the request as JSON: {0}")]
    Encode(String),
}

/// What the rules service answered: status, selected headers and the body as JSON (`Null` when
/// empty).
#[derive(Debug, Clone)]
pub struct RulesResponse {
    pub status: u16,
    pub etag: Option<String>,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    /// The `link` header: a full page of `/v1/audit` names the next one there.
    pub link: Option<String>,
    pub body: Value,
}

impl RulesResponse {
    /// The response when its status is a success, else its problem as an error.
    pub fn ok(self) -> Result<Self, CallError> {
        if (200..300).contains(&self.status) {
            Ok(self)
        } else {
            let detail = self.body["detail"]
                .as_str()
                .map_or_else(|| self.body.to_string(), str::to_owned);
            Err(CallError::Status {
                status: self.status,
                detail,
            })
        }
    }
}

/// Why a client could not be made: its CA file, or a CA for a server it would not be used for.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("{}: cannot read the CA file: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {what}", .path.display())]
    Pem { path: PathBuf, what: String },
    #[error("a CA is for an https:// server, but {server} is plaintext http: give an https:// URL")]
    NotHttps { server: String },
}

/// What an `https://` server's certificate must chain to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Trust {
    /// The system's root CAs.
    System,
    /// The CA certificates in this PEM file.
    Ca(PathBuf),
}

/// A blocking client of the rules service's REST API, one bearer token per client.
pub struct RulesClient {
    server: String,
    token: Option<String>,
    trust: Trust,
    agent: Agent,
}

impl RulesClient {
    /// A client that trusts the system's root CAs for an `https://` server.
    pub fn new(server: &str, token: Option<String>) -> Self {
        Self::build(server, token, Trust::System, RootCerts::PlatformVerifier)
    }

    /// A client for which an `https://` server's certificate must chain to a CA in `ca` (PEM),
    /// and to nothing else. `server` must be `https://`: a CA would not protect plaintext.
    pub fn with_ca(server: &str, token: Option<String>, ca: &Path) -> Result<Self, TrustError> {
        if !server.starts_with("https://") {
            return Err(TrustError::NotHttps {
                server: server.to_owned(),
            });
        }
        let roots = read_ca(ca)?;
        Ok(Self::build(
            server,
            token,
            Trust::Ca(ca.to_owned()),
            RootCerts::Specific(Arc::new(roots)),
        ))
    }

    fn build(server: &str, token: Option<String>, trust: Trust, roots: RootCerts) -> Self {
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(spillway_tls::files::provider())
            .root_certs(roots)
            .build();
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .tls_config(tls)
            .build()
            .into();
        RulesClient {
            server: server.trim_end_matches('/').to_owned(),
            token,
            trust,
            agent,
        }
    }

    /// The error of a call that got no answer, with a failed handshake said in words.
    fn transport(&self, source: ureq::Error) -> CallError {
        // ureq hands rustls' verdict back directly or inside the I/O error of the handshake.
        let tls = match &source {
            ureq::Error::Rustls(err) => Some(err),
            ureq::Error::Io(err) => err
                .get_ref()
                .and_then(|e| e.downcast_ref::<rustls::Error>()),
            _ => None,
        };
        let what = match tls {
            Some(rustls::Error::InvalidCertificate(why)) => self.certificate_problem(why),
            Some(rustls::Error::InvalidMessage(_)) => {
                "the server does not speak TLS on that port (is it serving plaintext?)".to_owned()
            }
            Some(other) => other.to_string(),
            None if matches!(source, ureq::Error::Protocol(_))
                && self.server.starts_with("http://") =>
            {
                return CallError::NotHttp {
                    server: self.server.clone(),
                    source,
                };
            }
            None => {
                return CallError::Transport {
                    server: self.server.clone(),
                    source,
                };
            }
        };
        CallError::Tls {
            server: self.server.clone(),
            what,
        }
    }

    fn certificate_problem(&self, why: &CertificateError) -> String {
        let trusted = match &self.trust {
            Trust::Ca(path) => format!("the CA in {}", path.display()),
            Trust::System => "any of the system's root CAs".to_owned(),
        };
        let hint = match &self.trust {
            Trust::Ca(_) => "",
            Trust::System => ": give the CA that issued it with --ca FILE (or SPILLWAY_CA)",
        };
        match why {
            CertificateError::UnknownIssuer => format!(
                "the server's certificate does not chain to {trusted} (unknown issuer){hint}"
            ),
            // Found by name, refused by key: another CA of the same name (two development
            // CAs of one trust domain have the same subject).
            CertificateError::BadSignature => format!(
                "the server's certificate does not chain to {trusted} (its issuer has the \
                 name of a trusted CA but not its key: another CA of the same name?){hint}"
            ),
            other => format!("the server's certificate is refused: {other}"),
        }
    }

    /// Sends a request; `if_match` goes in the `if-match` header.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        if_match: Option<&str>,
    ) -> Result<RulesResponse, CallError> {
        let url = format!("{}{path}", self.server);
        let mut request = ureq::http::Request::builder().method(method).uri(&url);
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(tag) = if_match {
            request = request.header("if-match", tag);
        }
        let transport = |source| self.transport(source);
        let response = match body {
            Some(text) => {
                let request = request
                    .header("content-type", "application/json")
                    .body(text.to_owned())
                    .map_err(|e| CallError::Body(e.to_string()))?;
                self.agent.run(request)
            }
            None => {
                let request = request
                    .body(())
                    .map_err(|e| CallError::Body(e.to_string()))?;
                self.agent.run(request)
            }
        }
        .map_err(transport)?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = response.status().as_u16();
        let etag = header("etag");
        let retry_after = header("retry-after");
        let content_type = header("content-type");
        let link = header("link");
        let text = response
            .into_body()
            .read_to_string()
            .map_err(|e| CallError::Body(e.to_string()))?;
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        Ok(RulesResponse {
            status,
            etag,
            retry_after,
            content_type,
            link,
            body,
        })
    }

    pub fn get(&self, path: &str) -> Result<RulesResponse, CallError> {
        self.send("GET", path, None, None)
    }

    pub fn post(&self, path: &str, body: &str) -> Result<RulesResponse, CallError> {
        self.send("POST", path, Some(body), None)
    }

    /// `GET /v1/rules`: the live rules, of one service or of all.
    pub fn rules(&self, service: Option<&str>) -> Result<Vec<Rule>, CallError> {
        let path = match service {
            Some(service) => format!(
                "/v1/rules?{}",
                form_urlencoded::Serializer::new(String::new())
                    .append_pair("service", service)
                    .finish()
            ),
            None => "/v1/rules".to_owned(),
        };
        typed(self.get(&path)?.ok()?)
    }

    /// `POST /v1/rules`: the rule as created.
    pub fn create_rule(&self, rule: &RuleBody) -> Result<Rule, CallError> {
        typed(self.post("/v1/rules", &body_text(rule)?)?.ok()?)
    }

    /// `PUT /v1/rules/{id}` of the rule read at `version`: refused (412) if it changed since.
    pub fn replace_rule(&self, id: &str, version: i64, rule: &RuleBody) -> Result<Rule, CallError> {
        let path = format!("/v1/rules/{}", path_segment(id));
        let answer = self.send(
            "PUT",
            &path,
            Some(&body_text(rule)?),
            Some(&format!("\"{version}\"")),
        )?;
        typed(answer.ok()?)
    }
}

/// A rule as the JSON text of a request.
fn body_text(rule: &RuleBody) -> Result<String, CallError> {
    serde_json::to_string(rule).map_err(|e| CallError::Encode(e.to_string()))
}

/// An answer's body as the type it should be.
fn typed<T: DeserializeOwned>(answer: RulesResponse) -> Result<T, CallError> {
    serde_json::from_value(answer.body).map_err(|e| CallError::Unexpected(e.to_string()))
}

/// One segment of a URL's path, percent-encoded.
fn path_segment(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// The CA certificates of a PEM file, each checked to be one a server's chain can lead to.
fn read_ca(path: &Path) -> Result<Vec<Certificate<'static>>, TrustError> {
    let pem = |what: String| TrustError::Pem {
        path: path.to_owned(),
        what,
    };
    let bytes = std::fs::read(path).map_err(|source| TrustError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(pem("holds no CERTIFICATE block".to_owned()));
    }
    let mut store = RootCertStore::empty();
    for cert in &certs {
        store
            .add(cert.clone())
            .map_err(|e| pem(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(certs
        .iter()
        .map(|cert| Certificate::from_der(cert.as_ref()).to_owned())
        .collect())
}

/// Whether a bearer token sent to `server` crosses a network in plaintext: an `http://` URL
/// whose host is not loopback (`localhost`, `127.0.0.0/8`, `::1`). `0.0.0.0` is not loopback.
pub fn plaintext_off_loopback(server: &str) -> bool {
    let Ok(uri) = server.parse::<ureq::http::Uri>() else {
        return false;
    };
    if !uri
        .scheme_str()
        .is_some_and(|s| s.eq_ignore_ascii_case("http"))
    {
        return false;
    }
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback());
    !loopback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_http_off_loopback_is_plaintext_on_a_network() {
        for server in [
            "http://127.0.0.1:7070",
            "http://127.8.9.10",
            "http://localhost:7070/",
            "http://LOCALHOST",
            "http://[::1]:7070",
            "http://[::ffff:127.0.0.1]:7070",
            "https://rules.example:7070",
            "https://10.0.0.5",
        ] {
            assert!(!plaintext_off_loopback(server), "{server}");
        }
        for server in [
            "http://0.0.0.0:7070",
            "http://10.0.0.5:7070",
            "http://rules.example",
            "http://[2001:db8::1]:7070",
            "HTTP://10.0.0.5",
        ] {
            assert!(plaintext_off_loopback(server), "{server}");
        }
    }

    #[test]
    fn a_ca_file_is_checked_when_the_client_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = RulesClient::with_ca("https://127.0.0.1:1", None, &missing)
            .err()
            .unwrap();
        assert!(
            err.to_string()
                .contains("missing.pem: cannot read the CA file"),
            "{err}"
        );

        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let err = RulesClient::with_ca("https://127.0.0.1:1", None, &empty)
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("holds no CERTIFICATE block"),
            "{err}"
        );

        let err = RulesClient::with_ca("http://10.0.0.5:7070", None, &empty)
            .err()
            .unwrap();
        assert!(matches!(err, TrustError::NotHttps { .. }), "{err}");
    }
}
