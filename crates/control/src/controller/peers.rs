//! The streams this controller opens to its peers (the other regions' controllers), reopened
//! with backoff whenever they break. Sums flow both ways on one stream, so one side listing the
//! other as a peer is enough.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use spillway_link::{Backoff, SessionError, Stop, Target, reconnect};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::transport::Channel;

use super::Region;

pub(super) async fn run(region: Arc<Region>, target: Target, backoff: Backoff, stop: Stop) {
    reconnect("peer", &target, backoff, stop, |channel, stop| {
        let region = region.clone();
        async move {
            let conn = region.next_conn.fetch_add(1, Ordering::Relaxed);
            let result = session(&region, conn, channel, stop).await;
            region.lock().peers.remove(&conn);
            result
        }
    })
    .await;
}

async fn session(
    region: &Region,
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
                Ok(Some(sums)) => region.on_peer_sums(sums),
                Ok(None) => return Err(SessionError::Ended),
                Err(status) => return Err(SessionError::Stream(status)),
            },
            _ = stop.changed() => return Ok(()),
        }
    }
}
