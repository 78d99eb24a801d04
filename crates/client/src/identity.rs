//! Where request attributes come from (the configuration's `identity`, and the edge's trust rules): headers, the path or the peer,
//! the first source present winning, read so that a client cannot decide one way and be served
//! another.
//!
//! - The path is matched normalised ([`path`]), so `/%69p/search` is `/ip/search`.
//! - `ip: header:x-forwarded-for` is counted from the right past `xff_trusted_hops`
//!   ([`forwarded`]), so a hop the client invents is ignored.
//! - Any other identity header that is consulted must come once, as one value, and in visible
//!   ASCII: the upstream receives every copy, so a second one, a comma-joined list (which HTTP
//!   reads as the same field sent twice), or bytes the limiter would read differently are
//!   refused with [`BadIdentity`] rather than decided on one value and served on another.

mod forwarded;
pub mod path;

use std::fmt;
use std::ops::ControlFlow;

use http::{HeaderMap, HeaderName};
use spillway_core::config::{self, Source, Sources};
use spillway_core::criticality::Criticality;
use spillway_core::pattern::{RequestAttrs, SubjectKind};

pub use path::PathBuffer;

/// Read access to a request's headers, for identity and for costs read from a header.
pub trait Headers {
    /// The value of header `name` (lower case) if it is present and visible ASCII; the first one
    /// if it was sent more than once.
    fn header(&self, name: &HeaderName) -> Option<&str>;

    /// Header `name` as sent, for identity: absent, sent once in visible ASCII, sent once with
    /// other bytes (which [`Headers::header`] hides as absent), or sent more than once. The
    /// default knows only what [`Headers::header`] returns.
    fn field(&self, name: &HeaderName) -> Field<'_> {
        self.header(name).map_or(Field::Absent, Field::Once)
    }

    /// Calls `visit` with every value of header `name` as sent, the last first, until it breaks:
    /// for lists such as `x-forwarded-for`, whose lines are one list. The default knows only what
    /// [`Headers::header`] returns.
    fn values_rev<'a>(
        &'a self,
        name: &HeaderName,
        visit: &mut dyn FnMut(&'a [u8]) -> ControlFlow<()>,
    ) {
        if let Some(value) = self.header(name) {
            let _ = visit(value.as_bytes());
        }
    }
}

/// How a header was sent ([`Headers::field`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    Absent,
    /// Once, in visible ASCII (with space and tab), as [`http::HeaderValue::to_str`] has it.
    Once(&'a str),
    /// Once, with a byte that is not visible ASCII.
    NotVisibleAscii,
    /// More than once.
    Repeated,
}

impl Headers for HeaderMap {
    fn header(&self, name: &HeaderName) -> Option<&str> {
        self.get(name)?.to_str().ok()
    }

    fn field(&self, name: &HeaderName) -> Field<'_> {
        let mut values = self.get_all(name).iter();
        match (values.next(), values.next()) {
            (None, _) => Field::Absent,
            (Some(value), None) => value.to_str().map_or(Field::NotVisibleAscii, Field::Once),
            (Some(_), Some(_)) => Field::Repeated,
        }
    }

    fn values_rev<'a>(
        &'a self,
        name: &HeaderName,
        visit: &mut dyn FnMut(&'a [u8]) -> ControlFlow<()>,
    ) {
        for value in self.get_all(name).iter().rev() {
            if visit(value.as_bytes()).is_break() {
                return;
            }
        }
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

/// Why a request's identity cannot be read: the proxy answers `400` (gRPC `INVALID_ARGUMENT`)
/// before deciding. It names the header, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("identity header {header} (read for `{attribute}`) {fault}")]
pub struct BadIdentity {
    /// The `identity` key the header was read for (`user`, `procedure`, ...).
    pub attribute: &'static str,
    pub header: HeaderName,
    pub fault: Fault,
}

/// What is wrong with an identity header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Sent more than once: the limiter would decide on one value and the upstream see both.
    Repeated,
    /// A byte that is not visible ASCII (or space and tab): what the limiter reads and what the
    /// upstream reads might differ.
    NotVisibleAscii,
    /// A comma in the value: HTTP makes `a, b` and two fields `a` and `b` the same (RFC 9110
    /// §5.3), so it is refused as a repeated field is; otherwise each new list would key a new
    /// subject.
    List,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::Repeated => "was sent more than once; send it once",
            Fault::NotVisibleAscii => {
                "has a value with bytes that are not visible ASCII; send it as ASCII"
            }
            Fault::List => {
                "has a comma in its value, which HTTP reads as the header sent more than once; send one value"
            }
        })
    }
}

