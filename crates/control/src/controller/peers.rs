//! The streams this controller opens to its peers (the other regions' controllers), reopened
//! with backoff whenever they break. Sums flow both ways on one stream, so one side listing the
//! other as a peer is enough.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use spillway_link::{Backoff, SessionError, Stop, Target, reconnect};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::Channel;

use super::Region;
use crate::trust::{Reason, Refusal};

/// A peer this controller dials: where, and the region its certificate named at the last
/// handshake (`None` in plaintext, where nothing is proved).
pub(super) struct Dialled {
    pub target: Target,
    pub url: String,
    pub certified: Arc<Mutex<Option<String>>>,
}

pub(super) async fn run(region: Arc<Region>, peer: Dialled, backoff: Backoff, stop: Stop) {
    let peer = Arc::new(peer);
    reconnect("peer", &peer.target, backoff, stop, |channel, stop| {
        let region = region.clone();
        let peer = peer.clone();
        async move {
            let conn = region.next_conn.fetch_add(1, Ordering::Relaxed);
            let result = session(&region, &peer, conn, channel, stop).await;
            region.lock().peers.remove(&conn);
            result
        }
    })
    .await;
}

/// A dialled peer may send only the sums of the region its certificate names, as a peer that
/// dials this controller may announce only its own (`trust::rules`).
fn sums_allowed(certified: Option<&str>, sums: &v1::RegionSums) -> Result<(), Refusal> {
    match certified {
        Some(region) if sums.region != region => Err(Refusal {
            reason: Reason::Region,
            message: format!(
                "the controller of region {region} sent the sums of region \"{}\"; a peer sends its own region's only",
                sums.region
            ),
        }),
        _ => Ok(()),
    }
}

async fn session(
    region: &Region,
    peer: &Dialled,
    conn: u64,
    channel: Channel,
    mut stop: Stop,
) -> Result<(), SessionError> {
    let mut client = v1::controller_client::ControllerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<Result<v1::RegionSums, Status>>(16);
    let outbound = ReceiverStream::new(rx).filter_map(Result::ok);
    let mut inbound = client
        .exchange(outbound)
        .await
        .map_err(SessionError::Refused)?
        .into_inner();
    region.lock().peers.insert(conn, tx);
    loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(sums)) => {
                    let certified = peer
                        .certified
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    if let Err(refusal) = sums_allowed(certified.as_deref(), &sums) {
                        return Err(SessionError::Stream(region.trust.reject(&refusal, &peer.url)));
                    }
                    region.on_peer_sums(sums)
                }
                Ok(None) => return Err(SessionError::Ended),
                Err(status) => return Err(SessionError::Stream(status)),
            },
            _ = stop.changed() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(region: &str) -> v1::RegionSums {
        v1::RegionSums {
            region: region.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_dialled_peer_sends_the_sums_of_its_certificates_region_only() {
        assert!(sums_allowed(Some("r2"), &sums("r2")).is_ok());
        let refused = sums_allowed(Some("r2"), &sums("r3")).unwrap_err();
        assert_eq!(refused.reason, Reason::Region);
        assert!(
            refused
                .message
                .contains("region r2 sent the sums of region \"r3\""),
            "{}",
            refused.message
        );
        // Plaintext proves no region: nothing to hold the peer to.
        assert!(sums_allowed(None, &sums("r3")).is_ok());
    }
}
