//! The aggregators' stream (`LinkZone`) served with a codec of its own: each zone's instructions
//! go out as [`SharedInstructions`], whose buckets common to every zone were encoded once for the
//! interval, rather than as a `v1::ZoneInstructions` prost encodes whole for each zone. The bytes
//! are the same as prost's (`SharedInstructions::encode`), so every aggregator reads them as it
//! always did.
//!
//! At 100 zones x 10,000 region-scoped buckets, the generated route encoded 100 messages of
//! 10,000 buckets each per interval, about a third of the controller's CPU; with the common
//! buckets encoded once and copied into each zone's message (250 KB a zone), encoding left the
//! profile. Measured with `bench/controller/run.sh 100 10000 15` on 2 cores shared with other
//! work (2026-12-07): 0.454 of a core before, 0.378 after; with [`ReportDecoder`] too, 0.111-0.164
//! against 0.314-0.366 for the build before both (3 interleaved runs each).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::Message;
use prost::bytes::Buf;
use spillway_loop::SharedInstructions;
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{BoxFuture, http};
use tonic::server::{Grpc, NamedService};
use tonic::{Request, Response, Status, Streaming};

use super::service::{Outgoing, Service};

/// `LinkZone`'s path.
const LINK_ZONE: &str = "/spillway.v1.Controller/LinkZone";

/// The controller's gRPC service: `LinkZone` here, with [`ZoneCodec`]; every other method
/// (`Exchange`) by the generated server.
#[derive(Clone)]
pub(super) struct Routes {
    service: Arc<Service>,
    generated: v1::controller_server::ControllerServer<Service>,
}

impl Routes {
    pub(super) fn new(service: Service) -> Self {
        let service = Arc::new(service);
        Self {
            generated: v1::controller_server::ControllerServer::from_arc(service.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            service,
        }
    }
}

impl NamedService for Routes {
    const NAME: &'static str =
        <v1::controller_server::ControllerServer<Service> as NamedService>::NAME;
}

impl tonic::codegen::Service<http::Request<Body>> for Routes {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != LINK_ZONE {
            return self.generated.call(request);
        }
        let service = self.service.clone();
        Box::pin(async move {
            let mut grpc =
                Grpc::new(ZoneCodec).apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), None);
            Ok(grpc.streaming(LinkZone(service), request).await)
        })
    }
}

/// `LinkZone` as [`Grpc::streaming`] calls it.
struct LinkZone(Arc<Service>);

impl tonic::codegen::Service<Request<Streaming<v1::ZoneReport>>> for LinkZone {
    type Response = Response<ReceiverStream<Outgoing>>;
    type Error = Status;
    type Future = BoxFuture<Self::Response, Status>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Streaming<v1::ZoneReport>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.link(request).await })
    }
}

/// Zone reports in, decoded by prost from one contiguous slice; [`SharedInstructions`] out,
/// encoded by themselves.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ZoneCodec;

impl Codec for ZoneCodec {
    type Encode = SharedInstructions;
    type Decode = v1::ZoneReport;
    type Encoder = ZoneCodec;
    type Decoder = ReportDecoder;

    fn encoder(&mut self) -> ZoneCodec {
        ZoneCodec
    }

    fn decoder(&mut self) -> ReportDecoder {
        ReportDecoder::default()
    }
}

impl Encoder for ZoneCodec {
    type Item = SharedInstructions;
    type Error = Status;

    fn encode(&mut self, item: SharedInstructions, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst);
        Ok(())
    }
}

/// One stream's zone reports, decoded as prost decodes them from a slice, with room for as
/// many buckets as the stream's last report had.
///
/// Prost reads tonic's buffer through its `Buf` calls, one or more per field (`advance` alone
/// was 13% of the controller), and grows a report's 10,000 buckets by doubling, moving them
/// each time; from a slice, with the room made at once, decoding took about half the time:
/// the controller at 100 zones x 10,000 buckets went from 0.483 of a core (with the common
/// instructions already encoded once) to 0.246, one interleaved pair of
/// `bench/controller/run.sh 100 10000 15` runs on 2 busy cores.
#[derive(Debug, Default)]
pub(super) struct ReportDecoder {
    buckets: usize,
}

impl Decoder for ReportDecoder {
    type Item = v1::ZoneReport;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<v1::ZoneReport>, Status> {
        // The message's bytes as they are in tonic's buffer, not copied.
        let bytes = src.copy_to_bytes(src.remaining());
        let mut report = v1::ZoneReport {
            buckets: Vec::with_capacity(self.buckets),
            ..Default::default()
        };
        report
            .merge(&bytes[..])
            .map_err(|e| Status::internal(format!("a zone report that does not decode: {e}")))?;
        self.buckets = report.buckets.len();
        Ok(Some(report))
    }
}
