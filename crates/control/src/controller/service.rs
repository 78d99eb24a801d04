//! The controller's gRPC service: one stream per aggregator (zone sums in, instructions out) and
//! one per peer that dialled this controller; the ticker that moves intervals along between
//! events; and the task that follows the rules.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use spillway_core::leadership::Leadership;
use spillway_link::{Stop, now_ms, sleep_or_stop};
use spillway_loop::{RulesSnapshot, SharedInstructions};
use spillway_proto::v1;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::Region;
use crate::trust::{self, Reason, Refusal};

/// What a zone stream carries down: each interval's instructions, the buckets common to every
/// zone encoded once (`super::zones` writes them).
pub(super) type Outgoing = Result<SharedInstructions, Status>;

pub(super) struct Service {
    pub(super) region: Arc<Region>,
    pub(super) stop: Stop,
}

#[tonic::async_trait]
impl v1::controller_server::Controller for Service {
    type LinkZoneStream =
        Pin<Box<dyn Stream<Item = Result<v1::ZoneInstructions, Status>> + Send + 'static>>;
    type ExchangeStream = ReceiverStream<Result<v1::RegionSums, Status>>;

    /// Served by [`super::zones::Routes`], which sends each message as it is encoded for every
    /// zone; this is the same stream as whole messages, for a server without that route.
    async fn link_zone(
        &self,
        request: Request<Streaming<v1::ZoneReport>>,
    ) -> Result<Response<Self::LinkZoneStream>, Status> {
        let stream = self.link(request).await?.into_inner();
        let whole = stream.map(|sent: Outgoing| sent.map(|i| i.to_message()));
        Ok(Response::new(Box::pin(whole)))
    }

    async fn exchange(
        &self,
        request: Request<Streaming<v1::RegionSums>>,
    ) -> Result<Response<Self::ExchangeStream>, Status> {
        let region = self.region.clone();
        // With TLS: another region's controller, which may announce its own region's sums only.
        let certified = match region.trust.peer(&request)? {
            None => None,
            Some((identity, name)) => match trust::rules::peer_of(&identity, &region.region) {
                Ok(peer) => Some((peer, name)),
                Err(refusal) => return Err(region.trust.reject(&refusal, &name)),
            },
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let mut stop = self.stop.clone();
        let conn = region.next_conn.fetch_add(1, Ordering::Relaxed);
        region.lock().peers.insert(conn, tx.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(sums)) => {
                            if let Some((peer, name)) = &certified
                                && sums.region != *peer
                            {
                                let refusal = Refusal {
                                    reason: Reason::Region,
                                    message: format!(
                                        "the certificate names region {peer}, the sums region {:?}",
                                        sums.region
                                    ),
                                };
                                let status = region.trust.reject(&refusal, name);
                                let _ = tx.try_send(Err(status));
                                break;
                            }
                            region.on_peer_sums(sums);
                        }
                        _ => break,
                    },
                    _ = stop.changed() => break,
                }
            }
            region.lock().peers.remove(&conn);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

