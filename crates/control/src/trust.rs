//! Who may speak to a control-plane server.
//!
//! With TLS, every connection has completed a mutual-TLS handshake against the process's CA, and
//! its certificate's SPIFFE identity decides what it may do:
//!
//! | listener   | stream      | accepted from                                                  |
//! |------------|-------------|----------------------------------------------------------------|
//! | aggregator | `Link`      | `proxy/REGION/ZONE/HOST` of its own region and zone, reporting as `HOST` only |
//! | controller | `LinkZone`  | `aggregator/REGION/ZONE` of its own region, summing `ZONE` only |
//! | controller | `Exchange`  | `controller/OTHER` of another region, announcing `OTHER` only  |
//!
//! Anything else is refused with `PERMISSION_DENIED` (a stream already open ends with it), logged
//! with the peer's name and counted in `spillway_control_plane_rejected_total{reason}`; a failed
//! handshake is counted as `handshake`. Without TLS a listener binds loopback only (the command
//! line sees to it) and trusts its callers, as a process trusts its own machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use spillway_tls::server::{OnReject, PeerInfo};
use spillway_tls::{Identity, TlsSource, WorkloadRole};
use tonic::{Request, Status};

/// Why a peer was refused: the `reason` label of `spillway_control_plane_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The TLS handshake failed: no certificate, another CA's, an expired one, not TLS at all.
    Handshake,
    /// The certificate chains to the CA but names no Spillway identity under the trust domain.
    Identity,
    /// A Spillway identity of the wrong role (a proxy at a controller, an aggregator as a peer).
    Role,
    /// The right role of another region (or, for a peer, of this one).
    Region,
    /// The right role of another zone.
    Zone,
    /// A proxy reporting under a host id other than its certificate's.
    HostId,
    /// An RLQS stream beyond the streams one host (a connection, or an identity with TLS) may
    /// hold open (`--rlqs-max-streams-per-host`).
    RlqsStreams,
    /// An RLQS bucket id beyond a stream's, a host's or the aggregator's cap
    /// (`--rlqs-max-buckets-per-host`, `--rlqs-max-buckets`).
    RlqsBuckets,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::Handshake,
        Reason::Identity,
        Reason::Role,
        Reason::Region,
        Reason::Zone,
        Reason::HostId,
        Reason::RlqsStreams,
        Reason::RlqsBuckets,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::Handshake => "handshake",
            Reason::Identity => "identity",
            Reason::Role => "role",
            Reason::Region => "region",
            Reason::Zone => "zone",
            Reason::HostId => "host_id",
            Reason::RlqsStreams => "rlqs_streams",
            Reason::RlqsBuckets => "rlqs_buckets",
        }
    }
}

/// A refusal: why, and what to tell the peer and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub message: String,
}

fn refuse(reason: Reason, message: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        message: message.into(),
    }
}

/// What a listener's peers may be: the rules of the table above, as pure functions of the
/// peer's identity and the server's own place.
pub mod rules {
    use super::*;

    /// A client of the aggregator of `region`/`zone`: a proxy of that zone; its host id.
    pub fn proxy_of(identity: &Identity, region: &str, zone: &str) -> Result<String, Refusal> {
        match &identity.role {
            WorkloadRole::Proxy {
                region: r,
                zone: z,
                host,
            } => {
                if r != region {
                    Err(refuse(
                        Reason::Region,
                        format!(
                            "{identity} is a proxy of region {r}; this aggregator serves region {region}"
                        ),
                    ))
                } else if z != zone {
                    Err(refuse(
                        Reason::Zone,
                        format!(
                            "{identity} is a proxy of zone {z}; this aggregator serves zone {zone}"
                        ),
                    ))
                } else {
                    Ok(host.clone())
                }
            }
            other => Err(refuse(
                Reason::Role,
                format!(
                    "{identity} is a{} {}; an aggregator accepts reports from proxies only",
                    if other.kind() == "aggregator" {
                        "n"
                    } else {
                        ""
                    },
                    other.kind()
                ),
            )),
        }
    }

    /// An aggregator streaming to the controller of `region`: its zone.
    pub fn aggregator_of(identity: &Identity, region: &str) -> Result<String, Refusal> {
        match &identity.role {
            WorkloadRole::Aggregator { region: r, zone } if r == region => Ok(zone.clone()),
            WorkloadRole::Aggregator { region: r, .. } => Err(refuse(
                Reason::Region,
                format!(
                    "{identity} is an aggregator of region {r}; this controller serves region {region}"
                ),
            )),
            other => Err(refuse(
                Reason::Role,
                format!(
                    "{identity} is a {} on the zone stream; a controller accepts zone sums from aggregators only",
                    other.kind()
                ),
            )),
        }
    }

