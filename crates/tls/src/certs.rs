//! A development PKI (`spillway certs init|issue`): a CA for a trust domain, and leaves
//! whose URI SAN is a Spillway identity. Production uses the operator's PKI (cert-manager,
//! SPIRE); any CA and leaves with the same SANs work the same way.
//!
//! ```text
//! DIR/ca.pem   the CA certificate (its URI SAN is spiffe://TRUST, which `issue` reads back)
//! DIR/ca.key   its key (mode 0600)
//! OUT/cert.pem OUT/key.pem OUT/ca.pem   a leaf, its key, and a copy of the CA for --tls-ca
//! ```

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use time::{Duration, OffsetDateTime};

use crate::identity::{Identity, WorkloadRole, valid_segment};

/// How long a development CA is valid.
pub const CA_DAYS: i64 = 3650;

/// Why a CA or a leaf could not be made; each says which file or value.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} already exists; pass --force to replace it", .0.display())]
    Exists(PathBuf),
    #[error("{what}: \"{value}\" is not a valid identity segment (letters, digits, '.', '-', '_')")]
    Segment { what: &'static str, value: String },
    #[error("--role {0} needs {1}")]
    Missing(&'static str, &'static str),
    #[error("{}: {what}", .path.display())]
    Ca { path: PathBuf, what: String },
    #[error("\"{0}\" is not a DNS name or an IP address")]
    Name(String),
    #[error("cannot make the certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// Which certificate to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafRole {
    Proxy,
    Aggregator,
    Controller,
    /// A server certificate with no Spillway identity (the rules service, an admin port).
    Server,
}

/// A leaf's request.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub role: LeafRole,
    pub region: Option<String>,
    pub zone: Option<String>,
    pub host: Option<String>,
    /// Extra DNS names and IP addresses, besides `localhost` and `127.0.0.1`.
    pub names: Vec<String>,
    pub days: i64,
}

impl Leaf {
    /// The identity the leaf will carry, checked.
    pub fn identity(&self, trust_domain: &str) -> Result<Option<Identity>, CertsError> {
        let need = |value: &Option<String>, role: &'static str, what: &'static str| {
            let value = value.clone().ok_or(CertsError::Missing(role, what))?;
            if valid_segment(&value) {
                Ok(value)
            } else {
                Err(CertsError::Segment { what, value })
            }
        };
        let role = match self.role {
            LeafRole::Server => return Ok(None),
            LeafRole::Controller => WorkloadRole::Controller {
                region: need(&self.region, "controller", "--region")?,
            },
            LeafRole::Aggregator => WorkloadRole::Aggregator {
                region: need(&self.region, "aggregator", "--region")?,
                zone: need(&self.zone, "aggregator", "--zone")?,
            },
            LeafRole::Proxy => WorkloadRole::Proxy {
                region: need(&self.region, "proxy", "--region")?,
                zone: need(&self.zone, "proxy", "--zone")?,
                host: need(&self.host, "proxy", "--host")?,
            },
        };
        Ok(Some(Identity::new(trust_domain, role)))
    }
}

fn serial() -> SerialNumber {
    let mut bytes = [0u8; 16];
    // A serial is positive: clear the top bit.
    getrandom::fill(&mut bytes).expect("the system's random source works");
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

fn write(path: &Path, contents: &str, secret: bool, force: bool) -> Result<(), CertsError> {
    let io = |source| CertsError::Io {
        path: path.to_owned(),
        source,
    };
    if path.exists() && !force {
        return Err(CertsError::Exists(path.to_owned()));
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let _ = secret;
    // Write beside and rename, so a process that re-reads the file never sees half of it.
    let temp = path.with_extension("tmp");
    let mut file = options.open(&temp).map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&temp, path).map_err(io)
}

/// Makes a CA for `trust_domain` in `dir`: `ca.pem` and `ca.key`.
pub fn init(dir: &Path, trust_domain: &str, force: bool) -> Result<(), CertsError> {
    std::fs::create_dir_all(dir).map_err(|source| CertsError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name.push(
        DnType::CommonName,
        format!("Spillway development CA ({trust_domain})"),
    );
    params.subject_alt_names = vec![SanType::URI(format!("spiffe://{trust_domain}").try_into()?)];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(CA_DAYS);
    params.serial_number = Some(serial());
    let cert = params.self_signed(&key)?;
    write(&dir.join("ca.pem"), &cert.pem(), false, force)?;
    write(&dir.join("ca.key"), &key.serialize_pem(), true, force)?;
    Ok(())
}

/// The trust domain a CA made by [`init`] names (its `spiffe://T` URI SAN).
pub fn ca_trust_domain(ca_pem: &Path) -> Result<Option<String>, CertsError> {
    let bytes = std::fs::read(ca_pem).map_err(|source| CertsError::Io {
        path: ca_pem.to_owned(),
        source,
    })?;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let cert = CertificateDer::from_pem_slice(&bytes).map_err(|e| CertsError::Ca {
        path: ca_pem.to_owned(),
        what: format!("not a PEM certificate: {e}"),
    })?;
    let uris = crate::files::uri_sans(&cert).map_err(|what| CertsError::Ca {
        path: ca_pem.to_owned(),
        what,
    })?;
    Ok(uris.iter().find_map(|u| {
        u.strip_prefix("spiffe://")
            .filter(|d| !d.is_empty() && !d.contains('/'))
            .map(str::to_owned)
    }))
}

/// Issues `leaf` from the CA in `ca_dir` into `out`: `cert.pem`, `key.pem` and `ca.pem`.
/// Returns the identity written into it.
pub fn issue(
    ca_dir: &Path,
    trust_domain: &str,
    leaf: &Leaf,
    out: &Path,
    force: bool,
) -> Result<Option<Identity>, CertsError> {
    let identity = leaf.identity(trust_domain)?;
    let read = |name: &str| {
        let path = ca_dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| CertsError::Io { path, source })
    };
    let ca_pem = read("ca.pem")?;
    let ca_key = KeyPair::from_pem(&read("ca.key")?).map_err(|e| CertsError::Ca {
        path: ca_dir.join("ca.key"),
        what: e.to_string(),
    })?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(|e| CertsError::Ca {
        path: ca_dir.join("ca.pem"),
        what: e.to_string(),
    })?;

    let mut params = CertificateParams::default();
    let mut sans = Vec::new();
    if let Some(identity) = &identity {
        sans.push(SanType::URI(identity.uri().try_into()?));
        params
            .distinguished_name
            .push(DnType::CommonName, identity.uri());
    } else {
        params
            .distinguished_name
            .push(DnType::CommonName, "Spillway server");
    }
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    names.extend(leaf.names.iter().cloned());
    for name in names {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                name.clone()
                    .try_into()
                    .map_err(|_| CertsError::Name(name.clone()))?,
            ),
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    params.subject_alt_names = sans;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(leaf.days.max(1));
    params.serial_number = Some(serial());
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    std::fs::create_dir_all(out).map_err(|source| CertsError::Io {
        path: out.to_owned(),
        source,
    })?;
    write(&out.join("cert.pem"), &cert.pem(), false, force)?;
    write(&out.join("key.pem"), &key.serialize_pem(), true, force)?;
    write(&out.join("ca.pem"), &ca_pem, false, true)?;
    Ok(identity)
}
