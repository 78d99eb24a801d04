//! Certificate files, re-read when they change (rotation without restart).
//!
//! A [`TlsSource`] holds the PEM files of one process: its certificate chain, its key and, for
//! mutual TLS, the CA its peers' certificates must chain to. Every new connection asks it for a
//! configuration; it looks at the files' modification times and sizes first (three `stat`s, a
//! few microseconds, on a path that runs once per connection) and re-reads them when one
//! changed. A half-written or broken file keeps the material in force and logs why, so a
//! rotation that goes wrong never takes the control plane down; connections already open keep
//! the session they have.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::identity::{Identity, IdentityError};

/// The PEM files of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The process's certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA that peers' certificates must chain to; `None` for a server-only listener (an
    /// admin port, the rules service) whose clients present no certificate.
    pub ca: Option<PathBuf>,
}

/// Why certificate files cannot be used; each names the file and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: cannot read: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {what}", .path.display())]
    Pem { path: PathBuf, what: String },
    #[error("{}: {source}", .path.display())]
    Identity {
        path: PathBuf,
        #[source]
        source: IdentityError,
    },
    #[error("{}: the key does not belong to the certificate in {}", .key.display(), .cert.display())]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// What the files held when they were last read.
#[derive(Debug)]
pub struct Material {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub roots: Option<Arc<RootCertStore>>,
    /// The leaf's URI SANs.
    pub uris: Vec<String>,
}

type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// The crypto provider of every TLS link: ring.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A process's certificate files and the material last read from them.
#[derive(Debug)]
pub struct TlsSource {
    files: TlsFiles,
    trust_domain: String,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    stamps: [Stamp; 3],
    material: Arc<Material>,
    generation: u64,
}

impl TlsSource {
    /// Reads the files once: an error here (a missing file, no certificate, a key of another
    /// certificate) stops the process at start, with the file's name.
    pub fn load(files: TlsFiles, trust_domain: &str) -> Result<Arc<Self>, TlsError> {
        let provider = provider();
        let stamps = stamps(&files);
        let material = read(&files, &provider)?;
        Ok(Arc::new(Self {
            files,
            trust_domain: trust_domain.to_owned(),
            provider,
            state: Mutex::new(State {
                stamps,
                material: Arc::new(material),
                generation: 0,
            }),
        }))
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub(crate) fn crypto(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    /// The process's own identity, from its certificate's URI SANs.
    pub fn identity(&self) -> Result<Identity, TlsError> {
        let material = self.material();
        Identity::from_uris(&material.uris, &self.trust_domain).map_err(|source| {
            TlsError::Identity {
                path: self.files.cert.clone(),
                source,
            }
        })
    }

    /// The material in force, re-read first if a file changed since the last look.
    pub fn material(&self) -> Arc<Material> {
        self.refresh().0
    }

    /// How many times the files were re-read successfully since the start.
    pub fn generation(&self) -> u64 {
        self.refresh().1
    }

    fn refresh(&self) -> (Arc<Material>, u64) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = stamps(&self.files);
        if now != state.stamps {
            state.stamps = now;
            match read(&self.files, &self.provider) {
                Ok(material) => {
                    state.material = Arc::new(material);
                    state.generation += 1;
                    tracing::info!(
                        cert = %self.files.cert.display(),
                        "certificate files changed; new connections use the new certificate"
                    );
                }
                Err(err) => tracing::warn!(
                    "certificate files changed but cannot be used, keeping the previous ones: {err}"
                ),
            }
        }
        (state.material.clone(), state.generation)
    }
}

fn stamps(files: &TlsFiles) -> [Stamp; 3] {
    [
        stamp(&files.cert),
        stamp(&files.key),
        files.ca.as_deref().and_then(stamp),
    ]
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_bytes(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "holds no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn read(files: &TlsFiles, provider: &CryptoProvider) -> Result<Material, TlsError> {
    let chain = certificates(&files.cert)?;
    let key_bytes = read_bytes(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| TlsError::Pem {
        path: files.key.clone(),
        what: format!("no usable private key: {e}"),
    })?;
    let signing = provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|e| TlsError::Pem {
            path: files.key.clone(),
            what: format!("unsupported private key: {e}"),
        })?;
    let certified = rustls::sign::CertifiedKey::new(chain.clone(), signing);
    if certified.keys_match().is_err() {
        return Err(TlsError::KeyMismatch {
            cert: files.cert.clone(),
            key: files.key.clone(),
        });
    }
    let uris = uri_sans(&chain[0]).map_err(|what| TlsError::Pem {
        path: files.cert.clone(),
        what,
    })?;
    let roots = match &files.ca {
        None => None,
        Some(path) => {
            let mut store = RootCertStore::empty();
            for cert in certificates(path)? {
                store.add(cert).map_err(|e| TlsError::Pem {
                    path: path.clone(),
                    what: format!("not a usable CA certificate: {e}"),
                })?;
            }
            Some(Arc::new(store))
        }
    };
    Ok(Material {
        chain,
        key,
        roots,
        uris,
    })
}

/// The URI SANs of a DER certificate.
pub fn uri_sans(cert: &CertificateDer<'_>) -> Result<Vec<String>, String> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|e| format!("unreadable subjectAltName: {e}"))?;
    Ok(san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::URI(uri) => Some((*uri).to_owned()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default())
}