    /// A peer of the controller of `region`: another region's controller; its region.
    pub fn peer_of(identity: &Identity, region: &str) -> Result<String, Refusal> {
        match &identity.role {
            WorkloadRole::Controller { region: r } if r != region => Ok(r.clone()),
            WorkloadRole::Controller { .. } => Err(refuse(
                Reason::Region,
                format!(
                    "{identity} is of this controller's own region {region}; peers are other regions' controllers"
                ),
            )),
            other => Err(refuse(
                Reason::Role,
                format!(
                    "{identity} is a{} {} posing as a peer; peers are other regions' controllers",
                    if other.kind() == "aggregator" {
                        "n"
                    } else {
                        ""
                    },
                    other.kind()
                ),
            )),
        }
    }
}

/// A server's trust: whether it speaks TLS, and the refusals it counted.
#[derive(Debug)]
pub struct Trust {
    tls: Option<Arc<TlsSource>>,
    rejected: [AtomicU64; Reason::ALL.len()],
    /// What this server is, for its log lines.
    who: &'static str,
    /// When a failed handshake was last logged (Unix ms), and how many went unlogged since.
    handshake_logged_ms: AtomicU64,
    handshakes_unlogged: AtomicU64,
}

/// Failed handshakes are logged at most once a second (a port scanner would otherwise fill the
/// log); the counter counts every one.
const HANDSHAKE_LOG_EVERY_MS: u64 = 1_000;

impl Trust {
    pub fn new(tls: Option<Arc<TlsSource>>, who: &'static str) -> Self {
        Self {
            tls,
            rejected: Default::default(),
            who,
            handshake_logged_ms: AtomicU64::new(0),
            handshakes_unlogged: AtomicU64::new(0),
        }
    }

    pub fn tls(&self) -> Option<&Arc<TlsSource>> {
        self.tls.as_ref()
    }

    /// The identity of a request's peer: `Ok(None)` without TLS (no authorization), and a
    /// refusal for a certificate that names no Spillway identity.
    pub fn peer<T>(&self, request: &Request<T>) -> Result<Option<(Identity, String)>, Status> {
        if self.tls.is_none() {
            return Ok(None);
        }
        let Some(info) = request.extensions().get::<PeerInfo>() else {
            // A TLS listener always hands its connections' peers on; nothing reaches here
            // without one, but refuse rather than trust if something ever does.
            return Err(self.reject(&refuse(Reason::Identity, "no peer certificate"), "a peer"));
        };
        match &info.identity {
            Some(identity) => Ok(Some((identity.clone(), info.name()))),
            None => Err(self.reject(
                &refuse(
                    Reason::Identity,
                    format!(
                        "the certificate names no Spillway identity (URI SANs: {})",
                        if info.uris.is_empty() {
                            "none".to_owned()
                        } else {
                            info.uris.join(", ")
                        }
                    ),
                ),
                &info.name(),
            )),
        }
    }

    /// Counts and logs `refusal` of `peer`, and gives the status it is answered with.
    pub fn reject(&self, refusal: &Refusal, peer: &str) -> Status {
        self.count(refusal.reason);
        tracing::warn!(
            peer = %peer,
            reason = refusal.reason.label(),
            "{} refused a control-plane peer: {}",
            self.who,
            refusal.message
        );
        Status::permission_denied(refusal.message.clone())
    }

    /// Counts a refusal that the caller answers and logs itself.
    pub fn count(&self, reason: Reason) {
        let index = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.rejected[index].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals so far, by reason.
    pub fn rejected(&self) -> impl Iterator<Item = (Reason, u64)> + '_ {
        Reason::ALL
            .iter()
            .zip(&self.rejected)
            .map(|(reason, n)| (*reason, n.load(Ordering::Relaxed)))
    }

