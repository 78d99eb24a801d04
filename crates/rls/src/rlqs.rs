//! Envoy's Rate Limit Quota Service v3 (`StreamRateLimitQuotas`) on the aggregator:
//! each stream is one Envoy instance, a host of the aggregator's zone ([`spillway_control::
//! LocalClients`]), whose usage reports are offered load and whose assignments follow the
//! bucket's drop ratio ([`crate::quota`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use spillway_control::LocalClients;
use spillway_core::clock::{Clock, SystemClock};
use spillway_link::now_unix_ns;
use spillway_loop::{HostId, HostTime};
use spillway_tls::SanPolicy;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::quota::{BadUsage, Instance, response};
use crate::server::refusal;

/// Envoy's generated RLQS messages and service (`envoy-types`).
pub mod pb {
    pub use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
    pub use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::{
        BucketAction, bucket_action,
    };
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
        RateLimitQuotaService, RateLimitQuotaServiceServer,
    };
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    pub use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    };
}

/// The largest usage report a stream takes: 4 MiB, tonic's default, about 30,000 bucket ids.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// `RateLimitQuotaService` on a running aggregator's zone.
#[derive(Clone)]
pub struct Rlqs {
    clients: LocalClients,
    allow: SanPolicy,
    clock: SystemClock,
    next: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
    stopper: Arc<watch::Sender<bool>>,
}

impl Rlqs {
    /// Streams become hosts of the zone `clients` attach to.
    pub fn new(clients: LocalClients) -> Self {
        let (stopper, stop) = watch::channel(false);
        Self {
            clients,
            allow: SanPolicy::default(),
            clock: SystemClock::new(),
            next: Arc::new(AtomicU64::new(1)),
            stop,
            stopper: Arc::new(stopper),
        }
    }

    /// Streams only from clients whose certificate has a URI SAN that `allow` matches
    /// (`--allow-client-san`); others get `PERMISSION_DENIED`.
    pub fn with_allowed_sans(mut self, allow: SanPolicy) -> Self {
        self.allow = allow;
        self
    }

    /// What ends every open stream (for [`crate::serve_rlqs`]'s shutdown).
    pub(crate) fn stopper(&self) -> watch::Sender<bool> {
        (*self.stopper).clone()
    }

    fn now(&self) -> HostTime {
        HostTime {
            clock: self.clock.now(),
            unix_ns: now_unix_ns(),
        }
    }
}

#[tonic::async_trait]
impl pb::RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<pb::RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<pb::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        if let Some(refused) = refusal(&self.allow, &request, "RLQS stream") {
            return Err(refused);
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let host = match request.remote_addr() {
            Some(addr) => format!("envoy-{n}-{addr}"),
            None => format!("envoy-{n}"),
        };
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(stream(self.clone(), host, inbound, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Tx = mpsc::Sender<Result<pb::RateLimitQuotaResponse, Status>>;

/// One Envoy instance's stream, from its first report to its end.
async fn stream(
    rlqs: Rlqs,
    host: String,
    mut inbound: Streaming<pb::RateLimitQuotaUsageReports>,
    tx: Tx,
) {
    let (client, mut instructions) = rlqs.clients.attach(host.clone());
    let id = HostId {
        host_id: host.clone(),
        region: rlqs.clients.region().to_owned(),
        zone: rlqs.clients.zone().to_owned(),
    };
    let mut instance = Instance::new(id, rlqs.clients.rules().as_ref(), rlqs.now());
    let mut stop = rlqs.stop.clone();
    tracing::info!(%host, "RLQS stream opened");
    let send = |actions| {
        let tx = tx.clone();
        async move {
            match response(actions) {
                Some(message) => tx.send(Ok(message)).await.is_ok(),
                None => true,
            }
        }
    };
    loop {
        let wait = instance
            .deadline()
            .saturating_sub(now_unix_ns() / 1_000_000);
        let open = tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {
                let (report, actions) = instance.on_deadline(rlqs.now());
                if let Some(report) = report {
                    client.report(report);
                }
                send(actions).await
            }
            message = inbound.message() => match message {
                Ok(Some(reports)) => match instance.on_usage(rlqs.now(), &reports) {
                    Ok(actions) => send(actions).await,
                    Err(bad) => {
                        tracing::debug!(%host, "RLQS usage report refused: {bad}");
                        let status = match bad {
                            BadUsage::TooManyBuckets => Status::resource_exhausted(bad.to_string()),
                            _ => Status::invalid_argument(bad.to_string()),
                        };
                        let _ = tx.send(Err(status)).await;
                        false
                    }
                },
                Ok(None) => false,
                Err(status) => {
                    tracing::debug!(%host, "RLQS stream failed: {status}");
                    false
                }
            },
            instructions = instructions.recv() => match instructions {
                Some(Ok(instructions)) => {
                    let actions = instance.on_instructions(rlqs.now(), instructions);
                    send(actions).await
                }
                _ => false,
            },
            _ = stop.changed() => false,
        };
        if !open {
            break;
        }
    }
    tracing::info!(%host, buckets = instance.buckets(), "RLQS stream closed");
    drop(client);
}
