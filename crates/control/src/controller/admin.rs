//! What a controller shows on its admin listener: its buckets' limits, offered load and drop
//! ratios as metrics and on `/v1/buckets` (their last minutes on `/v1/history`), which host runs
//! which rules version on `/v1/hosts`, its zones' and peers' health on `/v1/zones`, the rules
//! store's latest changes on `/v1/rules/changes`, and the live dashboard on `/` that draws them.

use std::collections::BTreeMap;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use spillway_core::algo::Kind;
use spillway_core::config::Scope;
use spillway_core::decision::Mode;
use spillway_link::now_ms;
use spillway_loop::BucketKey;
use spillway_net::AdminView;

use super::Region;
use super::history::{History, MIN_SLOT_MS, SLOTS, Sample};

impl AdminView for Region {
    fn ready(&self) -> Result<String, String> {
        let state = self.lock();
        let role = if state.leadership.leads_at(std::time::Instant::now()) {
            "leading"
        } else {
            "standing by"
        };
        Ok(format!(
            "region {}, rules version {}, {} zone(s), {role} at epoch {}",
            self.region,
            state.core.rules().version,
            state.core.zones(),
            state.leadership.epoch,
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
        let moved = Counter::<u64>::default();
        moved.inc_by(state.core.moved_hosts());
        registry.register(
            "spillway_controller_hosts_moved",
            "Hosts an aggregator reported that another aggregator had reported before (a zone's hosts failing over to its other aggregator): each counts at the new one only",
            moved,
        );
        let leader = Gauge::<i64>::default();
        leader.set(i64::from(
            state.leadership.leads_at(std::time::Instant::now()),
        ));
        registry.register(
            "spillway_controller_leader",
            "1 while this controller leads its region (holds the controller lease), else 0",
            leader,
        );
        let epoch = Gauge::<i64>::default();
        epoch.set(i64::try_from(state.leadership.epoch).unwrap_or(i64::MAX));
        registry.register(
            "spillway_controller_epoch",
            "The controller lease's epoch: this controller's own while it leads, else the latest it saw (0 without a lease store)",
            epoch,
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
        &[
            "/v1/hosts",
            "/v1/buckets",
            "/v1/history",
            "/v1/zones",
            "/v1/rules/changes",
        ]
    }

    fn dashboard(&self) -> Option<&'static str> {
        Some(DASHBOARD)
    }

    fn dashboard_script(&self) -> Option<&'static str> {
        Some(DASHBOARD_SCRIPT)
    }

    fn json(&self, path: &str) -> Option<String> {
        match path {
            "/v1/hosts" => Some(self.hosts_json()),
            "/v1/buckets" => Some(self.buckets_json()),
            "/v1/history" => Some(self.history_json()),
            "/v1/zones" => Some(self.zones_json()),
            "/v1/rules/changes" => Some(self.changes_json()),
            _ => None,
        }
    }
}

/// The live page on `/` of a controller's admin listener, drawn in the browser from the JSON
/// paths above and refreshed every second: the buckets (the one in trouble first) with their
/// last minutes as charts, the zones' and peers' health, the rollout of the rules and their
/// recent changes. Built into the binary; it loads nothing from anywhere else.
const DASHBOARD: &str = include_str!("dashboard.html");

/// The dashboard's script, on `/dashboard.js`: a file of its own, since the admin listener's
/// content security policy runs no inline script.
const DASHBOARD_SCRIPT: &str = include_str!("dashboard.js");

/// A bucket's figures copied out of the lock: its key, configuration and history.
struct BucketCopy {
    key: BucketKey,
    scope: Scope,
    mode: Mode,
    algorithm: Kind,
    latest: Sample,
    points: Vec<(u64, Sample)>,
}

impl Region {
    /// Every control-plane bucket the core computed, in configuration order, with its history
    /// when `points` (copied under the lock, serialized by the caller without it).
    fn bucket_copies(&self, points: bool) -> (Vec<BucketCopy>, u64, u64) {
        let state = self.lock();
        let view = state.core.view();
        let rules = state.core.rules();
        let copies = rules
            .config
            .buckets()
            .filter_map(|(service, bucket)| {
                let key = BucketKey::new(&service.name, &bucket.name);
                let v = view.get(&key)?;
                let history = state.record.history(&key);
                // Computed but not yet sampled (the first interval): the view as it is.
                let latest = history.map(History::latest).unwrap_or(Sample {
                    limit_rps: v.limit_rps,
                    offered_rps: v.observed_rps,
                    admitted_rps: v.admitted_rps,
                    drop_ratio: v.drop_ratio,
                    real_drop_rps: (v.observed_rps - v.admitted_rps).max(0.0),
                    shadow_drop_rps: 0.0,
                });
                Some(BucketCopy {
                    key,
                    scope: bucket.scope,
                    mode: bucket.mode,
                    algorithm: bucket.algorithm,
                    latest,
                    points: match (points, history) {
                        (true, Some(h)) => h.points().collect(),
                        _ => Vec::new(),
                    },
                })
            })
            .collect();
        (copies, rules.version, state.core.interval().ms())
    }

