//! The aggregator's stream to its region's controller: zone sums up, instructions down, reopened
//! with backoff whenever it breaks. With several controllers (a leader and its standbys) a lost
//! or silent stream moves to the next one, and a standby's refusal to the leader it names.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use spillway_link::{
    Backoff, SessionError, Stop, Target, now_ms, open_stream, reconnect_any, silence_limit,
};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::Zone;

pub(super) async fn run(
    zone: Arc<Zone>,
    controllers: Vec<Target>,
    hinted: impl Fn(&str) -> Option<Target>,
    backoff: Backoff,
    stop: Stop,
) {
    let watch_silence = controllers.len() > 1;
    reconnect_any(
        "controller",
        &controllers,
        hinted,
        backoff,
        stop,
        |channel, stop, _| {
            let zone = zone.clone();
            async move {
                let result = session(&zone, channel, stop, watch_silence).await;
                let mut state = zone.lock();
                state.upstream = None;
                state.core.upstream_closed();
                zone.connected.store(false, Ordering::Relaxed);
                result
            }
        },
    )
    .await;
}

async fn session(
    zone: &Zone,
    channel: Channel,
    mut stop: Stop,
    watch_silence: bool,
) -> Result<(), SessionError> {
    let mut client = v1::controller_client::ControllerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel(16);
    let mut inbound = open_stream(watch_silence, client.link_zone(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    {
        let mut state = zone.lock();
        state.upstream = Some(tx);
        state.core.upstream_opened();
    }
    zone.connected.store(true, Ordering::Relaxed);
    tracing::info!(zone = %zone.lock().core.zone(), "controller link up");
    // A controller instructs every zone every interval, so three silent ones mean it stalled or
    // lost its lease without ending the stream.
    let silence = || silence_limit(watch_silence, zone.lock().core.interval().duration(), 0);
    let mut last = Instant::now();
    loop {
        let quiet = silence();
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(instructions)) => {
                    last = Instant::now();
                    let mut state = zone.lock();
                    let unbound = state.core.unbound_ids();
                    state.relay(now_ms(), instructions);
                    let skipped = state.core.unbound_ids() - unbound;
                    if skipped > 0 {
                        tracing::warn!(
                            skipped,
                            total = state.core.unbound_ids(),
                            "instructions named buckets by numbers the stream never named: those entries were skipped"
                        );
                    }
                }
                Ok(None) => return Err(SessionError::Ended),
                Err(status) => return Err(SessionError::Stream(status)),
            },
            _ = tokio::time::sleep_until(last + quiet) => return Err(SessionError::Silent(quiet)),
            _ = stop.changed() => return Ok(()),
        }
    }
}
