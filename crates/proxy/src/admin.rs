//! The admin listener: `/healthz`, `/readyz` and `/metrics` (Prometheus text format).
//!
//! Metrics are read from the client's counters at scrape time into a fresh registry, so the hot
//! path keeps its striped counters and nothing is kept twice. Labels are the service and bucket
//! names of the configuration only: per-subject buckets never turn subjects into label values.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use spillway_net::AdminView;

use spillway_client::Client;
use spillway_client::control::{LinkStatus, control_plane_live};
use spillway_core::concurrency::Gate;
use spillway_core::criticality::Criticality;

use crate::shared::Shared;

type Labels = Vec<(&'static str, String)>;

/// The proxy as its admin listener shows it (`spillway_net::admin` serves it).
pub(crate) struct ProxyView(pub(crate) Arc<Shared>);

impl AdminView for ProxyView {
    /// Standalone, the rules are loaded before the listener opens, so serving means ready.
    fn ready(&self) -> Result<String, String> {
        Ok(format!("rules version {}", self.0.client.rules().version()))
    }

    fn metrics(&self) -> String {
        metrics(&self.0)
    }
}

/// The metrics of a proxy, in the Prometheus text format: its engine's and its own.
pub(crate) fn metrics(shared: &Shared) -> String {
    let mut registry = Registry::default();
    register_engine(&mut registry, &shared.client, shared.link.as_deref());
    let cut = Counter::<u64>::default();
    cut.inc_by(shared.drain_cut.load(Ordering::Relaxed));
    registry.register(
        "spillway_drain_cut",
        "Requests answered 503 because the drain timeout passed while they waited on the upstream",
        cut,
    );
    let open = Gauge::<i64>::default();
    open.set(i64::try_from(shared.connections.open()).unwrap_or(i64::MAX));
    registry.register(
        "spillway_connections",
        "Downstream connections open now (at most --max-connections)",
        open,
    );
    let refused = Counter::<u64>::default();
    refused.inc_by(shared.connections.refused());
    registry.register(
        "spillway_connections_refused",
        "Downstream connections accepted and closed at once because --max-connections were open",
        refused,
    );
    let upstream = Counter::<u64>::default();
    upstream.inc_by(shared.upstream_errors.load(Ordering::Relaxed));
    registry.register(
        "spillway_upstream_errors",
        "Requests answered 502 or 504 because the upstream could not be reached or timed out",
        upstream,
    );
    let refusals = Family::<Labels, Counter>::default();
    for refusal in crate::answer::Refusal::ALL {
        refusals
            .get_or_create(&vec![("reason", refusal.reason().to_owned())])
            .inc_by(shared.refusals.get(refusal));
    }
    registry.register(
        "spillway_requests_refused",
        "Requests the proxy answered itself for a fault of the client's, by reason: bad_host and bad_identity and bad_body (400), body_timeout (408), unsupported_transfer_coding (501); never forwarded, never upstream errors",
        refusals,
    );
    let upgrades = Counter::<u64>::default();
    upgrades.inc_by(shared.upgrades.load(Ordering::Relaxed));
    registry.register(
        "spillway_upgrades",
        "HTTP/1.1 upgrades (WebSockets) the upstream accepted and the proxy tunnelled",
        upgrades,
    );
    let by_bucket = Family::<Labels, Counter>::default();
    if let Ok(counts) = shared.bucket_upgrades.lock() {
        for ((service, bucket), n) in counts.iter() {
            by_bucket
                .get_or_create(&vec![
                    ("service", service.clone()),
                    ("bucket", bucket.clone()),
                ])
                .inc_by(*n);
        }
    }
    registry.register(
        "spillway_bucket_upgrades",
        "Upgrades (WebSockets) tunnelled, by the buckets their handshakes matched; what passes in a tunnel is not decided",
        by_bucket,
    );
    let refused = Family::<Labels, Counter>::default();
    for (reason, n) in [
        ("protocol", &shared.upgrades_removed),
        ("handshake", &shared.upgrades_bad_switch),
    ] {
        refused
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc_by(n.load(Ordering::Relaxed));
    }
    registry.register(
        "spillway_upgrades_refused",
        "Upgrades not tunnelled, by reason: protocol (a protocol proxy.upgrades does not allow, or a WebSocket without its key: the upgrade removed, the request decided and forwarded as a plain one), handshake (the upstream's 101 was not the handshake asked for: answered 502, both connections closed)",
        refused,
    );
    register_concurrency(&mut registry, &shared.concurrency);
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &registry);
    out
}