    /// `/v1/buckets`: every control-plane bucket as last computed, in configuration order.
    fn buckets_json(&self) -> String {
        let (copies, version, interval_ms) = self.bucket_copies(false);
        let buckets: Vec<Value> = copies
            .iter()
            .map(|b| {
                json!({
                    "service": b.key.service,
                    "bucket": b.key.bucket,
                    "scope": b.scope,
                    "mode": b.mode,
                    "algorithm": b.algorithm,
                    "limit_rps": b.latest.limit_rps,
                    "offered_rps": b.latest.offered_rps,
                    "admitted_rps": b.latest.admitted_rps,
                    "drop_ratio": b.latest.drop_ratio,
                    "real_drop_rps": b.latest.real_drop_rps,
                    "shadow_drop_rps": b.latest.shadow_drop_rps,
                })
            })
            .collect();
        json!({
            "region": self.region,
            "rules_version": version,
            "interval_ms": interval_ms,
            "buckets": buckets,
        })
        .to_string()
    }

    /// `/v1/history`: the last minutes of every control-plane bucket, one point per slot
    /// (`slot_ms`: a second, or the interval when it is longer), as columns.
    fn history_json(&self) -> String {
        let (copies, _, interval_ms) = self.bucket_copies(true);
        let column = |b: &BucketCopy, f: fn(&Sample) -> f64| -> Vec<f64> {
            b.points.iter().map(|(_, s)| round(f(s))).collect()
        };
        let buckets: Vec<Value> = copies
            .iter()
            .map(|b| {
                json!({
                    "service": b.key.service,
                    "bucket": b.key.bucket,
                    "t_ms": b.points.iter().map(|(t, _)| *t).collect::<Vec<u64>>(),
                    "limit_rps": column(b, |s| s.limit_rps),
                    "offered_rps": column(b, |s| s.offered_rps),
                    "admitted_rps": column(b, |s| s.admitted_rps),
                    "drop_ratio": column(b, |s| s.drop_ratio),
                    "real_drop_rps": column(b, |s| s.real_drop_rps),
                    "shadow_drop_rps": column(b, |s| s.shadow_drop_rps),
                })
            })
            .collect();
        json!({
            "region": self.region,
            "now_ms": now_ms(),
            "interval_ms": interval_ms,
            "slot_ms": interval_ms.max(MIN_SLOT_MS),
            "slots": SLOTS,
            "buckets": buckets,
        })
        .to_string()
    }

    /// `/v1/zones`: the control plane's health as this controller sees it: each zone's last
    /// report, hosts and instructions, this region's computing, and the peer regions.
    fn zones_json(&self) -> String {
        let now = now_ms();
        let state = self.lock();
        let control = &state.core.rules().config.control;
        let ttl_ms = u64::try_from(control.instruction_ttl.as_millis()).unwrap_or(u64::MAX);
        let interval_ms = state.core.interval().ms();
        let version = state.core.rules().version;
        let hosts = state.core.hosts();
        let age = |at: Option<u64>| at.map(|at| now.saturating_sub(at));
        let zones: Vec<Value> = state
            .record
            .zones()
            .iter()
            .map(|(name, z)| {
                let of_zone = || hosts.iter().filter(|h| h.zone == *name);
                let instructions_age = age(z.last_instructions_ms);
                json!({
                    "zone": name,
                    "connected": z.streams > 0,
                    "streams": z.streams,
                    "last_report_age_ms": age(z.last_report_ms),
                    "last_sequence": z.last_sequence,
                    "clients": z.clients(),
                    "hosts": of_zone().count(),
                    "hosts_current": of_zone().filter(|h| h.rules_version == version).count(),
                    "instructions_age_ms": instructions_age,
                    "instructions": instructions_state(instructions_age, interval_ms, ttl_ms),
                    "instructions_missed": z.missed,
                    "disconnected_age_ms": age(z.left_ms),
                    "health": zone_health(z.streams > 0, age(z.last_report_ms), interval_ms, ttl_ms),
                })
            })
            .collect();
        let peers: Vec<Value> = state
            .record
            .peers()
            .iter()
            .map(|(region, &heard)| {
                let heard_age = now.saturating_sub(heard);
                json!({
                    "region": region,
                    "last_heard_age_ms": heard_age,
                    "live": heard_age < ttl_ms,
                })
            })
            .collect();
        json!({
            "region": self.region,
            "rules_version": version,
            "interval_ms": interval_ms,
            "instruction_ttl_ms": ttl_ms,
            "zones_connected": state.core.zones(),
            "computed": state.core.computed(),
            "last_computed_age_ms": age(state.record.last_computed_ms()),
            "peers_configured": self.peers_configured,
            "zones": zones,
            "peers": peers,
        })
        .to_string()
    }

