//! The aggregator's stream to its region's controller: zone sums up, instructions down, reopened
//! with backoff whenever it breaks. With several controllers (a leader and its standbys) a lost
//! or silent stream moves to the next one, and a standby's refusal to the leader it names.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use spillway_link::{Backoff, SessionError, Stop, Target, now_ms, reconnect_any};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::Zone;

/// How long a controller may take to accept the stream: one that was paused (SIGSTOP) keeps
/// its socket's backlog but answers nothing, and the link should move on.
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// With several controllers, how many intervals without instructions make the link move to the
/// next one: a controller instructs every zone every interval, so three silent ones mean it
/// stalled or lost its lease without ending the stream.
const SILENT_INTERVALS: u32 = 3;

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
        |channel, stop| {
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
    let opened = if watch_silence {
        tokio::time::timeout(OPEN_TIMEOUT, client.link_zone(ReceiverStream::new(rx)))
            .await
            .unwrap_or_else(|_| {
                Err(tonic::Status::deadline_exceeded(
                    "the controller did not accept the stream in time",
                ))
            })
    } else {
        client.link_zone(ReceiverStream::new(rx)).await
    };
    let mut inbound = opened.map_err(SessionError::Refused)?.into_inner();
    {
        let mut state = zone.lock();
        state.upstream = Some(tx);
        state.core.upstream_opened();
    }
    zone.connected.store(true, Ordering::Relaxed);
    tracing::info!(zone = %zone.lock().core.zone(), "controller link up");
    let silence = || {
        let interval = zone.lock().core.interval().duration();
        if watch_silence {
            interval * SILENT_INTERVALS
        } else {
            // Never, in effect: one controller is waited for however long it is silent.
            Duration::from_secs(86_400 * 365)
        }
    };
    let mut last = Instant::now();
    loop {
        let quiet = silence();
        tokio::select! {
            message = inbound.message() => match message {
                Ok(Some(instructions)) => {
                    last = Instant::now();
                    let mut state = zone.lock();
                    let steps = state.core.on_instructions(now_ms(), instructions);
                    state.send(steps);
                }
                Ok(None) => return Err(SessionError::Ended),
                Err(status) => return Err(SessionError::Stream(status)),
            },
            _ = tokio::time::sleep_until(last + quiet) => return Err(SessionError::Silent(quiet)),
            _ = stop.changed() => return Ok(()),
        }
    }
}
