//! HTTP/1.1 upgrades (a WebSocket): which a request asks for and this hop forwards
//! ([`upgrade_asked`]), whether the upstream's `101` answers what was asked ([`switch_fault`]),
//! and the tunnel the two connections become once it does ([`Tunnel`]).

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Version};
use hyper::body::{Body, Incoming};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use spillway_core::config::ProxySettings;

/// An HTTP/1.1 upgrade both sides agreed to (a WebSocket): the client's connection, once hyper
/// has sent it the `101`, and the upstream connection that answered it, each byte of one
/// copied to the other until either ends.
pub(crate) struct Tunnel {
    pub(crate) client: OnUpgrade,
    pub(crate) upstream: OnUpgrade,
}

impl Tunnel {
    /// Copies both ways until one side ends, starting with what the upstream sent right after
    /// its `101` (read with the head). Returns the bytes copied each way (client to upstream,
    /// upstream to client).
    pub(crate) async fn run(self) -> std::io::Result<(u64, u64)> {
        let upstream = self.upstream.await.map_err(std::io::Error::other)?;
        let client = self.client.await.map_err(std::io::Error::other)?;
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await
    }
}

/// What an HTTP/1.1 request's `upgrade` comes to at this hop ([`upgrade_asked`]).
pub(crate) enum Ask {
    /// No upgrade asked in full: a plain request.
    None,
    /// An upgrade this proxy does not forward (a protocol `proxy.upgrades` does not allow,
    /// `h2c` always, or a WebSocket handshake without its key): removed with its `connection`
    /// options, and the request forwarded as a plain one.
    Removed,
    /// An upgrade to forward.
    Allowed(Upgrade),
}

/// An upgrade the proxy forwards, and what the upstream's `101` must say for it to be one.
pub(crate) struct Upgrade {
    /// The one protocol asked of the upstream: the first allowed one the client named.
    pub(crate) protocol: HeaderValue,
    /// For a WebSocket: the client's `sec-websocket-key`, forwarded as it came, and the
    /// `sec-websocket-accept` the upstream's `101` must carry.
    pub(crate) websocket: Option<(HeaderValue, [u8; ACCEPT_LEN])>,
}

impl Upgrade {
    /// This hop's upgrade, asked again of the next: the one protocol chosen, its key, and
    /// nothing else the client's `connection` named (the request's hop-by-hop fields are gone).
    pub(crate) fn ask(&self, headers: &mut HeaderMap) {
        headers.insert(header::UPGRADE, self.protocol.clone());
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some((key, _)) = &self.websocket {
            headers.insert(header::SEC_WEBSOCKET_KEY, key.clone());
        }
    }
}

/// The length of a `sec-websocket-accept`: 20 bytes of SHA-1 in base64.
const ACCEPT_LEN: usize = 28;

/// RFC 6455's GUID, appended to the client's key before hashing.
const WEBSOCKET_GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The `sec-websocket-accept` RFC 6455 derives from a client's `sec-websocket-key`:
/// base64(SHA-1(key + GUID)).
fn websocket_accept(key: &[u8]) -> [u8; ACCEPT_LEN] {
    use base64::Engine as _;
    use sha1::Digest as _;
    let mut sha1 = sha1::Sha1::new();
    sha1.update(key);
    sha1.update(WEBSOCKET_GUID);
    let digest = sha1.finalize();
    let mut accept = [0; ACCEPT_LEN];
    // 20 bytes always encode to 28 characters.
    let _ = base64::engine::general_purpose::STANDARD.encode_slice(digest, &mut accept);
    accept
}

/// Whether an HTTP/1.1 request asks to upgrade (RFC 9110 §7.8), and to what this hop forwards:
/// asked in full is `upgrade` named in `connection`, an `upgrade` field, and no body (a
/// handshake has none; a request with a body is forwarded as an ordinary one, its `upgrade`
/// dropped). Of the protocols it names the first that `settings` allows is the one asked of the
/// upstream; a WebSocket needs exactly one `sec-websocket-key`, from which its `101` is checked.
/// A request without an `upgrade` field costs one lookup.
pub(crate) fn upgrade_asked(request: &Request<Incoming>, settings: &ProxySettings) -> Ask {
    let headers = request.headers();
    if !headers.contains_key(header::UPGRADE) {
        return Ask::None;
    }
    if request.version() != Version::HTTP_11
        || !request.body().is_end_stream()
        || !tokens(headers, &header::CONNECTION).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
    {
        return Ask::None;
    }
    let Some(protocol) = tokens(headers, &header::UPGRADE).find(|t| settings.allows_upgrade(t))
    else {
        return Ask::Removed;
    };
    let Ok(protocol_value) = HeaderValue::from_bytes(protocol) else {
        return Ask::Removed;
    };
    let websocket = if protocol_name(protocol).eq_ignore_ascii_case(b"websocket") {
        let mut keys = headers.get_all(header::SEC_WEBSOCKET_KEY).iter();
        match (keys.next(), keys.next()) {
            (Some(key), None) if !key.as_bytes().trim_ascii().is_empty() => {
                Some((key.clone(), websocket_accept(key.as_bytes().trim_ascii())))
            }
            // No key, or two: no handshake the upstream's answer could be checked against.
            _ => return Ask::Removed,
        }
    } else {
        None
    };
    Ask::Allowed(Upgrade {
        protocol: protocol_value,
        websocket,
    })
}

/// The comma-separated elements of every `name` field, trimmed, empty ones skipped.
fn tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
}

/// The name of an `upgrade` token, without its version (`websocket` of `websocket/13`).
fn protocol_name(token: &[u8]) -> &[u8] {
    token
        .split(|&b| b == b'/')
        .next()
        .unwrap_or_default()
        .trim_ascii()
}

/// Why an upstream's `101` does not open a tunnel: it did not switch to what was asked the way
/// that protocol's handshake says it must. Answered 502, both connections closed.
pub(crate) fn switch_fault(response: &HeaderMap, asked: &Upgrade) -> Option<&'static str> {
    let mut protocols = response.get_all(header::UPGRADE).iter();
    let (Some(protocol), None) = (protocols.next(), protocols.next()) else {
        return Some("the upstream's 101 named no single protocol in its upgrade field");
    };
    if !protocol_name(protocol.as_bytes())
        .eq_ignore_ascii_case(protocol_name(asked.protocol.as_bytes()))
    {
        return Some("the upstream's 101 switched to a protocol the request did not ask for");
    }
    if let Some((_, expected)) = &asked.websocket {
        let mut accepts = response.get_all(header::SEC_WEBSOCKET_ACCEPT).iter();
        match (accepts.next(), accepts.next()) {
            (Some(accept), None) if accept.as_bytes().trim_ascii() == expected => {}
            (None, _) => {
                return Some(
                    "the upstream's 101 carried no sec-websocket-accept: not a WebSocket handshake",
                );
            }
            _ => {
                return Some(
                    "the upstream's 101 carried a sec-websocket-accept that does not answer the client's key: not a WebSocket handshake",
                );
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_websocket_accept_is_rfc_6455s_example() {
        assert_eq!(
            &websocket_accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
            b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
