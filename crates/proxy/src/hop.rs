//! What does not travel past this hop: the fields that describe one connection (hop-by-hop
//! fields, and those a `connection` field names) and, in a request's trailer section, the
//! fields a trailer section must not carry.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Fields a trailer section must not carry (RFC 9110 §6.5.1), removed from request trailers
/// before they go on: framing (a `content-length` or `transfer-encoding` in trailers is how a
/// request would be made to mean two things), routing, request modifiers, authentication,
/// and how the content is to be read. Hop-by-hop fields go too.
const NOT_IN_TRAILERS: [HeaderName; 25] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::TE,
    header::TRAILER,
    header::CONTENT_LENGTH,
    header::HOST,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::COOKIE,
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_RANGE,
    header::EXPECT,
    header::MAX_FORWARDS,
    header::RANGE,
    header::CACHE_CONTROL,
    header::PRAGMA,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
];

/// Removes from a request's trailer section what may not be in one ([`NOT_IN_TRAILERS`]).
pub(crate) fn filter_trailers(trailers: &mut HeaderMap) {
    for name in &NOT_IN_TRAILERS {
        trailers.remove(name);
    }
}

/// Headers that describe one hop (RFC 9110 §7.6.1), plus `te`, handled apart. `http2-settings`
/// belongs to an `h2c` upgrade (RFC 7540 §3.2.1), which is never forwarded, so it always goes.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
    HeaderName::from_static("http2-settings"),
];

pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of these, or only `connection: keep-alive`: one pass over the
    // names, comparing without hashing, finds which are there.
    let mut present = [false; 7];
    let mut te = false;
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present[i] = true;
        } else if name == header::TE {
            te = true;
        }
    }
    // Headers named in `connection` are hop-by-hop too.
    if present[0] {
        let mut values = headers.get_all(header::CONNECTION).iter();
        let first = values.next().cloned();
        // A second `connection` field is rare; only then is this list allocated.
        let rest: Vec<HeaderValue> = values.cloned().collect();
        for value in first.iter().chain(rest.iter()) {
            let Ok(value) = value.to_str() else { continue };
            for name in value.split(',') {
                let name = name.trim();
                if !name.is_empty() {
                    headers.remove(name);
                }
            }
        }
    }
    for (hop, present) in HOP_BY_HOP.iter().zip(present) {
        if present {
            headers.remove(hop);
        }
    }
    // `te: trailers` is how gRPC says it reads trailers; any other `te` is hop-by-hop.
    if te
        && !headers
            .get(header::TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"))
    {
        headers.remove(header::TE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_removed_and_te_trailers_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "keep-alive, x-secret".parse().unwrap());
        headers.insert("x-secret", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert("te", "trailers".parse().unwrap());
        headers.insert("x-user-id", "alice".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        let mut names: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["te", "x-user-id"]);
        headers.insert("te", "gzip".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        assert!(headers.get("te").is_none());
    }

    #[test]
    fn http2_settings_always_goes() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "upgrade".parse().unwrap());
        headers.insert("upgrade", "h2c".parse().unwrap());
        headers.insert(
            "http2-settings",
            "AAMAAABkAARAAAAAAAIAAAAA".parse().unwrap(),
        );
        strip_hop_by_hop(&mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }
}