/// One compiled source; header names are parsed once so a lookup does not parse them again.
#[derive(Debug, Clone)]
enum Compiled {
    Header(HeaderName),
    /// A header of `identity.list_headers`: its list's first element.
    ListHeader(HeaderName),
    /// `header:x-forwarded-for` in `ip`: counted past the trusted hops.
    ForwardedFor(HeaderName),
    Path,
    Peer,
}

/// The `identity` section ([`config::IdentitySources`]) compiled: reads a request's attributes from its
/// path, headers and peer.
#[derive(Debug, Clone)]
pub struct IdentityExtractor {
    caller: Box<[Compiled]>,
    procedure: Box<[Compiled]>,
    /// In [`SubjectKind::ALL`] order.
    subjects: [Box<[Compiled]>; 4],
    criticality: Box<[Compiled]>,
    /// Whether `criticality` may raise a request above the default tier.
    criticality_trusted: bool,
    xff_trusted_hops: u32,
    /// Whether any attribute reads the path, which is then normalised once per request.
    reads_path: bool,
}

fn compile(sources: &Sources, forwarded_for: bool, lists: &[String]) -> Box<[Compiled]> {
    sources
        .0
        .iter()
        .filter_map(|source| match source {
            // Validation already checked the name; one that still fails to parse can never be
            // present in a request, so dropping it changes nothing.
            Source::Header(name) => {
                let parsed = HeaderName::from_bytes(name.as_bytes()).ok()?;
                Some(if forwarded_for && parsed == "x-forwarded-for" {
                    Compiled::ForwardedFor(parsed)
                } else if lists.iter().any(|list| parsed == list.as_str()) {
                    Compiled::ListHeader(parsed)
                } else {
                    Compiled::Header(parsed)
                })
            }
            Source::Path => Some(Compiled::Path),
            Source::Peer => Some(Compiled::Peer),
        })
        .collect()
}

/// The one value of identity header `name`, if it was sent: once, without a comma, in visible
/// ASCII (with space and tab), as [`http::HeaderValue::to_str`] defines it.
fn single<'a, H: Headers + ?Sized>(
    headers: &'a H,
    name: &HeaderName,
) -> Result<Option<&'a str>, Fault> {
    match headers.field(name) {
        Field::Absent => Ok(None),
        Field::Once(value) if value.contains(',') => Err(Fault::List),
        Field::Once(value) => Ok(Some(value)),
        Field::NotVisibleAscii => Err(Fault::NotVisibleAscii),
        Field::Repeated => Err(Fault::Repeated),
    }
}

/// The value of list header `name`: the first non-empty element of its list, several fields
/// being one list in order; `None` when it has none. The element must be visible ASCII.
fn first_element<'a, H: Headers + ?Sized>(
    headers: &'a H,
    name: &HeaderName,
) -> Result<Option<&'a str>, Fault> {
    let mut first: Option<&'a [u8]> = None;
    // The fields come last first: the earliest one with an element is the one kept.
    headers.values_rev(name, &mut |value| {
        if let Some(element) = value
            .split(|&b| b == b',')
            .map(<[u8]>::trim_ascii)
            .find(|element| !element.is_empty())
        {
            first = Some(element);
        }
        ControlFlow::Continue(())
    });
    let Some(element) = first else {
        return Ok(None);
    };
    if !element
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return Err(Fault::NotVisibleAscii);
    }
    Ok(std::str::from_utf8(element).ok())
}