impl Service {
    /// An aggregator's stream: its zone's sums in, the instructions for its zone out.
    pub(super) async fn link(
        &self,
        request: Request<Streaming<v1::ZoneReport>>,
    ) -> Result<Response<ReceiverStream<Outgoing>>, Status> {
        let region = self.region.clone();
        // With TLS: an aggregator of this region, which may sum its certificate's zone only.
        let certified = match region.trust.peer(&request)? {
            None => None,
            Some((identity, name)) => {
                match trust::rules::aggregator_of(&identity, &region.region) {
                    Ok(zone) => Some((zone, name)),
                    Err(refusal) => return Err(region.trust.reject(&refusal, &name)),
                }
            }
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let mut stop = self.stop.clone();
        let conn = region.next_conn.fetch_add(1, Ordering::Relaxed);
        {
            let mut state = region.lock();
            if !state.leadership.leads_at(Instant::now()) {
                return Err(super::standby_status(&state.leadership));
            }
            state.zones.insert(conn, tx.clone());
            // The zone's name comes with its first report.
            state.core.join(conn, "");
        }
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(report)) => {
                            if let Some((zone, name)) = &certified
                                && let Err(refusal) = zone_claims(&report, zone, &region.region)
                            {
                                let status = region.trust.reject(&refusal, name);
                                let _ = tx.try_send(Err(status));
                                break;
                            }
                            let mut guard = region.lock();
                            let state = &mut *guard;
                            let now = now_ms();
                            // A zone's estimate of the open interval (`surge`) is no
                            // interval's sums: only the core answers it.
                            if !report.surge {
                                state.record.on_zone_report(conn, &report, now);
                                if let Some(history) = &mut state.history {
                                    let core = &state.core;
                                    history.ledger.on_zone_report_named(&report, now, |b| {
                                        core.bucket_names(conn, b)
                                    });
                                }
                                state.spans.on_report(report.sequence);
                            }
                            let unbound = state.core.unbound_ids();
                            let zone = report.zone.clone();
                            let steps = state.core.on_zone_report(conn, report, now);
                            let skipped = state.core.unbound_ids() - unbound;
                            if skipped > 0 {
                                tracing::warn!(
                                    %zone,
                                    skipped,
                                    total = state.core.unbound_ids(),
                                    "a zone report named buckets by numbers its stream never named: those entries were skipped"
                                );
                            }
                            state.send(steps);
                        }
                        _ => break,
                    },
                    _ = stop.changed() => break,
                }
            }
            let mut state = region.lock();
            state.zones.remove(&conn);
            let now = now_ms();
            state.record.on_leave(conn, now);
            let steps = state.core.leave(conn, now);
            state.send(steps);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Whether a certified aggregator's sums claim what its certificate says: its zone and region.
fn zone_claims(report: &v1::ZoneReport, zone: &str, region: &str) -> Result<(), Refusal> {
    if report.zone != zone {
        return Err(Refusal {
            reason: Reason::Zone,
            message: format!(
                "the certificate names zone {zone}, the sums zone {:?}",
                report.zone
            ),
        });
    }
    if !report.region.is_empty() && report.region != region {
        return Err(Refusal {
            reason: Reason::Region,
            message: format!(
                "sums of region {:?} at region {region}'s controller",
                report.region
            ),
        });
    }
    Ok(())
}

impl Region {
    /// A peer's sums, from either side's stream.
    pub(super) fn on_peer_sums(&self, sums: v1::RegionSums) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let now = now_ms();
        state.record.on_peer_sums(&state.core, &sums, now);
        let steps = state.core.on_peer_sums(sums, now);
        state.send(steps);
    }
}

/// Moves intervals along between events, a hundred times per interval (every
/// 10 ms at most): a zone of many hosts closes an interval 10 ms after its end
/// (`spillway_loop::zone::QUORUM_WAIT`), and a coarser tick would add its own wait to that.
pub(super) async fn ticker(region: Arc<Region>, mut stop: Stop) {
    loop {
        let period = {
            let mut state = region.lock();
            let steps = state.core.poll(now_ms());
            state.send(steps);
            Duration::from_millis((state.core.interval().ms() / 100).clamp(2, 10))
        };
        if sleep_or_stop(period, &mut stop).await {
            return;
        }
    }
}

/// Hands every new rules snapshot to the core, which sends it down with the next instructions.
pub(super) async fn follow_rules(
    region: Arc<Region>,
    mut rules: watch::Receiver<Arc<RulesSnapshot>>,
    mut stop: Stop,
) {
    loop {
        tokio::select! {
            changed = rules.changed() => {
                if changed.is_err() {
                    return;
                }
                let snapshot = rules.borrow_and_update().clone();
                tracing::info!(version = snapshot.version, "sending new rules down");
                let mut state = region.lock();
                let now = now_ms();
                state.record.on_rules(snapshot.version, now);
                state.core.set_rules(snapshot, now);
            }
            _ = stop.changed() => return,
        }
    }
}

/// Follows the controller lease: each change of leadership goes to the region's state (the
/// epoch its instructions carry, the aggregators' streams a controller that stopped leading
/// ends).
pub(super) async fn follow_leadership(
    region: Arc<Region>,
    mut leadership: watch::Receiver<Leadership>,
    mut stop: Stop,
) {
    loop {
        tokio::select! {
            changed = leadership.changed() => {
                if changed.is_err() {
                    // The campaign ended (the process is stopping): lead no more.
                    region.lock().lead(Leadership::standby());
                    return;
                }
                let next = leadership.borrow_and_update().clone();
                region.lock().lead(next);
            }
            _ = stop.changed() => return,
        }
    }
}