    /// The listener's hook for failed handshakes: each counted, and logged with the peer's
    /// address and why at most once a second, with how many went unlogged in between.
    pub fn on_handshake_failure(self: &Arc<Self>) -> OnReject {
        let trust = self.clone();
        Arc::new(move |rejected| {
            trust.count(Reason::Handshake);
            let now = spillway_link::now_ms();
            let last = trust.handshake_logged_ms.load(Ordering::Relaxed);
            let due = now.saturating_sub(last) >= HANDSHAKE_LOG_EVERY_MS
                && trust
                    .handshake_logged_ms
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok();
            if !due {
                trust.handshakes_unlogged.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let unlogged = trust.handshakes_unlogged.swap(0, Ordering::Relaxed);
            tracing::warn!(
                peer = %rejected.remote,
                reason = "handshake",
                unlogged_since_last = unlogged,
                "{} refused a control-plane peer: the TLS handshake failed: {}",
                trust.who,
                rejected.error
            );
        })
    }

    /// The `spillway_control_plane_rejected` family for a registry.
    pub fn metric(
        &self,
    ) -> prometheus_client::metrics::family::Family<
        Vec<(&'static str, &'static str)>,
        prometheus_client::metrics::counter::Counter,
    > {
        let family = prometheus_client::metrics::family::Family::<
            Vec<(&'static str, &'static str)>,
            prometheus_client::metrics::counter::Counter,
        >::default();
        for (reason, n) in self.rejected() {
            family
                .get_or_create(&vec![("reason", reason.label())])
                .inc_by(n);
        }
        family
    }
}

/// Checks that the process's own certificate names `expected` (`--region`, `--zone`
/// and `--host-id`, given, must agree with the certificate).
pub fn own_identity(
    source: &TlsSource,
    check: impl FnOnce(&WorkloadRole) -> bool,
    expected: &str,
) -> Result<Identity, String> {
    let identity = source.identity().map_err(|e| e.to_string())?;
    if check(&identity.role) {
        Ok(identity)
    } else {
        Err(format!(
            "{}: the certificate names {identity}, but this process runs as {expected}",
            source.files().cert.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::rules::*;
    use super::*;

    fn id(uri: &str) -> Identity {
        Identity::parse(uri, "spillway.local").unwrap()
    }

    #[test]
    fn an_aggregator_accepts_only_proxies_of_its_zone() {
        let proxy = id("spiffe://spillway.local/spillway/proxy/eu/eu-a/h1");
        assert_eq!(proxy_of(&proxy, "eu", "eu-a").unwrap(), "h1");
        assert_eq!(
            proxy_of(&proxy, "eu", "eu-b").unwrap_err().reason,
            Reason::Zone
        );
        assert_eq!(
            proxy_of(&proxy, "us", "eu-a").unwrap_err().reason,
            Reason::Region
        );
        let aggregator = id("spiffe://spillway.local/spillway/aggregator/eu/eu-a");
        let refusal = proxy_of(&aggregator, "eu", "eu-a").unwrap_err();
        assert_eq!(refusal.reason, Reason::Role);
        assert!(
            refusal.message.contains("an aggregator"),
            "{}",
            refusal.message
        );
    }

    #[test]
    fn a_controller_accepts_aggregators_of_its_region_and_peers_of_others() {
        let aggregator = id("spiffe://spillway.local/spillway/aggregator/eu/eu-a");
        assert_eq!(aggregator_of(&aggregator, "eu").unwrap(), "eu-a");
        assert_eq!(
            aggregator_of(&aggregator, "us").unwrap_err().reason,
            Reason::Region
        );
        assert_eq!(peer_of(&aggregator, "us").unwrap_err().reason, Reason::Role);
        let controller = id("spiffe://spillway.local/spillway/controller/us");
        assert_eq!(peer_of(&controller, "eu").unwrap(), "us");
        assert_eq!(
            peer_of(&controller, "us").unwrap_err().reason,
            Reason::Region
        );
        assert_eq!(
            aggregator_of(&controller, "us").unwrap_err().reason,
            Reason::Role
        );
        let proxy = id("spiffe://spillway.local/spillway/proxy/eu/eu-a/h1");
        assert_eq!(
            aggregator_of(&proxy, "eu").unwrap_err().reason,
            Reason::Role
        );
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let trust = Trust::new(None, "test");
        let _ = trust.reject(&refuse(Reason::Zone, "x"), "p");
        let _ = trust.reject(&refuse(Reason::Zone, "x"), "p");
        let counts: Vec<_> = trust.rejected().filter(|(_, n)| *n > 0).collect();
        assert_eq!(counts, vec![(Reason::Zone, 2)]);
    }
}
