//! The aggregator's gRPC service: one stream per client, its reports into the zone's core; and
//! the ticker that closes overdue intervals between reports.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use spillway_link::{Stop, now_ms, sleep_or_stop};
use spillway_proto::v1;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{Outlet, Zone};
use crate::trust::{self, Reason, Refusal};

pub(super) struct Service {
    pub(super) zone: Arc<Zone>,
    pub(super) stop: Stop,
}

#[tonic::async_trait]
impl spillway_proto::encoded::aggregator_server::Aggregator for Service {
    type LinkStream = ReceiverStream<Result<spillway_proto::codec::Encoded, Status>>;

    async fn link(
        &self,
        request: Request<Streaming<v1::Report>>,
    ) -> Result<Response<Self::LinkStream>, Status> {
        let zone = self.zone.clone();
        // With TLS: a proxy of this zone, which may report under its certificate's host id only.
        let certified = match zone.trust.peer(&request)? {
            None => None,
            Some((identity, name)) => {
                match trust::rules::proxy_of(&identity, &zone.region, &zone.zone) {
                    Ok(host) => Some((host, name)),
                    Err(refusal) => return Err(zone.trust.reject(&refusal, &name)),
                }
            }
        };
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(8);
        let outlet = Outlet::Stream(tx.clone());
        let mut stop = self.stop.clone();
        let conn = zone.next_conn.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let mut host: Option<String> = None;
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(report)) => {
                            if let Some((host, name)) = &certified
                                && let Err(refusal) = claims(&report, host, &zone.region, &zone.zone)
                            {
                                let status = zone.trust.reject(&refusal, name);
                                let _ = tx.try_send(Err(status));
                                break;
                            }
                            let mut state = zone.lock();
                            if host.as_deref() != Some(report.host_id.as_str()) {
                                if let Some(old) = host.take() {
                                    let steps = state.core.on_stream_end(now_ms(), &old, conn);
                                    state.send(steps);
                                }
                                host = Some(report.host_id.clone());
                            }
                            // The newest stream of a host is the one its instructions go to.
                            state.attach(&report.host_id, &outlet);
                            if !report.surge {
                                state.spans.on_report(report.sequence);
                            }
                            let steps = state.core.on_report(now_ms(), conn, report);
                            state.send(steps);
                        }
                        _ => break,
                    },
                    _ = stop.changed() => break,
                }
            }
            if let Some(host) = host {
                let mut state = zone.lock();
                state.detach(&host, &outlet);
                let steps = state.core.on_stream_end(now_ms(), &host, conn);
                state.send(steps);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Whether a certified proxy's report claims what its certificate says: its host id, region and
/// zone.
fn claims(report: &v1::Report, host: &str, region: &str, zone: &str) -> Result<(), Refusal> {
    let refuse = |reason, message: String| Err(Refusal { reason, message });
    if report.host_id != host {
        return refuse(
            Reason::HostId,
            format!(
                "the certificate names host {host}, the report host {:?}",
                report.host_id
            ),
        );
    }
    if !report.region.is_empty() && report.region != region {
        return refuse(
            Reason::Region,
            format!(
                "a report of region {:?} at region {region}'s aggregator",
                report.region
            ),
        );
    }
    if !report.zone.is_empty() && report.zone != zone {
        return refuse(
            Reason::Zone,
            format!(
                "a report of zone {:?} at zone {zone}'s aggregator",
                report.zone
            ),
        );
    }
    Ok(())
}

/// Closes overdue intervals between reports, a hundred times per interval (every
/// 10 ms at most): a zone of many hosts closes an interval 10 ms after its end
/// (`spillway_loop::zone::QUORUM_WAIT`), and a coarser tick would add its own wait to that.
pub(super) async fn ticker(zone: Arc<Zone>, mut stop: Stop) {
    loop {
        let period = {
            let mut state = zone.lock();
            let steps = state.core.poll(now_ms());
            state.send(steps);
            Duration::from_millis((state.core.interval().ms() / 100).clamp(2, 10))
        };
        if sleep_or_stop(period, &mut stop).await {
            return;
        }
    }
}
