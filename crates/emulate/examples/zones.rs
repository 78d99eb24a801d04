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
//! report is its few own fields before them; the instructions are counted, not decoded (but for
//! whether the controller takes buckets by number). Built and parsed as messages, they cost it
//! more than the controller its work.
//!
//! Like an aggregator, each zone numbers its buckets on its stream: its reports name every
//! bucket with its number until the controller's instructions say it takes numbers, and carry
//! the numbers alone from then on. `--names` sends the names every time, without numbers, as an
//! aggregator older than the numbers does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{BufMut, Bytes};
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

/// Sends messages encoded already and reads of each only whether the controller takes buckets
/// by number: a `v1::ZoneReport` out, a `v1::ZoneInstructions` in, on the controller's own
/// `LinkZone` method.
#[derive(Debug, Clone, Copy, Default)]
struct Raw;

/// `v1::ZoneInstructions` without its instructions, which decoding skips over.
#[derive(Clone, PartialEq, prost::Message)]
struct TakesIds {
    #[prost(bool, tag = "2")]
    bucket_ids: bool,
}

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = bool;
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
    type Item = bool;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<bool>, tonic::Status> {
        let message = TakesIds::decode(src).map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(Some(message.bucket_ids))
    }
}

/// One zone's report of interval `sequence`: its own fields, then the bucket sums every zone
/// sends, encoded once (a message's fields may come in any order, and a repeated field's
/// entries add up across the encoding).
fn report(
    zone: &str,
    region: &str,
    sequence: u64,
    interval_ms: u64,
    bucket_ids: bool,
    buckets: &[u8],
) -> Bytes {
    let head = v1::ZoneReport {
        zone: zone.to_owned(),
        region: region.to_owned(),
        sequence,
        interval_ms,
        clients: HOSTS_PER_ZONE,
        bucket_ids,
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
    /// Names every bucket every time, without numbers.
    names: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        config: String::new(),
        controller: String::new(),
        zones: 100,
        buckets: usize::MAX,
        seconds: 30,
        region: "r1".into(),
        names: false,
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
            "--names" => a.names = true,
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
    let numbered = !args.names;
    let counts: Vec<v1::BucketCounts> = (1..)
        .zip(&buckets)
        .map(|(id, (key, limit))| {
            // This zone's part of 1.5 times the limit, over one interval.
            let offered = (1.5 * limit * interval_ms as f64 / 1000.0 / zones as f64) as u64;
            v1::BucketCounts {
                service: key.service.clone(),
                bucket: key.bucket.clone(),
                offered,
                allowed: offered * 2 / 3,
                offered_tail: Some(offered / 4),
                hosts: Some(u64::from(HOSTS_PER_ZONE)),
                id: if numbered { id } else { 0 },
                ..Default::default()
            }
        })
        .collect();
    let buckets_count = counts.len();
    let encode = |buckets: Vec<v1::BucketCounts>| -> Arc<[u8]> {
        v1::ZoneReport {
            buckets,
            ..Default::default()
        }
        .encode_to_vec()
        .into()
    };
    // With names (and numbers), and by number alone.
    let by_number = counts
        .iter()
        .map(|b| v1::BucketCounts {
            service: String::new(),
            bucket: String::new(),
            ..b.clone()
        })
        .collect();
    let encoded = (encode(counts), encode(by_number));
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
            let takes_ids = Arc::new(AtomicBool::new(false));
            let reader = {
                let (totals, takes_ids) = (totals.clone(), takes_ids.clone());
                tokio::spawn(async move {
                    loop {
                        match inbound.message().await {
                            Ok(Some(bucket_ids)) => {
                                if bucket_ids && numbered {
                                    takes_ids.store(true, Ordering::Relaxed);
                                }
                                totals.instructions.fetch_add(1, Ordering::Relaxed)
                            }
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
                // Every bucket was named with its number in the reports before the controller
                // said it takes numbers.
                let buckets = if takes_ids.load(Ordering::Relaxed) {
                    &encoded.1
                } else {
                    &encoded.0
                };
                let report = report(&zone, &region, sequence, interval_ms, numbered, buckets);
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
