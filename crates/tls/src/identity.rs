//! Who is on the other end of a control-plane link: SPIFFE IDs under a trust domain.
//!
//! ```text
//! spiffe://T/spillway/proxy/REGION/ZONE/HOST
//! spiffe://T/spillway/aggregator/REGION/ZONE
//! spiffe://T/spillway/controller/REGION
//! ```
//!
//! A certificate names its holder in a URI SAN; [`Identity::from_uris`] finds the one under the
//! trust domain. The mesh's own identities (`spiffe://cluster.local/ns/NS/sa/SA`, Envoy's) are
//! not roles of Spillway: listeners that serve them admit them by [`SanPolicy`] patterns.

use std::fmt;

/// The trust domain when none is given.
pub const DEFAULT_TRUST_DOMAIN: &str = "spillway.local";

/// A role of the control plane, with where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WorkloadRole {
    Proxy {
        region: String,
        zone: String,
        host: String,
    },
    Aggregator {
        region: String,
        zone: String,
    },
    Controller {
        region: String,
    },
}

impl WorkloadRole {
    /// `proxy`, `aggregator` or `controller`.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkloadRole::Proxy { .. } => "proxy",
            WorkloadRole::Aggregator { .. } => "aggregator",
            WorkloadRole::Controller { .. } => "controller",
        }
    }

    pub fn region(&self) -> &str {
        match self {
            WorkloadRole::Proxy { region, .. }
            | WorkloadRole::Aggregator { region, .. }
            | WorkloadRole::Controller { region } => region,
        }
    }

    pub fn zone(&self) -> Option<&str> {
        match self {
            WorkloadRole::Proxy { zone, .. } | WorkloadRole::Aggregator { zone, .. } => Some(zone),
            WorkloadRole::Controller { .. } => None,
        }
    }

    pub fn host(&self) -> Option<&str> {
        match self {
            WorkloadRole::Proxy { host, .. } => Some(host),
            _ => None,
        }
    }
}

/// A Spillway identity: a role under a trust domain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub trust_domain: String,
    pub role: WorkloadRole,
}

/// Why a URI is not a Spillway identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("\"{0}\" is not a spiffe:// URI")]
    NotSpiffe(String),
    #[error("\"{uri}\" is under trust domain \"{found}\", not \"{expected}\"")]
    TrustDomain {
        uri: String,
        found: String,
        expected: String,
    },
    #[error(
        "\"{0}\" is not a Spillway identity; expected spiffe://T/spillway/proxy/REGION/ZONE/HOST, \
         .../aggregator/REGION/ZONE or .../controller/REGION"
    )]
    Shape(String),
    #[error("\"{uri}\" has an invalid path segment \"{segment}\" (letters, digits, '.', '-', '_')")]
    Segment { uri: String, segment: String },
    #[error("the certificate names no Spillway identity under trust domain \"{0}\"")]
    Missing(String),
}