/// The in-flight limit on the upstream: the limit and the requests in flight (0 and
/// 0 without a `concurrency` section), and the requests refused by tier, all four always shown.
fn register_concurrency(registry: &mut Registry, gate: &Gate) {
    let limit = Gauge::<i64>::default();
    limit.set(i64::from(gate.limit()));
    registry.register(
        "spillway_concurrency_limit",
        "Requests the concurrency limit lets be in flight to the upstream now (0 without a concurrency section)",
        limit,
    );
    let inflight = Gauge::<i64>::default();
    inflight.set(i64::from(gate.inflight()));
    registry.register(
        "spillway_concurrency_inflight",
        "Requests admitted by the concurrency limit and waiting on the upstream's answer",
        inflight,
    );
    let rejected = Family::<Labels, Counter>::default();
    for tier in Criticality::ALL {
        rejected
            .get_or_create(&vec![("criticality", tier.name().to_owned())])
            .inc_by(gate.rejected(tier));
    }
    registry.register(
        "spillway_concurrency_rejected",
        "Requests answered 503 (gRPC RESOURCE_EXHAUSTED) because the concurrency limit was reached for their tier",
        rejected,
    );
}

/// The metrics of an engine (a client with its control-plane link, if linked) that every
/// process deciding with one shows: the proxy, and `spillway rls`.
fn register_engine(registry: &mut Registry, client: &Client, link: Option<&LinkStatus>) {
    let requests = Family::<Labels, Counter>::default();
    let drop_ratio = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let limit_rps = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let subjects = Family::<Labels, Gauge>::default();
    let overflow = Family::<Labels, Counter>::default();
    for stats in client.stats() {
        // A candidate's twin shows only as its bucket's `candidate_dropped`.
        if let Some(parent) = spillway_core::config::candidate_of(&stats.bucket) {
            for tier in Criticality::ALL {
                let labels = vec![
                    ("service", stats.service.clone()),
                    ("bucket", parent.to_owned()),
                    ("decision", "candidate_dropped".to_owned()),
                    ("criticality", tier.name().to_owned()),
                ];
                requests
                    .get_or_create(&labels)
                    .inc_by(stats.counters.tier(tier).shadow_dropped);
            }
            continue;
        }
        let bucket = || {
            vec![
                ("service", stats.service.clone()),
                ("bucket", stats.bucket.clone()),
            ]
        };
        for tier in Criticality::ALL {
            let counts = stats.counters.tier(tier);
            for (decision, n) in [
                ("allowed", counts.allowed),
                ("dropped", counts.dropped),
                ("shadow_dropped", counts.shadow_dropped),
            ] {
                let mut labels = bucket();
                labels.push(("decision", decision.to_owned()));
                labels.push(("criticality", tier.name().to_owned()));
                requests.get_or_create(&labels).inc_by(n);
            }
        }
        if let Some(ratio) = stats.drop_ratio {
            drop_ratio.get_or_create(&bucket()).set(ratio);
        }
        limit_rps
            .get_or_create(&bucket())
            .set(stats.limit.per_second());
        if let Some(n) = stats.subjects {
            subjects
                .get_or_create(&bucket())
                .set(i64::try_from(n).unwrap_or(i64::MAX));
            overflow
                .get_or_create(&bucket())
                .inc_by(stats.subject_overflow);
        }
    }
    registry.register(
        "spillway_requests",
        "Requests decided per bucket and criticality tier: allowed, dropped, shadow_dropped (virtual drops, forwarded), or candidate_dropped (those the bucket's candidate limit would have dropped, also counted by their own decision)",
        requests,
    );
    registry.register(
        "spillway_drop_ratio",
        "Drop ratio in force for drop-ratio buckets (0 without a live instruction)",
        drop_ratio,
    );
    registry.register(
        "spillway_bucket_limit_rps",
        "The bucket's limit as a rate per second",
        limit_rps,
    );
    registry.register(
        "spillway_subjects",
        "Subjects held by per-subject buckets",
        subjects,
    );
    registry.register(
        "spillway_subjects_overflow",
        "Requests of new subjects admitted without a limiter because the bucket's subject map was full",
        overflow,
    );
    let unreported = Family::<Labels, Counter>::default();
    let debited = Family::<Labels, Counter>::default();
    let unsent = Family::<Labels, Gauge<i64>>::default();
    let lost = Family::<Labels, Counter>::default();
    for bucket in client.rules().buckets() {
        if bucket.response_cost().is_some() {
            let labels = vec![
                ("service", bucket.service().to_owned()),
                ("bucket", bucket.name().to_owned()),
            ];
            unreported
                .get_or_create(&labels)
                .inc_by(bucket.budget().unreported());
            debited
                .get_or_create(&labels)
                .inc_by(bucket.budget().debited());
            unsent
                .get_or_create(&labels)
                .set(i64::try_from(bucket.budget().unsent()).unwrap_or(i64::MAX));
            lost.get_or_create(&labels).inc_by(bucket.budget().lost());
        }
    }
    registry.register(
        "spillway_cost_unreported",
        "Responses of token budgets that reported no readable cost (missing, malformed, cut short, compressed other than by gzip or deflate) and were charged the bucket's default",
        unreported,
    );
    registry.register(
        "spillway_cost_debited",
        "Units debited from token budgets when their responses ended (reported costs and defaults)",
        debited,
    );
    registry.register(
        "spillway_cost_unsent",
        "Units of store: redis token budgets that Redis could not take (down, slow, the circuit open), held for the next debit",
        unsent,
    );
    registry.register(
        "spillway_cost_lost",
        "Units of per-subject store: redis token budgets whose failed debits could not be held (too many subjects held at once) and were lost",
        lost,
    );
    let connected = Gauge::<i64>::default();
    let ttl = client.rules().config().control.instruction_ttl;
    connected.set(link.map_or(0, |l| i64::from(control_plane_live(l, ttl))));
    registry.register(
        "spillway_control_plane_connected",
        "1 while instructions from the control plane arrive within their TTL; 0 when they stopped (fail-open) and for a standalone proxy",
        connected,
    );
    if let Some(link) = link {
        let reports = Counter::<u64>::default();
        reports.inc_by(link.reports());
        registry.register(
            "spillway_control_plane_reports",
            "Reports sent to the aggregator",
            reports,
        );
        let connects = Counter::<u64>::default();
        connects.inc_by(link.connects());
        registry.register(
            "spillway_control_plane_connects",
            "Streams opened to the aggregator, the first included (more: the link was lost and reopened)",
            connects,
        );
        let failovers = Counter::<u64>::default();
        failovers.inc_by(link.failovers());
        registry.register(
            "spillway_control_plane_failovers",
            "Streams opened to another of the zone's aggregators than the stream before (given several --aggregator): the one before was lost, refused or silent",
            failovers,
        );
    }
    let expired = Counter::<u64>::default();
    expired.inc_by(client.instructions_expired());
    registry.register(
        "spillway_instructions_expired",
        "Drop-ratio instructions that expired before a newer one came (fail-open)",
        expired,
    );
    let version = Gauge::<i64>::default();
    // Linked, the control plane's version (what its controller shows for this host).
    let running = link.map_or(client.rules().version(), |l| l.rules_version());
    version.set(i64::try_from(running).unwrap_or(i64::MAX));
    registry.register(
        "spillway_rules_version",
        "Version of the rules in force; counts up with every reload",
        version,
    );
    // One Redis endpoint per configuration, so no labels: the breaker and its failures. A build
    // without Redis refuses every file that names it, so it has no breaker to show.
    #[cfg(feature = "redis")]
    if let Some(store) = client.store_stats() {
        let state = Gauge::<i64>::default();
        state.set(store.state.gauge());
        registry.register(
            "spillway_circuit_state",
            "Circuit breaker of the Redis store: 0 closed, 1 half-open (probing), 2 open (on_store_failure decides)",
            state,
        );
        let errors = Family::<Labels, Counter>::default();
        errors
            .get_or_create(&vec![("kind", "error".to_owned())])
            .inc_by(store.errors);
        errors
            .get_or_create(&vec![("kind", "timeout".to_owned())])
            .inc_by(store.timeouts);
        registry.register(
            "spillway_store_errors",
            "Redis calls that failed (error) or hit the redis timeout (timeout)",
            errors,
        );
        let short = Counter::<u64>::default();
        short.inc_by(store.short_circuited);
        registry.register(
            "spillway_store_short_circuited",
            "Requests of store: redis buckets decided by on_store_failure without asking Redis, the circuit being open",
            short,
        );
        let opened = Counter::<u64>::default();
        opened.inc_by(store.opened);
        registry.register(
            "spillway_circuit_opened",
            "Times the Redis breaker opened, reopenings from a ramp stage included",
            opened,
        );
        let recovered = Counter::<u64>::default();
        recovered.inc_by(store.recovered);
        registry.register(
            "spillway_circuit_recovered",
            "Times the Redis breaker's ramp completed and it closed again",
            recovered,
        );
        let probes = Family::<Labels, Counter>::default();
        probes
            .get_or_create(&vec![("result", "ok".to_owned())])
            .inc_by(store.probes.saturating_sub(store.probe_failures));
        probes
            .get_or_create(&vec![("result", "failed".to_owned())])
            .inc_by(store.probe_failures);
        registry.register(
            "spillway_store_probes",
            "Pings of the Redis breaker's prober while open or half-open, by result",
            probes,
        );
    }
}

/// What a process that decides with a client, and serves no requests of its own, shows on its
/// admin listener (`spillway rls`): the engine's metrics; ready once its rules are
/// loaded, which they are before the listener opens.
pub struct EngineView {
    client: Arc<Client>,
    link: Option<Arc<LinkStatus>>,
}

impl EngineView {
    pub fn new(client: Arc<Client>, link: Option<Arc<LinkStatus>>) -> Self {
        Self { client, link }
    }
}

impl AdminView for EngineView {
    fn ready(&self) -> Result<String, String> {
        Ok(format!("rules version {}", self.client.rules().version()))
    }

    fn metrics(&self) -> String {
        let mut registry = Registry::default();
        register_engine(&mut registry, &self.client, self.link.as_deref());
        let mut out = String::new();
        let _ = encode(&mut out, &registry);
        out
    }
}
