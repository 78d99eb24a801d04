//! What every long-running role checks of its transport flags before it starts:
//! the certificate files load, the certificate names the role the process runs as (and fills in
//! the `--region`, `--zone` and `--host-id` left out), plaintext listens on loopback only unless
//! `--insecure-plaintext`, and an admin port off loopback has a token. Each failure is a usage
//! error (exit 2) that says which flag to give.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use spillway_net::admin::{AdminAuth, AdminToken, check_exposure};
use spillway_tls::{Identity, TlsFiles, TlsSource, WorkloadRole};

use crate::args::TlsArgs;

/// The process's certificate files, read once here (a missing or broken file stops the start,
/// naming it), and its identity.
pub fn load(args: &TlsArgs) -> Result<Option<(Arc<TlsSource>, Identity)>, String> {
    let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca) else {
        return Ok(None);
    };
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        ca: Some(ca.clone()),
    };
    let source = TlsSource::load(files, &args.trust_domain).map_err(|e| e.to_string())?;
    let identity = source.identity().map_err(|e| e.to_string())?;
    Ok(Some((source, identity)))
}

/// Where the process runs: its region, zone and host as given, else as its certificate names
/// them; given and named, they must agree.
#[derive(Debug, Default, Clone)]
pub struct Place {
    pub region: Option<String>,
    pub zone: Option<String>,
    pub host: Option<String>,
}

impl Place {
    /// Checks `identity` is of `kind` and merges its place with the flags'.
    pub fn merge(self, identity: Option<&Identity>, kind: &str) -> Result<Place, String> {
        let Some(identity) = identity else {
            return Ok(self);
        };
        if identity.role.kind() != kind {
            return Err(format!(
                "--tls-cert names {identity}, {} {}'s identity; this is {} {kind} (issue it one with `spillway certs issue --role {kind}`)",
                article(identity.role.kind()),
                identity.role.kind(),
                article(kind)
            ));
        }
        let agree = |flag: &str, given: Option<String>, named: Option<&str>| match (given, named) {
            (Some(given), Some(named)) if given != named => Err(format!(
                "{flag} {given} disagrees with the certificate, which names {identity}; leave {flag} out or give {named}"
            )),
            (given, named) => Ok(given.or_else(|| named.map(str::to_owned))),
        };
        let (zone, host) = match &identity.role {
            WorkloadRole::Proxy { zone, host, .. } => (Some(zone.as_str()), Some(host.as_str())),
            WorkloadRole::Aggregator { zone, .. } => (Some(zone.as_str()), None),
            WorkloadRole::Controller { .. } => (None, None),
        };
        Ok(Place {
            region: agree("--region", self.region, Some(identity.role.region()))?,
            zone: agree("--zone", self.zone, zone)?,
            host: agree("--host-id", self.host, host)?,
        })
    }
}

/// `a` or `an` before a role's name.
fn article(kind: &str) -> &'static str {
    if kind.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// What a role starts with once its transport flags are checked: its certificate files, where it
/// runs (the flags' place merged with the certificate's), and its admin port's protection.
pub struct Transport {
    pub tls: Option<Arc<TlsSource>>,
    pub place: Place,
    pub admin: AdminAuth,
}

/// Checks a role's transport flags: the certificate loads and names a `kind` that agrees with
/// `place`; the control-plane `listen` address (if the role has one) is loopback unless TLS or
/// `--insecure-plaintext`; the admin port is protected as [`admin`] says.
pub fn role(
    kind: &str,
    place: Place,
    listen: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    token_file: Option<&Path>,
    args: &TlsArgs,
) -> Result<Transport, String> {
    let loaded = load(args)?;
    let place = place.merge(loaded.as_ref().map(|(_, id)| id), kind)?;
    let tls = loaded.map(|(source, _)| source);
    if let Some(listen) = listen {
        control_listener(listen, tls.is_some(), args)?;
    }
    let admin = admin(admin_addr, token_file, tls.as_ref(), args)?;
    Ok(Transport { tls, place, admin })
}

/// A control-plane listener without TLS binds loopback only, unless `--insecure-plaintext`
/// (then a warning at every start).
pub fn control_listener(addr: SocketAddr, tls: bool, args: &TlsArgs) -> Result<(), String> {
    plaintext_off_loopback(addr, tls, args, "--listen", "reports and instructions")
}

