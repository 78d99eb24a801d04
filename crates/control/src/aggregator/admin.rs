//! What an aggregator shows on its admin listener: ready while linked to its controller, and its
//! metrics.

use std::sync::atomic::Ordering;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spillway_net::AdminView;

use super::Zone;

impl AdminView for Zone {
    fn ready(&self) -> Result<String, String> {
        if self.connected.load(Ordering::Relaxed) {
            Ok(format!(
                "zone {} linked to its controller",
                self.lock().core.zone()
            ))
        } else {
            Err("no stream to the controller".into())
        }
    }

    fn metrics(&self) -> String {
        let state = self.lock();
        let gauge = |value: u64| {
            let g = Gauge::<i64>::default();
            g.set(i64::try_from(value).unwrap_or(i64::MAX));
            g
        };
        let counter = |value: u64| {
            let c = Counter::<u64>::default();
            c.inc_by(value);
            c
        };
        let mut registry = Registry::default();
        registry.register(
            "spillway_control_plane_connected",
            "1 while the stream to the region's controller is open",
            gauge(u64::from(self.connected.load(Ordering::Relaxed))),
        );
        registry.register(
            "spillway_aggregator_clients",
            "Clients with an open stream",
            gauge(state.core.hosts() as u64),
        );
        registry.register(
            "spillway_aggregator_local_clients",
            "Clients in this process with an open stream: RLQS hosts on the RLQS listener (--rlqs-listen; an identity, or a connection, whatever its streams), each counted in spillway_aggregator_clients from its first report",
            gauge(self.local.load(Ordering::Relaxed)),
        );
        registry.register(
            "spillway_rules_version",
            "Version of the rules the controller sends down",
            gauge(state.core.rules_version()),
        );
        registry.register(
            "spillway_aggregator_late_reports",
            "Reports that arrived after their interval was forwarded",
            counter(state.core.late_reports()),
        );
        registry.register(
            "spillway_aggregator_controller_epoch",
            "The controller lease's epoch whose instructions this zone follows (0: a controller without a lease)",
            gauge(state.core.fence().epoch()),
        );
        registry.register(
            "spillway_aggregator_stale_instructions",
            "Instructions dropped because they came from an older controller epoch than the one followed",
            counter(state.core.fence().dropped()),
        );
        registry.register(
            "spillway_aggregator_intervals_forwarded",
            "Zone sums sent to the controller",
            counter(state.core.forwarded()),
        );
        let clamped = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
        for (reason, n) in state.core.clamped().iter() {
            clamped
                .get_or_create(&vec![("reason", reason.label())])
                .inc_by(n);
        }
        registry.register(
            "spillway_control_plane_clamped",
            "Counts in clients' reports lowered as implausible before the zone's sums, by reason",
            clamped,
        );
        registry.register(
            "spillway_control_plane_rejected",
            "Control-plane peers refused (a failed handshake, a certificate of the wrong role, region, zone or host id), by reason",
            self.trust.metric(),
        );
        drop(state);
        let mut out = String::new();
        let _ = encode(&mut out, &registry);
        out
    }
}