    /// `/v1/hosts`: which host runs which rules version, and whether all run the current one;
    /// the rollout (hosts per version) and since when each runs its version.
    fn hosts_json(&self) -> String {
        let now = now_ms();
        let state = self.lock();
        let version = state.core.rules().version;
        let hosts = state.core.hosts();
        let converged = hosts.iter().all(|h| h.rules_version == version);
        let mut rollout: BTreeMap<u64, usize> = BTreeMap::new();
        for h in &hosts {
            *rollout.entry(h.rules_version).or_default() += 1;
        }
        let map: serde_json::Map<String, Value> = hosts
            .iter()
            .map(|h| {
                let since = state.record.host_since(&h.host_id, h.rules_version);
                (
                    h.host_id.clone(),
                    json!({
                        "zone": h.zone,
                        "rules_version": h.rules_version,
                        "version_age_ms": since.map(|at| now.saturating_sub(at)),
                    }),
                )
            })
            .collect();
        let since = state.record.rules_since(version);
        json!({
            "region": self.region,
            "rules_version": version,
            "rules_version_age_ms": since.map(|at| now.saturating_sub(at)),
            "converged": converged,
            "rollout": rollout
                .iter()
                .rev()
                .map(|(v, n)| json!({ "rules_version": v, "hosts": n }))
                .collect::<Vec<_>>(),
            "hosts": map,
        })
        .to_string()
    }

    /// `/v1/rules/changes`: the rules store's latest changes, newest first, or `"source": null`
    /// when the controller was given none (`ControllerOptions::changes`).
    fn changes_json(&self) -> String {
        let Some(changes) = &self.changes else {
            return json!({ "source": null, "changes": [] }).to_string();
        };
        let changes = changes.borrow().clone();
        let list: Vec<Value> = changes
            .iter()
            .map(|c| {
                json!({
                    "version": c.version,
                    "at": c.at,
                    "actor": c.actor,
                    "action": c.action,
                    "summary": c.summary,
                    "reason": c.reason,
                })
            })
            .collect();
        json!({ "source": "rules store", "changes": list }).to_string()
    }
}

/// The instructions a zone last got, by age: `live` within two intervals, `late` after that,
/// `expired` from the instruction TTL on (its hosts fail open), `none` before the first.
fn instructions_state(age_ms: Option<u64>, interval_ms: u64, ttl_ms: u64) -> &'static str {
    match age_ms {
        None => "none",
        Some(age) if age >= ttl_ms => "expired",
        Some(age) if age > 2 * interval_ms => "late",
        Some(_) => "live",
    }
}

/// A zone at a glance: `ok` while its reports arrive every interval, `late` when the last is
/// over two intervals old, `down` with no stream open or no report within the TTL.
fn zone_health(
    connected: bool,
    report_age_ms: Option<u64>,
    interval_ms: u64,
    ttl_ms: u64,
) -> &'static str {
    match report_age_ms {
        _ if !connected => "down",
        None => "down",
        Some(age) if age >= ttl_ms => "down",
        Some(age) if age > 2 * interval_ms => "late",
        Some(_) => "ok",
    }
}

/// Rates to three decimals: charts need no more, and the page stays small.
fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_live_then_late_then_expired_with_the_ttl() {
        assert_eq!(instructions_state(None, 1000, 5000), "none");
        assert_eq!(instructions_state(Some(1500), 1000, 5000), "live");
        assert_eq!(instructions_state(Some(2001), 1000, 5000), "late");
        assert_eq!(instructions_state(Some(5000), 1000, 5000), "expired");
    }

    #[test]
    fn a_zone_is_down_without_a_stream_or_a_report_within_the_ttl() {
        assert_eq!(zone_health(true, Some(900), 1000, 5000), "ok");
        assert_eq!(zone_health(true, Some(2500), 1000, 5000), "late");
        assert_eq!(zone_health(true, Some(5000), 1000, 5000), "down");
        assert_eq!(zone_health(true, None, 1000, 5000), "down");
        assert_eq!(zone_health(false, Some(10), 1000, 5000), "down");
    }
}