/// The RLS listener without TLS binds loopback only, for an Envoy beside the
/// process, unless `--insecure-plaintext`.
pub fn rls_listener(addr: SocketAddr, tls: bool, args: &TlsArgs) -> Result<(), String> {
    super::needs_feature("rls", "--rls-listen")?;
    plaintext_off_loopback(addr, tls, args, "--rls-listen", "rate-limit decisions")
}

/// `spillway rls --listen`, the same rule as [`rls_listener`].
#[cfg(feature = "rls")]
pub fn rls_service_listener(addr: SocketAddr, tls: bool, args: &TlsArgs) -> Result<(), String> {
    plaintext_off_loopback(addr, tls, args, "--listen", "rate-limit decisions")
}

/// The RLQS listener, likewise: loopback only without TLS, unless
/// `--insecure-plaintext`.
pub fn rlqs_listener(addr: SocketAddr, tls: bool, args: &TlsArgs) -> Result<(), String> {
    super::needs_feature("rls", "--rlqs-listen")?;
    plaintext_off_loopback(
        addr,
        tls,
        args,
        "--rlqs-listen",
        "usage reports and quota assignments",
    )
}

fn plaintext_off_loopback(
    addr: SocketAddr,
    tls: bool,
    args: &TlsArgs,
    flag: &str,
    what: &str,
) -> Result<(), String> {
    if tls || addr.ip().is_loopback() {
        return Ok(());
    }
    if args.insecure_plaintext {
        tracing::warn!(
            %addr,
            "{flag} {addr} is not loopback and has no TLS (--insecure-plaintext): anyone who can reach it can send and read {what}"
        );
        return Ok(());
    }
    Err(format!(
        "{flag} {addr} is not a loopback address: give --tls-cert, --tls-key and --tls-ca for mutual TLS, or --insecure-plaintext on a trusted network"
    ))
}

/// The admin port's protection: server TLS with the process's certificate when it has one, and
/// the bearer token of `--admin-token-file`, which a port off loopback must have.
pub fn admin(
    addr: Option<SocketAddr>,
    token_file: Option<&Path>,
    tls: Option<&Arc<TlsSource>>,
    args: &TlsArgs,
) -> Result<AdminAuth, String> {
    let token = token_file
        .map(AdminToken::from_file)
        .transpose()
        .map_err(|e| e.to_string())?;
    let auth = AdminAuth {
        tls: tls.cloned(),
        token,
    };
    if let Some(addr) = addr {
        check_exposure(addr, &auth)?;
        plaintext_off_loopback(addr, tls.is_some(), args, "--admin", "bearer tokens")?;
    }
    Ok(auth)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> Identity {
        Identity::parse(
            "spiffe://spillway.local/spillway/proxy/eu/eu-a/h1",
            "spillway.local",
        )
        .unwrap()
    }

    #[test]
    fn the_certificate_fills_in_what_the_flags_leave_out() {
        let place = Place::default().merge(Some(&proxy()), "proxy").unwrap();
        assert_eq!(place.region.as_deref(), Some("eu"));
        assert_eq!(place.zone.as_deref(), Some("eu-a"));
        assert_eq!(place.host.as_deref(), Some("h1"));
    }

    #[test]
    fn flags_that_disagree_with_the_certificate_are_refused() {
        let given = Place {
            zone: Some("eu-b".into()),
            ..Place::default()
        };
        let err = given.merge(Some(&proxy()), "proxy").unwrap_err();
        assert!(err.contains("--zone eu-b disagrees"), "{err}");
        let err = Place::default()
            .merge(Some(&proxy()), "aggregator")
            .unwrap_err();
        assert!(err.contains("--role aggregator"), "{err}");
    }

    #[test]
    fn plaintext_binds_loopback_only_unless_asked() {
        let args = TlsArgs {
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            trust_domain: "spillway.local".into(),
            insecure_plaintext: false,
        };
        assert!(control_listener("127.0.0.1:7001".parse().unwrap(), false, &args).is_ok());
        assert!(control_listener("[::1]:7001".parse().unwrap(), false, &args).is_ok());
        let err = control_listener("0.0.0.0:7001".parse().unwrap(), false, &args).unwrap_err();
        assert!(err.contains("--insecure-plaintext"), "{err}");
        assert!(control_listener("0.0.0.0:7001".parse().unwrap(), true, &args).is_ok());
        let insecure = TlsArgs {
            insecure_plaintext: true,
            ..args
        };
        assert!(control_listener("0.0.0.0:7001".parse().unwrap(), false, &insecure).is_ok());
    }
}
