//! Clients of the zone in the aggregator's own process: an Envoy instance on the RLQS listener
//! is a host of the zone like a sidecar, but it speaks Envoy's protocol, so whoever
//! serves that protocol reports for it here and takes its instructions from here, with no
//! control-plane stream between them ([`spillway_link::ZoneClients`], which is all the RLQS
//! service sees of the aggregator). The zone's core cannot tell the two kinds of host apart.

use std::sync::Arc;
use std::sync::atomic::Ordering;

pub use spillway_link::InstructionsRx;
use spillway_link::{LocalRefusal, ZoneClient, ZoneClients, now_ms};
use spillway_proto::v1;
use tokio::sync::mpsc;

use super::{Outlet, Zone};

/// Attaches in-process clients to a running aggregator ([`super::Aggregator::local_clients`]).
#[derive(Clone)]
pub struct LocalClients {
    zone: Arc<Zone>,
}

impl std::fmt::Debug for LocalClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalClients")
            .field("region", &self.zone.region)
            .field("zone", &self.zone.zone)
            .finish()
    }
}

impl LocalClients {
    pub(super) fn new(zone: Arc<Zone>) -> Self {
        Self { zone }
    }

    /// The aggregator's region.
    pub fn region(&self) -> &str {
        &self.zone.region
    }

    /// The aggregator's zone.
    pub fn zone(&self) -> &str {
        &self.zone.zone
    }

    /// The rules the zone runs now (`None` before the controller sent any), so a client that
    /// joins can run them at once rather than an interval later.
    pub fn rules(&self) -> Option<v1::Rules> {
        self.zone.lock().core.rules().cloned()
    }

    /// Counts a client refused by whoever serves it (an RLQS stream over a cap) in
    /// `spillway_control_plane_rejected_total{reason}`.
    pub fn refused(&self, reason: crate::trust::Reason) {
        self.zone.trust.count(reason);
    }

    /// A client reporting as `host`, and where its instructions arrive. It leaves the zone when
    /// the [`LocalClient`] is dropped, as a stream's host does when its stream ends.
    pub fn attach(&self, host: impl Into<String>) -> (LocalClient, InstructionsRx) {
        let (tx, rx) = mpsc::channel(8);
        self.zone.local.fetch_add(1, Ordering::Relaxed);
        let client = LocalClient {
            zone: self.zone.clone(),
            host: host.into(),
            conn: self.zone.next_conn.fetch_add(1, Ordering::Relaxed),
            outlet: Outlet::Local(tx),
        };
        (client, rx)
    }
}

impl ZoneClients for LocalClients {
    fn region(&self) -> &str {
        LocalClients::region(self)
    }

    fn zone(&self) -> &str {
        LocalClients::zone(self)
    }

    fn rules(&self) -> Option<v1::Rules> {
        LocalClients::rules(self)
    }

    fn refused(&self, why: LocalRefusal) {
        LocalClients::refused(
            self,
            match why {
                LocalRefusal::RlqsStreams => crate::trust::Reason::RlqsStreams,
                LocalRefusal::RlqsBuckets => crate::trust::Reason::RlqsBuckets,
            },
        );
    }

    fn attach(&self, host: String) -> (Box<dyn ZoneClient>, InstructionsRx) {
        let (client, instructions) = LocalClients::attach(self, host);
        (Box::new(client), instructions)
    }
}

/// One in-process client of the zone (see [`LocalClients::attach`]).
pub struct LocalClient {
    zone: Arc<Zone>,
    host: String,
    conn: u64,
    /// Its instructions' channel.
    outlet: Outlet,
}

impl std::fmt::Debug for LocalClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalClient")
            .field("host", &self.host)
            .field("conn", &self.conn)
            .finish()
    }
}

impl LocalClient {
    /// The host id its reports carry.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Counts `report` in the zone as a report of this client's host (its host id, region and
    /// zone are set to this client's).
    pub fn report(&self, mut report: v1::Report) {
        report.host_id.clone_from(&self.host);
        report.region.clone_from(&self.zone.region);
        report.zone.clone_from(&self.zone.zone);
        let mut state = self.zone.lock();
        state.attach(&self.host, &self.outlet);
        let steps = state.core.on_report(now_ms(), self.conn, report);
        state.send(steps);
    }
}

impl ZoneClient for LocalClient {
    fn host(&self) -> &str {
        LocalClient::host(self)
    }

    fn report(&self, report: v1::Report) {
        LocalClient::report(self, report);
    }
}

impl Drop for LocalClient {
    fn drop(&mut self) {
        self.zone.local.fetch_sub(1, Ordering::Relaxed);
        let mut state = self.zone.lock();
        state.detach(&self.host, &self.outlet);
        let steps = state.core.on_stream_end(now_ms(), &self.host, self.conn);
        state.send(steps);
    }
}
