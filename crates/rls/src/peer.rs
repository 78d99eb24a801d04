//! Which peers a listener answers (`--allow-client-san`): shared by the RLS service and the
//! RLQS service, below both.

use spillway_tls::SanPolicy;
use spillway_tls::server::PeerInfo;
use tonic::{Request, Status};

/// Why the peer of `request` may not call under `allow` (`--allow-client-san`), if it may not.
/// `what` names the call in the debug line: Envoy calls once per request, so a warning per
/// refusal would flood the log; Envoy counts the failed calls itself.
pub(crate) fn refusal<T>(allow: &SanPolicy, request: &Request<T>, what: &str) -> Option<Status> {
    if allow.is_empty() {
        return None;
    }
    let Some(peer) = request.extensions().get::<PeerInfo>() else {
        return Some(Status::permission_denied(
            "this listener admits clients by certificate (--allow-client-san), and the connection has none",
        ));
    };
    if peer.allowed_by(allow) {
        return None;
    }
    let sans = if peer.uris.is_empty() {
        "none".to_owned()
    } else {
        peer.uris.join(", ")
    };
    tracing::debug!(peer = %peer.name(), "{what} refused: no URI SAN matches --allow-client-san");
    Some(Status::permission_denied(format!(
        "the client certificate's URI SANs ({sans}) match no --allow-client-san pattern"
    )))
}