/// A refusal as found on the hot path: small and `Copy`, borrowing the header's name, so the
/// success path moves no error around. It becomes a [`BadIdentity`] only when returned.
#[derive(Clone, Copy)]
struct Refusal<'e> {
    attribute: &'static str,
    header: &'e HeaderName,
    fault: Fault,
}

impl Refusal<'_> {
    #[cold]
    fn into_bad_identity(self) -> BadIdentity {
        BadIdentity {
            attribute: self.attribute,
            header: self.header.clone(),
            fault: self.fault,
        }
    }
}

impl IdentityExtractor {
    pub fn new(identity: &config::IdentitySources) -> Self {
        let all = [
            &identity.caller,
            &identity.procedure,
            &identity.user,
            &identity.org,
            &identity.api_key,
            &identity.ip,
            &identity.criticality,
        ];
        let lists = &identity.list_headers;
        Self {
            caller: compile(&identity.caller, false, lists),
            procedure: compile(&identity.procedure, false, lists),
            subjects: [
                compile(&identity.user, false, lists),
                compile(&identity.org, false, lists),
                compile(&identity.api_key, false, lists),
                compile(&identity.ip, true, lists),
            ],
            criticality: compile(&identity.criticality, false, lists),
            criticality_trusted: identity.criticality_trusted,
            xff_trusted_hops: identity.xff_trusted_hops,
            reads_path: all.iter().any(|s| s.0.contains(&Source::Path)),
        }
    }

    /// The tier a criticality value names, as this identity trusts it: a tier below the default
    /// as named, one above it only with `criticality_trusted`, anything else the default.
    pub fn criticality_of(&self, value: Option<&str>) -> Criticality {
        match value.and_then(Criticality::from_header) {
            Some(tier) if self.criticality_trusted => tier,
            // A client lowers its own tier, never raises it.
            Some(tier) => tier.max(Criticality::default()),
            None => Criticality::default(),
        }
    }

    /// Sets the criticality header a client sent to the tier the proxy applied (`applied`, what
    /// [`IdentityExtractor::attrs`] read), unless the header comes from a trusted hop: a client
    /// that claimed `critical_plus` and was held to `critical` is forwarded as `critical`, so a
    /// hop behind the proxy does not act on the claim. A header the request did not carry stays
    /// absent. Allocates nothing.
    pub fn rewrite_criticality(&self, headers: &mut HeaderMap, applied: Criticality) {
        if self.criticality_trusted {
            return;
        }
        for source in &self.criticality {
            if let Compiled::Header(name) | Compiled::ListHeader(name) = source
                && headers.contains_key(name)
            {
                headers.insert(name, http::HeaderValue::from_static(applied.name()));
            }
        }
    }

