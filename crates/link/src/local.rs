//! Clients of a zone in its aggregator's own process, as whoever serves them sees the zone: an
//! Envoy instance on the RLQS listener is a host of the zone like a sidecar, but it speaks
//! Envoy's protocol, so the RLQS service reports for it and takes its instructions through
//! [`ZoneClients`], with no control-plane stream between them. The aggregator implements it;
//! the RLQS service depends only on this, never on the aggregator's servers.

use spillway_proto::v1;
use tokio::sync::mpsc;
use tonic::Status;

/// Instructions for one client, as the zone sends them to a stream: a client too slow to take
/// one set per interval misses that set.
pub type InstructionsRx = mpsc::Receiver<Result<v1::Instructions, Status>>;

/// Why whoever serves in-process clients refused one, counted by the zone in
/// `spillway_control_plane_rejected_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalRefusal {
    /// A stream beyond the streams one host may hold open (`rlqs_streams`).
    RlqsStreams,
    /// A bucket id beyond what a stream, a host or the listener may hold (`rlqs_buckets`).
    RlqsBuckets,
}

/// A running zone that in-process clients attach to.
pub trait ZoneClients: Send + Sync + 'static {
    /// The zone's region.
    fn region(&self) -> &str;

    /// The zone's name.
    fn zone(&self) -> &str;

    /// The rules the zone runs now (`None` before the controller sent any), so a client that
    /// joins can run them at once rather than an interval later.
    fn rules(&self) -> Option<v1::Rules>;

    /// Counts a client refused by whoever serves it.
    fn refused(&self, why: LocalRefusal);

    /// A client reporting as `host`, and where its instructions arrive. It leaves the zone when
    /// the client is dropped, as a stream's host does when its stream ends.
    fn attach(&self, host: String) -> (Box<dyn ZoneClient>, InstructionsRx);
}

/// One in-process client of a zone (see [`ZoneClients::attach`]).
pub trait ZoneClient: Send + Sync + 'static {
    /// The host id its reports carry.
    fn host(&self) -> &str;

    /// Counts `report` in the zone as a report of this client's host (its host id, region and
    /// zone are set to this client's).
    fn report(&self, report: v1::Report);
}
