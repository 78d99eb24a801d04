//! The fields that tell the upstream who its client was (`--forwarded`): `x-forwarded-for` and
//! `x-forwarded-proto`, or `forwarded`, with this hop's peer appended.

use bytes::Bytes;

use crate::options::ForwardedFields;

/// A downstream connection's peer, formatted once per connection.
pub(crate) struct Peer {
    pub(crate) ip: Box<str>,
    /// The `x-forwarded-for` of a request that came with none: the peer alone.
    xff: http::HeaderValue,
    /// The `forwarded` of a request that came with none.
    rfc7239: http::HeaderValue,
}

impl Peer {
    pub(crate) fn new(ip: std::net::IpAddr) -> Self {
        let text = ip.to_string();
        // RFC 7239 §6: an IPv6 address is bracketed, and then quoted.
        let element = if ip.is_ipv6() {
            format!("for=\"[{text}]\";proto=http")
        } else {
            format!("for={text};proto=http")
        };
        // An address's text is always a valid field value.
        let value = |text: &str| {
            http::HeaderValue::from_str(text).unwrap_or(http::HeaderValue::from_static("unknown"))
        };
        Self {
            xff: value(&text),
            rfc7239: value(&element),
            ip: text.into(),
        }
    }
}

/// The forwarding fields the upstream gets (`--forwarded`): `x-forwarded-for` as received
/// (several lines one list) with this hop's peer appended, as the edge's rules count it, and
/// `x-forwarded-proto: http` (the proxy's listener speaks plaintext) unless a hop before it said
/// otherwise; or RFC 7239's `forwarded` with `for=PEER;proto=http` appended; or both, or neither.
/// A request that came with none of a field gets the connection's own value, made once.
pub(crate) fn forwarded(headers: &mut http::HeaderMap, peer: &Peer, fields: ForwardedFields) {
    const XFF: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");
    const XFP: http::HeaderName = http::HeaderName::from_static("x-forwarded-proto");
    let (x, rfc) = match fields {
        ForwardedFields::XForwarded => (true, false),
        ForwardedFields::Rfc7239 => (false, true),
        ForwardedFields::Both => (true, true),
        ForwardedFields::Off => return,
    };
    if x {
        append(headers, XFF, &peer.xff);
        if !headers.contains_key(&XFP) {
            headers.insert(XFP, http::HeaderValue::from_static("http"));
        }
    }
    if rfc {
        append(headers, http::header::FORWARDED, &peer.rfc7239);
    }
}

/// Sets `name` to the list received in it (every line, in order, empty ones skipped) with
/// `element` appended.
fn append(headers: &mut http::HeaderMap, name: http::HeaderName, element: &http::HeaderValue) {
    let mut received = headers
        .get_all(&name)
        .iter()
        .map(|value| value.as_bytes().trim_ascii())
        .filter(|value| !value.is_empty())
        .peekable();
    if received.peek().is_none() {
        headers.insert(name, element.clone());
        return;
    }
    let mut list = Vec::with_capacity(64);
    for value in received {
        list.extend_from_slice(value);
        list.extend_from_slice(b", ");
    }
    list.extend_from_slice(element.as_bytes());
    if let Ok(value) = http::HeaderValue::from_maybe_shared(Bytes::from(list)) {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_fields_append_the_peer_and_quote_ipv6() {
        let v4 = Peer::new("192.0.2.1".parse().unwrap());
        let v6 = Peer::new("2001:db8::1".parse().unwrap());
        assert_eq!(v6.rfc7239, "for=\"[2001:db8::1]\";proto=http");
        let mut headers = http::HeaderMap::new();
        forwarded(&mut headers, &v4, ForwardedFields::Both);
        assert_eq!(headers["x-forwarded-for"], "192.0.2.1");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(headers["forwarded"], "for=192.0.2.1;proto=http");
        let mut headers = http::HeaderMap::new();
        headers.append("x-forwarded-for", "203.0.113.7".parse().unwrap());
        headers.append("x-forwarded-for", " ".parse().unwrap());
        headers.append("x-forwarded-for", "10.0.0.5".parse().unwrap());
        forwarded(&mut headers, &v6, ForwardedFields::XForwarded);
        assert_eq!(
            headers["x-forwarded-for"], "203.0.113.7, 10.0.0.5, 2001:db8::1",
            "several lines one list, an empty one skipped"
        );
        assert!(headers.get("forwarded").is_none());
    }
}