/// Whether `segment` may be a SPIFFE path segment (letters, digits, `.`, `-`, `_`; not `.` or
/// `..`).
pub fn valid_segment(segment: &str) -> bool {
    !segment.is_empty()
        && segment != "."
        && segment != ".."
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

impl Identity {
    pub fn new(trust_domain: &str, role: WorkloadRole) -> Self {
        Self {
            trust_domain: trust_domain.to_owned(),
            role,
        }
    }

    /// Parses `uri` as an identity under `trust_domain`.
    pub fn parse(uri: &str, trust_domain: &str) -> Result<Self, IdentityError> {
        let rest = uri
            .strip_prefix("spiffe://")
            .ok_or_else(|| IdentityError::NotSpiffe(uri.to_owned()))?;
        let (domain, path) = rest.split_once('/').unwrap_or((rest, ""));
        if !domain.eq_ignore_ascii_case(trust_domain) {
            return Err(IdentityError::TrustDomain {
                uri: uri.to_owned(),
                found: domain.to_owned(),
                expected: trust_domain.to_owned(),
            });
        }
        let segments: Vec<&str> = path.split('/').collect();
        if let Some(bad) = segments.iter().find(|s| !valid_segment(s)) {
            return Err(IdentityError::Segment {
                uri: uri.to_owned(),
                segment: (*bad).to_owned(),
            });
        }
        let role = match segments.as_slice() {
            ["spillway", "proxy", region, zone, host] => WorkloadRole::Proxy {
                region: (*region).to_owned(),
                zone: (*zone).to_owned(),
                host: (*host).to_owned(),
            },
            ["spillway", "aggregator", region, zone] => WorkloadRole::Aggregator {
                region: (*region).to_owned(),
                zone: (*zone).to_owned(),
            },
            ["spillway", "controller", region] => WorkloadRole::Controller {
                region: (*region).to_owned(),
            },
            _ => return Err(IdentityError::Shape(uri.to_owned())),
        };
        Ok(Self {
            trust_domain: domain.to_ascii_lowercase(),
            role,
        })
    }

    /// The first of a certificate's URI SANs that is an identity under `trust_domain`.
    pub fn from_uris<S: AsRef<str>>(uris: &[S], trust_domain: &str) -> Result<Self, IdentityError> {
        let mut first_error = None;
        for uri in uris {
            match Self::parse(uri.as_ref(), trust_domain) {
                Ok(identity) => return Ok(identity),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        Err(match first_error {
            Some(IdentityError::NotSpiffe(_)) | None => {
                IdentityError::Missing(trust_domain.to_owned())
            }
            Some(err) => err,
        })
    }

    /// The SPIFFE ID.
    pub fn uri(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spiffe://{}/spillway/", self.trust_domain)?;
        match &self.role {
            WorkloadRole::Proxy { region, zone, host } => write!(f, "proxy/{region}/{zone}/{host}"),
            WorkloadRole::Aggregator { region, zone } => write!(f, "aggregator/{region}/{zone}"),
            WorkloadRole::Controller { region } => write!(f, "controller/{region}"),
        }
    }
}

/// URI SAN patterns a listener admits (`--allow-client-san`): `*` matches any run of
/// characters within one path segment, `**` any run across segments; anything else matches
/// itself. An empty policy admits every certificate that chains to the CA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SanPolicy {
    patterns: Vec<String>,
}

impl SanPolicy {
    pub fn new<I: IntoIterator<Item = String>>(patterns: I) -> Self {
        Self {
            patterns: patterns.into_iter().collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether any of `uris` matches any pattern (or the policy is empty).
    pub fn allows<S: AsRef<str>>(&self, uris: &[S]) -> bool {
        self.patterns.is_empty()
            || uris.iter().any(|uri| {
                self.patterns
                    .iter()
                    .any(|p| glob(p.as_bytes(), uri.as_ref().as_bytes()))
            })
    }
}

fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern {
        [] => text.is_empty(),
        [b'*', b'*', rest @ ..] => (0..=text.len()).any(|i| glob(rest, &text[i..])),
        [b'*', rest @ ..] => {
            let segment = text.iter().position(|&b| b == b'/').unwrap_or(text.len());
            (0..=segment).any(|i| glob(rest, &text[i..]))
        }
        [c, rest @ ..] => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_role_parses_and_prints_back() {
        for uri in [
            "spiffe://spillway.local/spillway/proxy/eu/eu-a/host-1",
            "spiffe://spillway.local/spillway/aggregator/eu/eu-a",
            "spiffe://spillway.local/spillway/controller/eu",
        ] {
            let id = Identity::parse(uri, DEFAULT_TRUST_DOMAIN).unwrap();
            assert_eq!(id.uri(), uri);
        }
        let id = Identity::parse(
            "spiffe://spillway.local/spillway/proxy/eu/eu-a/h1",
            "spillway.local",
        )
        .unwrap();
        assert_eq!(id.role.host(), Some("h1"));
        assert_eq!(id.role.zone(), Some("eu-a"));
        assert_eq!(id.role.region(), "eu");
    }

    #[test]
    fn other_domains_shapes_and_segments_are_refused_with_the_reason() {
        let err =
            Identity::parse("spiffe://other/spillway/controller/eu", "spillway.local").unwrap_err();
        assert!(err.to_string().contains("\"other\""), "{err}");
        for bad in [
            "spiffe://spillway.local/spillway/controller",
            "spiffe://spillway.local/spillway/proxy/eu/a",
            "spiffe://spillway.local/spillway/admin/eu",
            "spiffe://spillway.local/other/controller/eu",
        ] {
            let err = Identity::parse(bad, "spillway.local").unwrap_err();
            assert!(matches!(err, IdentityError::Shape(_)), "{bad}: {err}");
        }
        for bad in [
            "spiffe://spillway.local/spillway/controller/../eu",
            "spiffe://spillway.local/spillway/controller/e%75",
            "spiffe://spillway.local/spillway/controller/",
        ] {
            assert!(
                matches!(
                    Identity::parse(bad, "spillway.local"),
                    Err(IdentityError::Segment { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            Identity::parse("https://x", "spillway.local"),
            Err(IdentityError::NotSpiffe(_))
        ));
    }

    #[test]
    fn the_identity_among_several_sans_is_found() {
        let uris = [
            "https://example.com",
            "spiffe://cluster.local/ns/a/sa/b",
            "spiffe://spillway.local/spillway/controller/us",
        ];
        let id = Identity::from_uris(&uris, "spillway.local").unwrap();
        assert_eq!(
            id.role,
            WorkloadRole::Controller {
                region: "us".into()
            }
        );
        assert!(matches!(
            Identity::from_uris(&["https://example.com"], "spillway.local"),
            Err(IdentityError::Missing(_))
        ));
    }

    #[test]
    fn san_patterns_match_within_and_across_segments() {
        let policy = SanPolicy::new(["spiffe://cluster.local/ns/*/sa/envoy".to_owned()]);
        assert!(policy.allows(&["spiffe://cluster.local/ns/shop/sa/envoy"]));
        assert!(!policy.allows(&["spiffe://cluster.local/ns/shop/x/sa/envoy"]));
        assert!(!policy.allows(&["spiffe://cluster.local/ns/shop/sa/envoy2"]));
        let deep = SanPolicy::new(["spiffe://cluster.local/**".to_owned()]);
        assert!(deep.allows(&["spiffe://cluster.local/ns/shop/sa/envoy"]));
        assert!(!deep.allows(&["spiffe://other.local/ns/shop/sa/envoy"]));
        assert!(SanPolicy::default().allows::<&str>(&[]));
        assert!(!policy.allows::<&str>(&[]));
    }
}
