//! Emulated aggregators against a real controller, to see what a region of many zones costs it:
//! each zone is its own `LinkZone` stream, sending the sums of the controller's first B
//! control-plane buckets every report interval (its share of 1.5 times each limit, from 100
//! hosts), as an aggregator forwards them, and reading the controller's instructions.
//!
//! ```sh
//! cargo run --release -p spillway-emulate --example zones -- \
//!   -c controller.yaml --controller http://127.0.0.1:7001 --zones 100 --buckets 10000 --seconds 30
//! ```
//!
//! Prints one JSON line: zones linked, reports sent and instructions received (`bench/controller/run.sh`
//! measures the controller's CPU and memory around it).
//!
//! The emulator shares the machine with the controller it measures, so it does as little as it
//! can: every report's bucket sums are encoded once (all zones send the same ones) and each
//! report is its few own fields before them; the instructions are counted, not decoded. Built
//! and parsed as messages, they cost it more than the controller its work.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use spillway_emulate::control_buckets;
use spillway_link::{Target, now_ms};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;

/// What each emulated aggregator says it sums.
const HOSTS_PER_ZONE: u32 = 100;

/// Sends messages encoded already and reads each as its size: a `v1::ZoneReport` out, a
/// `v1::ZoneInstructions` in, on the controller's own `LinkZone` method.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = usize;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = usize;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<usize>, tonic::Status> {
        let size = src.remaining();
        src.advance(size);
        Ok(Some(size))
    }
}

/// One zone's report of interval `sequence`: its own fields, then the bucket sums every zone
/// sends, encoded once (a message's fields may come in any order, and a repeated field's
/// entries add up across the encoding).
fn report(zone: &str, region: &str, sequence: u64, interval_ms: u64, buckets: &[u8]) -> Bytes {
    let head = v1::ZoneReport {
        zone: zone.to_owned(),
        region: region.to_owned(),
        sequence,
        interval_ms,
        clients: HOSTS_PER_ZONE,
        ..Default::default()
    };
    let mut bytes = Vec::with_capacity(head.encoded_len() + buckets.len());
    head.encode(&mut bytes).expect("a Vec grows");
    bytes.extend_from_slice(buckets);
    Bytes::from(bytes)
}

#[derive(Default)]
struct Counts {
    linked: AtomicU64,
    reports: AtomicU64,
    instructions: AtomicU64,
}

struct Args {
    config: String,
    controller: String,
    zones: usize,
    buckets: usize,
    seconds: u64,
    region: String,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        config: String::new(),
        controller: String::new(),
        zones: 100,
        buckets: usize::MAX,
        seconds: 30,
        region: "r1".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "-c" => a.config = value()?,
            "--controller" => a.controller = value()?,
            "--zones" => a.zones = number(value()?)? as usize,
            "--buckets" => a.buckets = number(value()?)? as usize,
            "--seconds" => a.seconds = number(value()?)?,
            "--region" => a.region = value()?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.config.is_empty() || a.controller.is_empty() {
        return Err("give -c FILE and --controller URL".into());
    }
    Ok(a)
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = args()?;
    let config = spillway_core::config::load_file(std::path::Path::new(&args.config))
        .map_err(|e| e.to_string())?;
    let interval_ms = config.control.report_interval.as_millis() as u64;
    let buckets: Vec<_> = control_buckets(&config)
        .into_iter()
        .take(args.buckets)
        .collect();
    let zones = args.zones as u64;
    let counts: Vec<v1::BucketCounts> = buckets
        .iter()
        .map(|(key, limit)| {
            // This zone's part of 1.5 times the limit, over one interval.
            let offered = (1.5 * limit * interval_ms as f64 / 1000.0 / zones as f64) as u64;
            v1::BucketCounts {
                service: key.service.clone(),
                bucket: key.bucket.clone(),
                offered,
                allowed: offered * 2 / 3,
                offered_tail: Some(offered / 4),
                hosts: Some(u64::from(HOSTS_PER_ZONE)),
                ..Default::default()
            }
        })
        .collect();
    let buckets_count = counts.len();
    let encoded: Arc<[u8]> = v1::ZoneReport {
        buckets: counts,
        ..Default::default()
    }
    .encode_to_vec()
    .into();
    let totals = Arc::new(Counts::default());
    let target = Target::plain(&args.controller).map_err(|e| e.to_string())?;
    let end = tokio::time::Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for z in 0..args.zones {
        let (target, encoded, totals) = (target.clone(), encoded.clone(), totals.clone());
        let (region, zone) = (args.region.clone(), format!("ez-{z}"));
        tasks.push(tokio::spawn(async move {
            let channel = target.connect().await.map_err(|e| e.to_string())?;
            let mut client = tonic::client::Grpc::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES);
            client.ready().await.map_err(|e| e.to_string())?;
            let (tx, rx) = mpsc::channel(4);
            let mut inbound = client
                .streaming(
                    tonic::Request::new(ReceiverStream::new(rx)),
                    PathAndQuery::from_static("/spillway.v1.Controller/LinkZone"),
                    Raw,
                )
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            totals.linked.fetch_add(1, Ordering::Relaxed);
            let reader = {
                let totals = totals.clone();
                tokio::spawn(async move {
                    loop {
                        match inbound.message().await {
                            Ok(Some(_)) => totals.instructions.fetch_add(1, Ordering::Relaxed),
                            Ok(None) => return None,
                            Err(status) => return Some(status.to_string()),
                        };
                    }
                })
            };
            // Each zone reports a few milliseconds after each interval ends, spread over 20 ms.
            let offset = 5 + (z as u64 * 20 / zones.max(1));
            loop {
                let now = now_ms();
                let next = (now / interval_ms + 1) * interval_ms + offset;
                let at = tokio::time::Instant::now() + Duration::from_millis(next - now);
                if at >= end {
                    break;
                }
                tokio::time::sleep_until(at).await;
                let sequence = next / interval_ms - 1;
                let report = report(&zone, &region, sequence, interval_ms, &encoded);
                if tx.send(report).await.is_err() {
                    let why = reader.await.ok().flatten().unwrap_or_default();
                    return Err(format!("{zone}: the controller ended the stream: {why}"));
                }
                totals.reports.fetch_add(1, Ordering::Relaxed);
            }
            drop(tx);
            reader.abort();
            Ok::<(), String>(())
        }));
    }
    let mut errors = Vec::new();
    for task in tasks {
        if let Ok(Err(e)) = task.await {
            errors.push(e);
        }
    }
    println!(
        "{{\"zones\": {}, \"buckets\": {}, \"linked\": {}, \"reports_sent\": {}, \"instructions_received\": {}, \"errors\": {}}}",
        args.zones,
        buckets_count,
        totals.linked.load(Ordering::Relaxed),
        totals.reports.load(Ordering::Relaxed),
        totals.instructions.load(Ordering::Relaxed),
        errors.len()
    );
    if let Some(e) = errors.first() {
        eprintln!("zones: {e}");
    }
    Ok(())
}
