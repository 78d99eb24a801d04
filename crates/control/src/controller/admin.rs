//! What a controller shows on its admin listener: its buckets' limits, offered load and drop
//! ratios as metrics and on `/v1/buckets`, which host runs which rules version on `/v1/hosts`,
//! and the live dashboard on `/`.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spillway_link::now_ms;
use spillway_loop::BucketKey;
use spillway_net::AdminView;

use super::Region;

impl AdminView for Region {
    fn ready(&self) -> Result<String, String> {
        let state = self.lock();
        Ok(format!(
            "region {}, rules version {}, {} zone(s)",
            self.region,
            state.core.rules().version,
            state.core.zones()
        ))
    }

    fn metrics(&self) -> String {
        type Labels = Vec<(&'static str, String)>;
        type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
        let state = self.lock();
        let mut registry = Registry::default();
        let limit = Family::<Labels, FloatGauge>::default();
        let observed = Family::<Labels, FloatGauge>::default();
        let ratio = Family::<Labels, FloatGauge>::default();
        for (key, view) in state.core.view() {
            let labels = vec![
                ("service", key.service.clone()),
                ("bucket", key.bucket.clone()),
            ];
            limit.get_or_create(&labels).set(view.limit_rps);
            observed.get_or_create(&labels).set(view.observed_rps);
            ratio.get_or_create(&labels).set(view.drop_ratio);
        }
        registry.register(
            "spillway_bucket_limit_rps",
            "The bucket's limit as a rate per second",
            limit,
        );
        registry.register(
            "spillway_bucket_observed_rps",
            "Offered load over the bucket's scope in the last interval, per second",
            observed,
        );
        registry.register(
            "spillway_drop_ratio",
            "Drop ratio sent for the bucket (a zone-scoped bucket: its highest zone)",
            ratio,
        );
        let version = Gauge::<i64>::default();
        version.set(i64::try_from(state.core.rules().version).unwrap_or(i64::MAX));
        registry.register(
            "spillway_rules_version",
            "Version of the rules this controller sends down",
            version,
        );
        let zones = Gauge::<i64>::default();
        zones.set(i64::try_from(state.core.zones()).unwrap_or(i64::MAX));
        registry.register(
            "spillway_controller_zones",
            "Aggregators with an open stream",
            zones,
        );
        let peers = Gauge::<i64>::default();
        peers.set(i64::try_from(state.core.live_peers(now_ms()).len()).unwrap_or(i64::MAX));
        registry.register(
            "spillway_controller_live_peers",
            "Peer regions heard from within the instruction TTL",
            peers,
        );
        registry.register(
            "spillway_control_plane_rejected",
            "Control-plane peers refused (a failed handshake, a certificate of the wrong role, region or zone), by reason",
            self.trust.metric(),
        );
        drop(state);
        let mut out = String::new();
        let _ = encode(&mut out, &registry);
        out
    }

    fn json_paths(&self) -> &'static [&'static str] {
        &["/v1/hosts", "/v1/buckets"]
    }

    fn dashboard(&self) -> Option<&'static str> {
        Some(DASHBOARD)
    }

    fn json(&self, path: &str) -> Option<String> {
        match path {
            "/v1/hosts" => Some(self.hosts_json()),
            "/v1/buckets" => Some(self.buckets_json()),
            _ => None,
        }
    }
}

/// The live page on `/` of a controller's admin listener: its buckets (limit, offered, drop
/// ratio, two minutes of history drawn in the page) and which host runs which rules version,
/// from `/v1/buckets` and `/v1/hosts`, refreshed every second.
const DASHBOARD: &str = include_str!("dashboard.html");

impl Region {
    /// `/v1/buckets`: every control-plane bucket as last computed, in configuration order.
    fn buckets_json(&self) -> String {
        let state = self.lock();
        let view = state.core.view();
        let interval = state.core.interval();
        let rules = state.core.rules();
        let buckets: Vec<serde_json::Value> = rules
            .config
            .buckets()
            .filter_map(|(service, bucket)| {
                let key = BucketKey::new(&service.name, &bucket.name);
                let v = view.get(&key)?;
                Some(serde_json::json!({
                    "service": key.service,
                    "bucket": key.bucket,
                    "scope": bucket.scope,
                    "limit_rps": v.limit_rps,
                    "offered_rps": v.observed_rps,
                    "admitted_rps": v.admitted_rps,
                    "drop_ratio": v.drop_ratio,
                }))
            })
            .collect();
        serde_json::json!({
            "region": self.region,
            "rules_version": state.core.rules().version,
            "interval_ms": interval.ms(),
            "buckets": buckets,
        })
        .to_string()
    }

    /// `/v1/hosts`: which host runs which rules version, and whether all run the current one.
    fn hosts_json(&self) -> String {
        let (version, hosts) = {
            let state = self.lock();
            (state.core.rules().version, state.core.hosts())
        };
        let converged = hosts.iter().all(|h| h.rules_version == version);
        let map: serde_json::Map<String, serde_json::Value> = hosts
            .into_iter()
            .map(|h| {
                (
                    h.host_id,
                    serde_json::json!({ "zone": h.zone, "rules_version": h.rules_version }),
                )
            })
            .collect();
        serde_json::json!({
            "region": self.region,
            "rules_version": version,
            "converged": converged,
            "hosts": map,
        })
        .to_string()
    }
}
