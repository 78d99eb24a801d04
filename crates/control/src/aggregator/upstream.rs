//! The aggregator's stream to its region's controller: zone sums up, instructions down, reopened
//! with backoff whenever it breaks.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use spillway_link::{Backoff, SessionError, Stop, Target, now_ms, reconnect};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::Zone;

pub(super) async fn run(zone: Arc<Zone>, controller: Target, backoff: Backoff, stop: Stop) {
    reconnect("controller", &controller, backoff, stop, |channel, stop| {
        let zone = zone.clone();
        async move {
            let result = session(&zone, channel, stop).await;
            let mut state = zone.lock();
            state.upstream = None;
            state.core.upstream_closed();
            zone.connected.store(false, Ordering::Relaxed);
            result
        }
    })
    .await;
}

async fn session(zone: &Zone, channel: Channel, mut stop: Stop) -> Result<(), SessionError> {
    let mut client = v1::controller_client::ControllerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel(16);
    let mut inbound = client
        .link_zone(ReceiverStream::new(rx))
        .await
        .map_err(SessionError::Refused)?
        .into_inner();
    {
        let mut state = zone.lock();
        state.upstream = Some(tx);
        state.core.upstream_opened();
    }
    zone.connected.store(true, Ordering::Relaxed);
    tracing::info!(zone = %zone.lock().core.zone(), "controller link up");
    loop {
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(instructions)) => {
                    let mut state = zone.lock();
                    let steps = state.core.on_instructions(now_ms(), instructions);
                    state.send(steps);
                }
                Ok(None) => return Err(SessionError::Ended),
                Err(status) => return Err(SessionError::Stream(status)),
            },
            _ = stop.changed() => return Ok(()),
        }
    }
}
