//! Where request attributes come from (SPEC §2 `identity`): headers, the path or the peer, the
//! first source present winning.

use http::{HeaderMap, HeaderName};
use spillway_core::config::{self, Source, Sources};
use spillway_core::pattern::{RequestAttrs, SubjectKind};

/// Read access to a request's headers, for identity and for costs read from a header (W3).
pub trait Headers {
    /// The value of header `name` (lower case) if it is present and visible ASCII.
    fn header(&self, name: &HeaderName) -> Option<&str>;
}

impl Headers for HeaderMap {
    fn header(&self, name: &HeaderName) -> Option<&str> {
        self.get(name)?.to_str().ok()
    }
}

/// A request without headers: costs take their defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHeaders;

impl Headers for NoHeaders {
    fn header(&self, _: &HeaderName) -> Option<&str> {
        None
    }
}

/// One compiled source; header names are parsed once so a lookup does not parse them again.
#[derive(Debug, Clone)]
enum Compiled {
    Header(HeaderName),
    Path,
    Peer,
}

/// The `identity` section ([`config::Identity`]) compiled: reads a request's attributes from its
/// path, headers and peer.
#[derive(Debug, Clone)]
pub struct IdentityExtractor {
    caller: Box<[Compiled]>,
    procedure: Box<[Compiled]>,
    /// In [`SubjectKind::ALL`] order.
    subjects: [Box<[Compiled]>; 4],
}

fn compile(sources: &Sources) -> Box<[Compiled]> {
    sources
        .0
        .iter()
        .filter_map(|source| match source {
            // Validation already checked the name; one that still fails to parse can never be
            // present in a request, so dropping it changes nothing.
            Source::Header(name) => HeaderName::from_bytes(name.as_bytes())
                .ok()
                .map(Compiled::Header),
            Source::Path => Some(Compiled::Path),
            Source::Peer => Some(Compiled::Peer),
        })
        .collect()
}

impl IdentityExtractor {
    pub fn new(identity: &config::Identity) -> Self {
        Self {
            caller: compile(&identity.caller),
            procedure: compile(&identity.procedure),
            subjects: [
                compile(&identity.user),
                compile(&identity.org),
                compile(&identity.api_key),
                compile(&identity.ip),
            ],
        }
    }

    /// The attributes of a request with this `path`, these headers and this peer address (its IP
    /// as text, formatted once per connection by the caller). Allocates nothing.
    pub fn attrs<'a, H: Headers + ?Sized>(
        &self,
        path: &'a str,
        headers: &'a H,
        peer: Option<&'a str>,
    ) -> RequestAttrs<'a> {
        let first = |sources: &[Compiled]| {
            sources.iter().find_map(|source| match source {
                Compiled::Header(name) => headers.header(name),
                Compiled::Path => Some(path),
                Compiled::Peer => peer,
            })
        };
        let mut subjects = [None; 4];
        for kind in SubjectKind::ALL {
            subjects[kind.index()] = first(&self.subjects[kind.index()]);
        }
        RequestAttrs {
            caller: first(&self.caller),
            procedure: first(&self.procedure),
            subjects,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_present_source_wins() {
        let identity = IdentityExtractor::new(&config::Identity::default());
        let mut headers = HeaderMap::new();
        headers.insert("rpc-caller", "gateway".parse().unwrap());
        headers.insert("x-user-id", "alice".parse().unwrap());
        let attrs = identity.attrs("/search", &headers, Some("10.0.0.7"));
        assert_eq!(attrs.caller, Some("gateway"));
        assert_eq!(attrs.procedure, Some("/search"));
        assert_eq!(attrs.subject(SubjectKind::User), Some("alice"));
        assert_eq!(attrs.subject(SubjectKind::Org), None);
        assert_eq!(attrs.subject(SubjectKind::Ip), Some("10.0.0.7"));

        headers.insert(
            "rpc-procedure",
            "/payments.v1.Payments/Charge".parse().unwrap(),
        );
        let attrs = identity.attrs("/search", &headers, None);
        assert_eq!(attrs.procedure, Some("/payments.v1.Payments/Charge"));
        assert_eq!(attrs.subject(SubjectKind::Ip), None);
    }
}