    /// The attributes of a request with this `path`, these headers and this peer address (its IP
    /// as text, formatted once per connection by the caller), or why they cannot be read. A path
    /// source gives the path normalised ([`path`]), in `buffer` when it needs a change.
    /// Allocates nothing, except for a path longer than [`path::PATH_STACK_BYTES`] that needs
    /// normalising, and for the error.
    pub fn attrs<'a, 'e, H: Headers + ?Sized>(
        &'e self,
        path: &'a str,
        headers: &'a H,
        peer: Option<&'a str>,
        buffer: &'a mut PathBuffer,
    ) -> Result<RequestAttrs<'a>, BadIdentity> {
        let path = if self.reads_path {
            buffer.normalise(path)
        } else {
            path
        };
        let first = |sources: &'e [Compiled],
                     attribute: &'static str|
         -> Result<Option<&'a str>, Refusal<'e>> {
            for source in sources {
                let value = match source {
                    Compiled::Header(name) => single(headers, name).map_err(|fault| Refusal {
                        attribute,
                        header: name,
                        fault,
                    })?,
                    Compiled::ListHeader(name) => {
                        first_element(headers, name).map_err(|fault| Refusal {
                            attribute,
                            header: name,
                            fault,
                        })?
                    }
                    Compiled::ForwardedFor(name) => {
                        forwarded::client(headers, name, self.xff_trusted_hops, peer)
                    }
                    Compiled::Path => Some(path),
                    Compiled::Peer => peer,
                };
                if value.is_some() {
                    return Ok(value);
                }
            }
            Ok(None)
        };
        let read = || {
            let mut subjects = [None; 4];
            for kind in SubjectKind::ALL {
                subjects[kind.index()] = first(&self.subjects[kind.index()], kind.key())?;
            }
            let criticality = self.criticality_of(first(&self.criticality, "criticality")?);
            Ok(RequestAttrs {
                caller: first(&self.caller, "caller")?,
                procedure: first(&self.procedure, "procedure")?,
                subjects,
                criticality,
            })
        };
        read().map_err(Refusal::into_bad_identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extractor(yaml_identity: &str) -> IdentityExtractor {
        let text = format!("version: 1\nidentity: {yaml_identity}\n");
        let config = config::load_str(&text, "test.yaml").unwrap();
        IdentityExtractor::new(&config.identity)
    }

    #[test]
    fn first_present_source_wins() {
        let identity = IdentityExtractor::new(&config::IdentitySources::default());
        let mut buffer = PathBuffer::new();
        let mut headers = HeaderMap::new();
        headers.insert("rpc-caller", "gateway".parse().unwrap());
        headers.insert("x-user-id", "alice".parse().unwrap());
        let attrs = identity
            .attrs("/search", &headers, Some("10.0.0.7"), &mut buffer)
            .unwrap();
        assert_eq!(attrs.caller, Some("gateway"));
        assert_eq!(attrs.procedure, Some("/search"));
        assert_eq!(attrs.subject(SubjectKind::User), Some("alice"));
        assert_eq!(attrs.subject(SubjectKind::Org), None);
        assert_eq!(attrs.subject(SubjectKind::Ip), Some("10.0.0.7"));

        let trusting = extractor("{ procedure: \"header:rpc-procedure,path\" }");
        headers.insert(
            "rpc-procedure",
            "/payments.v1.Payments/Charge".parse().unwrap(),
        );
        let attrs = trusting
            .attrs("/search", &headers, None, &mut buffer)
            .unwrap();
        assert_eq!(attrs.procedure, Some("/payments.v1.Payments/Charge"));
        assert_eq!(attrs.subject(SubjectKind::Ip), None);
    }

    #[test]
    fn by_default_the_procedure_is_the_normalised_path_whatever_the_headers_say() {
        let identity = IdentityExtractor::new(&config::IdentitySources::default());
        let mut buffer = PathBuffer::new();
        let mut headers = HeaderMap::new();
        headers.insert("rpc-procedure", "/x".parse().unwrap());
        let attrs = identity
            .attrs("/%69p//search", &headers, None, &mut buffer)
            .unwrap();
        assert_eq!(attrs.procedure, Some("/ip/search"));
    }

    #[test]
    fn an_identity_header_sent_twice_or_not_ascii_is_refused_by_name() {
        let identity = IdentityExtractor::new(&config::IdentitySources::default());
        let mut buffer = PathBuffer::new();
        let mut headers = HeaderMap::new();
        headers.append("x-user-id", "zz1".parse().unwrap());
        headers.append("x-user-id", "alice".parse().unwrap());
        let err = identity
            .attrs("/", &headers, None, &mut buffer)
            .unwrap_err();
        assert_eq!(
            (err.attribute, err.header.as_str(), err.fault),
            ("user", "x-user-id", Fault::Repeated)
        );
        assert!(!err.to_string().contains("alice"));

        let mut headers = HeaderMap::new();
        headers.insert(
            "rpc-caller",
            http::HeaderValue::from_bytes(b"gw\xa0").unwrap(),
        );
        let err = identity
            .attrs("/", &headers, None, &mut buffer)
            .unwrap_err();
        assert_eq!(
            (err.attribute, err.header.as_str(), err.fault),
            ("caller", "rpc-caller", Fault::NotVisibleAscii)
        );
        // A header that is not consulted (an earlier source was present) is not judged.
        let fallback = extractor("{ user: \"header:x-user-id,header:x-alt-user\" }");
        let mut headers = HeaderMap::new();
        headers.insert("x-user-id", "alice".parse().unwrap());
        headers.append("x-alt-user", "a".parse().unwrap());
        headers.append("x-alt-user", "b".parse().unwrap());
        let attrs = fallback.attrs("/", &headers, None, &mut buffer).unwrap();
        assert_eq!(attrs.subject(SubjectKind::User), Some("alice"));
    }

    #[test]
    fn a_comma_is_refused_unless_the_header_is_a_list_by_design() {
        let mut buffer = PathBuffer::new();
        let mut headers = HeaderMap::new();
        headers.insert("x-user-id", "alice, 7".parse().unwrap());
        let err = IdentityExtractor::new(&config::IdentitySources::default())
            .attrs("/", &headers, None, &mut buffer)
            .unwrap_err();
        assert_eq!((err.header.as_str(), err.fault), ("x-user-id", Fault::List));
        let lists = extractor("{ list_headers: [X-User-Id] }");
        let attrs = lists.attrs("/", &headers, None, &mut buffer).unwrap();
        assert_eq!(attrs.subject(SubjectKind::User), Some("alice"));
        let mut headers = HeaderMap::new();
        headers.append("x-user-id", " , ".parse().unwrap());
        headers.append("x-user-id", "bob".parse().unwrap());
        headers.append("x-user-id", "carol, dave".parse().unwrap());
        let attrs = lists.attrs("/", &headers, None, &mut buffer).unwrap();
        assert_eq!(
            attrs.subject(SubjectKind::User),
            Some("bob"),
            "several fields are one list; its first element counts"
        );
    }

    #[test]
    fn x_forwarded_for_counts_trusted_hops_and_falls_to_the_next_source() {
        let mut buffer = PathBuffer::new();
        let mut headers = HeaderMap::new();
        headers.append("x-forwarded-for", "203.0.113.7, 10.0.0.5".parse().unwrap());
        let peer = Some("10.0.0.9");
        for (hops, client) in [(0, "10.0.0.9"), (1, "10.0.0.5"), (2, "203.0.113.7")] {
            let identity = extractor(&format!(
                "{{ ip: header:x-forwarded-for, xff_trusted_hops: {hops} }}"
            ));
            let attrs = identity.attrs("/", &headers, peer, &mut buffer).unwrap();
            assert_eq!(attrs.subject(SubjectKind::Ip), Some(client), "{hops} hops");
        }
        let three = extractor("{ ip: header:x-forwarded-for, xff_trusted_hops: 3 }");
        let attrs = three.attrs("/", &headers, peer, &mut buffer).unwrap();
        assert_eq!(attrs.subject(SubjectKind::Ip), None, "too few entries");
        let fallback = extractor("{ ip: \"header:x-forwarded-for,peer\", xff_trusted_hops: 3 }");
        let attrs = fallback.attrs("/", &headers, peer, &mut buffer).unwrap();
        assert_eq!(attrs.subject(SubjectKind::Ip), Some("10.0.0.9"));
        // Repeated lines of x-forwarded-for are one list, not a fault.
        headers.append("x-forwarded-for", "10.0.0.6".parse().unwrap());
        let attrs = extractor("{ ip: header:x-forwarded-for }")
            .attrs("/", &headers, peer, &mut buffer)
            .unwrap();
        assert_eq!(attrs.subject(SubjectKind::Ip), Some("10.0.0.6"));
    }
}
