//! `spillway certs init|issue`: a development PKI, so a TLS deployment takes a few
//! commands. Production uses the operator's PKI; any CA and leaves with the same URI SANs work.

use std::process::ExitCode;

use spillway_tls::certs::{self, Leaf, LeafRole};

use crate::args::{CertRole, CertsCommand};

pub fn certs(command: CertsCommand) -> ExitCode {
    match run(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("spillway certs: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(command: CertsCommand) -> Result<(), String> {
    match command {
        CertsCommand::Init {
            out,
            trust_domain,
            force,
        } => {
            if !spillway_tls::identity::valid_segment(&trust_domain) {
                return Err(format!(
                    "--trust-domain \"{trust_domain}\" is not a valid trust domain (letters, digits, '.', '-', '_')"
                ));
            }
            certs::init(&out, &trust_domain, force).map_err(|e| e.to_string())?;
            println!(
                "CA for trust domain {trust_domain}: {} and {} (keep the key private)",
                out.join("ca.pem").display(),
                out.join("ca.key").display()
            );
            Ok(())
        }
        CertsCommand::Issue {
            ca,
            role,
            region,
            zone,
            host,
            names,
            days,
            hosts,
            host_prefix,
            out,
            force,
        } => {
            let trust_domain = certs::ca_trust_domain(&ca.join("ca.pem"))
                .map_err(|e| e.to_string())?
                .unwrap_or_else(|| spillway_tls::DEFAULT_TRUST_DOMAIN.to_owned());
            if days < 1 {
                return Err(format!("--days {days}: a leaf is valid for at least a day"));
            }
            if let Some(hosts) = hosts {
                if role != CertRole::Proxy {
                    return Err(
                        "--hosts issues proxy leaves, one per host: give --role proxy".into(),
                    );
                }
                return issue_hosts(
                    &ca,
                    &trust_domain,
                    HostLeaves {
                        region,
                        zone,
                        names,
                        days,
                        hosts: hosts.get(),
                        prefix: host_prefix,
                    },
                    &out,
                    force,
                );
            }
            let leaf = Leaf {
                role: match role {
                    CertRole::Proxy => LeafRole::Proxy,
                    CertRole::Aggregator => LeafRole::Aggregator,
                    CertRole::Controller => LeafRole::Controller,
                    CertRole::Server => LeafRole::Server,
                },
                region,
                zone,
                host,
                names,
                days,
            };
            let identity =
                certs::issue(&ca, &trust_domain, &leaf, &out, force).map_err(|e| e.to_string())?;
            let who = identity.map_or_else(|| "a server certificate".to_owned(), |id| id.uri());
            println!(
                "{who}: {} {} {} (--tls-cert, --tls-key, --tls-ca)",
                out.join("cert.pem").display(),
                out.join("key.pem").display(),
                out.join("ca.pem").display()
            );
            Ok(())
        }
    }
}

/// What `certs issue --hosts N` issues: proxy leaves of one region and zone.
struct HostLeaves {
    region: Option<String>,
    zone: Option<String>,
    names: Vec<String>,
    days: i64,
    hosts: usize,
    prefix: String,
}

/// One proxy leaf per host `PREFIX-i` into `out/PREFIX-i/`.
fn issue_hosts(
    ca: &std::path::Path,
    trust_domain: &str,
    leaves: HostLeaves,
    out: &std::path::Path,
    force: bool,
) -> Result<(), String> {
    for i in 0..leaves.hosts {
        let host = format!("{}-{i}", leaves.prefix);
        let leaf = Leaf {
            role: LeafRole::Proxy,
            region: leaves.region.clone(),
            zone: leaves.zone.clone(),
            host: Some(host.clone()),
            names: leaves.names.clone(),
            days: leaves.days,
        };
        certs::issue(ca, trust_domain, &leaf, &out.join(&host), force)
            .map_err(|e| format!("host {host}: {e}"))?;
    }
    println!(
        "{} proxy leaves, {}-0 to {}-{}: {}/HOST/cert.pem, key.pem and ca.pem (spillway emulate --tls-dir {})",
        leaves.hosts,
        leaves.prefix,
        leaves.prefix,
        leaves.hosts - 1,
        out.display(),
        out.display()
    );
    Ok(())
}
