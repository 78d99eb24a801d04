//! What every connection of every worker shares: the engine, the counters `/metrics` reads, and
//! the bounds on connections and on requests in flight.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use spillway_client::Client;
use spillway_client::control::LinkStatus;
use spillway_core::concurrency::Gate;

use crate::answer::Refusals;
use crate::limits::Connections;
use crate::request_id::RequestIds;

/// What every connection of every worker shares.
pub(crate) struct Shared {
    pub(crate) client: Arc<Client>,
    pub(crate) upstream_errors: AtomicU64,
    /// Requests answered by the proxy for a fault of the client's
    /// (`spillway_requests_refused_total{reason}`).
    pub(crate) refusals: Refusals,
    /// Upgrades (WebSockets) tunnelled to the upstream (`spillway_upgrades_total`).
    pub(crate) upgrades: AtomicU64,
    /// The same by the buckets their handshakes matched, by service and bucket name
    /// (`spillway_bucket_upgrades_total`). Locked once per tunnel opened, never per request.
    pub(crate) bucket_upgrades: std::sync::Mutex<std::collections::BTreeMap<(String, String), u64>>,
    /// Upgrades removed from requests forwarded as plain ones: a protocol `proxy.upgrades` does
    /// not allow, or a WebSocket handshake without its key
    /// (`spillway_upgrades_refused_total{reason="protocol"}`).
    pub(crate) upgrades_removed: AtomicU64,
    /// Upstream `101`s that were not the handshake asked for, answered 502
    /// (`spillway_upgrades_refused_total{reason="handshake"}`).
    pub(crate) upgrades_bad_switch: AtomicU64,
    /// Requests answered 503 because the drain deadline passed while they waited on the
    /// upstream (`spillway_drain_cut_total`).
    pub(crate) drain_cut: AtomicU64,
    /// Where new request ids come from.
    pub(crate) request_ids: RequestIds,
    /// The control-plane link's state, when linked.
    pub(crate) link: Option<Arc<LinkStatus>>,
    /// The open downstream connections and their cap (`spillway_connections`,
    /// `spillway_connections_refused_total`).
    pub(crate) connections: Arc<Connections>,
    /// The in-flight limit on the upstream; off without a `concurrency` section.
    pub(crate) concurrency: Arc<Gate>,
}
