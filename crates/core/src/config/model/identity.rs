//! The `identity:` section: where each request attribute is read from, as lists of sources.

use super::*;

/// Where each request attribute is read from (the `identity` section). Each value is a list of sources
/// separated by commas; the first one present in the request wins.
///
/// A header is whatever the client wrote unless a trusted hop in front of the proxy sets it, so
/// the defaults read nothing from a header that decides which bucket a request falls in by its
/// route: `procedure` is the path (which the upstream routes by, so a client cannot name one
/// procedure and call another). `header:rpc-procedure,path` trusts a mesh hop to set the header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
#[schemars(rename = "Identity")]
pub struct IdentitySources {
    /// The calling service. Default `header:rpc-caller`.
    pub caller: Sources,
    /// The procedure or API. Default `path`: the HTTP path, which for gRPC is the method
    /// (`/package.Service/Method`).
    pub procedure: Sources,
    /// Default `header:x-user-id`.
    pub user: Sources,
    /// Default `header:x-org-id`.
    pub org: Sources,
    /// Default `header:x-api-key`.
    pub api_key: Sources,
    /// Default `peer`, the address of the connection; or `header:x-forwarded-for`, counted by
    /// `xff_trusted_hops`.
    pub ip: Sources,
    /// For `ip: header:x-forwarded-for`: how many hops in front of the proxy are trusted to
    /// append to `x-forwarded-for`. The proxy appends its peer to the list it received,
    /// and the client is the address this many places left of that last one: with peer 10.0.0.9
    /// and `x-forwarded-for: 203.0.113.7, 10.0.0.5`, 0 gives 10.0.0.9, 1 gives 10.0.0.5 and 2
    /// gives 203.0.113.7. Default 1 (one load balancer).
    pub xff_trusted_hops: u32,
    /// The request's criticality tier: `critical_plus`, `critical` (the default, also
    /// for a request without it or with a value that names no tier), `sheddable_plus` or
    /// `sheddable`, in any case. Default `header:rpc-criticality`. Where a drop-ratio bucket must
    /// drop a share of its traffic, the lowest tiers absorb it first.
    pub criticality: Sources,
    /// Whether the criticality header comes from a trusted hop, which may raise a request above
    /// the default tier. Default false: a client may lower its own tier (mark its prefetches
    /// `sheddable`) but a `critical_plus` it writes itself counts as `critical`.
    pub criticality_trusted: bool,
    /// Identity headers that are lists by design: for these the first element of the list
    /// (several fields being one list) is the value read, and the upstream gets the whole list.
    /// Any other identity header with a comma in its value is refused, since HTTP reads it as the
    /// header sent twice. Default none; `x-forwarded-for` keeps its own rules and is not named here.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub list_headers: Vec<String>,
}

/// The default of `identity.xff_trusted_hops`: one load balancer in front of the proxy.
pub const DEFAULT_XFF_TRUSTED_HOPS: u32 = 1;

impl Default for IdentitySources {
    fn default() -> Self {
        let header = |name: &str| Sources(vec![Source::Header(name.to_owned())]);
        IdentitySources {
            caller: header("rpc-caller"),
            procedure: Sources(vec![Source::Path]),
            user: header("x-user-id"),
            org: header("x-org-id"),
            api_key: header("x-api-key"),
            ip: Sources(vec![Source::Peer]),
            xff_trusted_hops: DEFAULT_XFF_TRUSTED_HOPS,
            criticality: header("rpc-criticality"),
            criticality_trusted: false,
            list_headers: Vec::new(),
        }
    }
}

/// One place a request attribute can come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// `header:NAME`; the name is kept in lower case, as HTTP/2 sends it.
    Header(String),
    /// `path`: the HTTP path (gRPC puts `/package.Service/Method` there).
    Path,
    /// `peer`: the IP address of the connection.
    Peer,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Header(name) => write!(f, "header:{name}"),
            Source::Path => f.write_str("path"),
            Source::Peer => f.write_str("peer"),
        }
    }
}

/// `header:rpc-procedure,path`: sources in order of preference, never empty.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sources(pub Vec<Source>);

impl fmt::Display for Sources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, source) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{source}")?;
        }
        Ok(())
    }
}

/// Characters of an HTTP header name (RFC 9110 `token`).
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl Sources {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut sources = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let source = match part {
                "path" => Source::Path,
                "peer" => Source::Peer,
                "" => {
                    return Err(format!(
                        "source list \"{text}\" has an empty entry; write sources like \"header:x-user-id\" or \"header:rpc-procedure,path\""
                    ));
                }
                _ => match part.split_once(':') {
                    Some(("header", name)) if is_header_name(name.trim()) => {
                        Source::Header(name.trim().to_ascii_lowercase())
                    }
                    Some(("header", name)) => {
                        return Err(format!(
                            "\"{}\" is not a valid header name; use letters, digits and '-'",
                            name.trim()
                        ));
                    }
                    _ => {
                        return Err(format!(
                            "unknown source \"{part}\"; use header:NAME, path or peer (several separated by commas, the first present wins)"
                        ));
                    }
                },
            };
            sources.push(source);
        }
        Ok(Sources(sources))
    }
}

impl Serialize for Sources {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Sources {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SourcesVisitor;
        impl de::Visitor<'_> for SourcesVisitor {
            type Value = Sources;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("sources like \"header:x-user-id\" or \"header:rpc-procedure,path\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Sources, E> {
                Sources::parse(text).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(SourcesVisitor)
    }
}

impl JsonSchema for Sources {
    fn schema_name() -> Cow<'static, str> {
        "Sources".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "Sources separated by commas, the first present wins: header:NAME, path (the HTTP path) or peer (the connection's address).",
            "pattern": r"^\s*(header:\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+|path|peer)\s*(,\s*(header:\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+|path|peer)\s*)*$",
            "examples": ["header:rpc-caller", "header:rpc-procedure,path", "peer"]
        })
    }
}
