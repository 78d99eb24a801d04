//! The client side of the control plane: a rate-limit client (the sidecar, or any embedder of
//! `spillway-client`) reports to its zone's aggregator and applies what comes back.
//!
//! [`ClientLink`] owns the stream. Every interval, at the wall-clock boundary, it asks a
//! [`ReportSource`] for the counts since the previous call and sends them, with the part that
//! arrived in the interval's last quarter (it asks at the start of that quarter too, [`Tally`]); every instruction set
//! and every new rules snapshot it receives goes to an [`InstructionSink`]. When the aggregator
//! is gone it reconnects with capped, jittered backoff; meanwhile nothing renews the
//! instructions, so the sink's expiry makes the client fail open (G9).
//!
//! How a `spillway-client` embedder plugs in:
//! ```text
//! ReportSource::report   -> Client::stats(), minus the counters of the previous call, for the
//!                           drop-ratio and adaptive-token-bucket buckets
//! InstructionSink::apply -> Client::set_drop_ratio(service, bucket, drop_ratio, ttl), and the
//!                           bucket's AdaptiveTokenBucket::set_share for a share
//! apply_rules            -> config::load_str(yaml) then Client::reload, persisted to disk
//! LinkStatus::connected  -> spillway_control_plane_connected
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use spillway_core::algo::{Ratio, Share};
use spillway_proto::{MAX_MESSAGE_BYTES, v1};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

use crate::error::ControlError;
use crate::net::{self, Stop, sleep_or_stop};
use crate::sums::{BucketKey, Counts, TAIL_PARTS};
use crate::timing::{Backoff, Interval, now_ms};

/// One bucket's counts since the previous report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketReport {
    pub service: String,
    pub bucket: String,
    /// Everything that arrived, dropped or not.
    pub offered: u64,
    pub allowed: u64,
    pub shadow_dropped: u64,
}

/// Where the link gets its counts (the sidecar: its client's striped counters).
pub trait ReportSource: Send + Sync + 'static {
    /// Counts of every control-plane bucket since the previous call. The link calls it once when
    /// a stream opens (to start counting afresh) and then twice per interval: when its last
    /// quarter starts and when it ends, so each report also carries the interval's tail.
    fn report(&self) -> Vec<BucketReport>;
}

/// One host's counts of the interval in progress, taken in two parts, before its last quarter
/// and within it, and turned into the report's counts when the interval ends: sans-IO, so the
/// link and the simulator's hosts report the same way.
///
/// Counts are scaled to a whole interval (and the tail to a whole quarter) from the time they
/// actually cover: a stream that opened 300 ms before a 1 s boundary counted only 300 ms, and a
/// tail mark that fired 20 ms late counted 230 ms of tail. With 1 s intervals, a host offering
/// 100 req/s until 12:00:00.500 and 1,000 req/s after reports 550 offered, 250 in the tail.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Per bucket since the start: `offered_tail` holds what was counted since the tail mark.
    counts: HashMap<BucketKey, Counts>,
    started_ms: u64,
    /// When the tail started, if it was marked in this interval.
    tail_from_ms: Option<u64>,
}

impl Tally {
    /// Counting starts afresh at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            started_ms: now_ms,
            ..Self::default()
        }
    }

    /// When the tail of interval `sequence` starts: its last quarter.
    pub fn tail_start(interval: Interval, sequence: u64) -> u64 {
        interval.end_of(sequence) - interval.ms() / TAIL_PARTS
    }

    /// Whether the tail was marked in the interval in progress.
    pub fn tail_marked(&self) -> bool {
        self.tail_from_ms.is_some()
    }

    /// The counts since the previous call (`counted`) end before the tail, which starts now.
    pub fn mark_tail(&mut self, counted: Vec<BucketReport>, now_ms: u64) {
        self.unmark_tail();
        self.add(counted);
        self.tail_from_ms = Some(now_ms);
    }

    /// Forgets when the tail started (the interval changed length, or the report is cut short):
    /// the next report carries no tail unless the tail is marked again.
    pub fn unmark_tail(&mut self) {
        for c in self.counts.values_mut() {
            c.offered_tail = 0;
        }
        self.tail_from_ms = None;
    }

    /// Ends the interval at `now_ms` with the counts since the previous call, returns the
    /// report's counts (sorted by bucket) and starts counting the next interval.
    pub fn close(
        &mut self,
        counted: Vec<BucketReport>,
        now_ms: u64,
        interval: Interval,
    ) -> Vec<v1::BucketCounts> {
        self.add(counted);
        let elapsed = now_ms.saturating_sub(self.started_ms).max(1) as f64;
        let scale = |n: u64| (n as f64 * interval.ms() as f64 / elapsed).round() as u64;
        let tail_scale = self.tail_from_ms.map(|from| {
            interval.ms() as f64 / TAIL_PARTS as f64 / now_ms.saturating_sub(from).max(1) as f64
        });
        let mut counts: Vec<(BucketKey, Counts)> = self.counts.drain().collect();
        counts.sort_by(|a, b| a.0.cmp(&b.0));
        *self = Self::new(now_ms);
        counts
            .into_iter()
            .map(|(key, c)| v1::BucketCounts {
                service: key.service,
                bucket: key.bucket,
                offered: scale(c.offered),
                allowed: scale(c.allowed),
                shadow_dropped: scale(c.shadow_dropped),
                offered_tail: tail_scale.map(|k| (c.offered_tail as f64 * k).round() as u64),
                hosts: None,
            })
            .collect()
    }

    fn add(&mut self, counted: Vec<BucketReport>) {
        let in_tail = self.tail_from_ms.is_some();
        for b in counted {
            *self
                .counts
                .entry(BucketKey::new(b.service, b.bucket))
                .or_default() += Counts {
                offered: b.offered,
                offered_tail: if in_tail { b.offered } else { 0 },
                allowed: b.allowed,
                shadow_dropped: b.shadow_dropped,
                hosts: 0,
            };
        }
    }
}

/// What the controller says about one bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Instruction<'a> {
    pub service: &'a str,
    pub bucket: &'a str,
    /// For drop-ratio buckets: drop this share of requests (G8).
    pub drop_ratio: Ratio,
    /// For adaptive-token-bucket buckets: this host's share of the limit (G10).
    pub share: Option<Share>,
    /// Offered load of the bucket's whole scope over the interval the instruction came from,
    /// per second, and from how many hosts: what a client's surge guard works out its part of
    /// the limit from (`spillway_core::surge`).
    pub scope_offered_rps: f64,
    pub scope_hosts: u64,
    /// When the interval the instruction was computed from ended, Unix milliseconds.
    pub interval_end_ms: u64,
}

/// Where the link delivers what it receives (the sidecar: its client's instruction table).
pub trait InstructionSink: Send + Sync + 'static {
    /// New rules (the YAML of SPEC §2) as version `version`. On an error the client keeps its
    /// rules and the link keeps reporting the old version, which the controller shows.
    fn apply_rules(
        &self,
        version: u64,
        yaml: &str,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// One instruction, valid for `ttl` from now; after that the client fails open unless a
    /// newer one came.
    fn apply(&self, instruction: Instruction<'_>, ttl: Duration);
}

/// Who the client is and where it reports.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// The zone's aggregator, for example `http://127.0.0.1:7101`.
    pub aggregator: String,
    pub host_id: String,
    pub region: String,
    pub zone: String,
    /// The interval to report at until the controller says otherwise.
    pub interval: Duration,
    /// The rules version the client starts with (its last good rules from disk), 0 for none.
    pub rules_version: u64,
    pub backoff: Backoff,
}

impl LinkOptions {
    /// Options with a 1 s interval, no rules yet and the default backoff.
    pub fn new(
        aggregator: impl Into<String>,
        host_id: impl Into<String>,
        region: impl Into<String>,
        zone: impl Into<String>,
    ) -> Self {
        Self {
            aggregator: aggregator.into(),
            host_id: host_id.into(),
            region: region.into(),
            zone: zone.into(),
            interval: Duration::from_secs(1),
            rules_version: 0,
            backoff: Backoff::default(),
        }
    }
}

/// The link's state, readable from anywhere (metrics, readiness).
#[derive(Debug, Default)]
pub struct LinkStatus {
    connected: AtomicBool,
    rules_version: AtomicU64,
    interval_ms: AtomicU64,
    last_instructions_ms: AtomicU64,
    connects: AtomicU64,
    reports: AtomicU64,
}

impl LinkStatus {
    /// True while a stream to the aggregator is open (`spillway_control_plane_connected`).
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The rules version the client runs, as reported upward.
    pub fn rules_version(&self) -> u64 {
        self.rules_version.load(Ordering::Relaxed)
    }

    /// The report interval in force.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.load(Ordering::Relaxed))
    }

    /// When instructions last arrived, Unix milliseconds (0: never).
    pub fn last_instructions_ms(&self) -> u64 {
        self.last_instructions_ms.load(Ordering::Relaxed)
    }

    /// Streams opened so far (the first connection included).
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Reports sent so far.
    pub fn reports(&self) -> u64 {
        self.reports.load(Ordering::Relaxed)
    }
}

/// A running link; dropping it without [`ClientLink::shutdown`] aborts it.
pub struct ClientLink {
    status: Arc<LinkStatus>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ClientLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLink")
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl ClientLink {
    /// Starts the link on the current tokio runtime. Fails only on an unusable URL; an
    /// unreachable aggregator is retried forever.
    pub fn spawn(
        options: LinkOptions,
        source: Arc<dyn ReportSource>,
        sink: Arc<dyn InstructionSink>,
    ) -> Result<Self, ControlError> {
        let endpoint = net::endpoint(&options.aggregator)?;
        let status = Arc::new(LinkStatus::default());
        status
            .rules_version
            .store(options.rules_version, Ordering::Relaxed);
        status
            .interval_ms
            .store(Interval::new(options.interval).ms(), Ordering::Relaxed);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(
            Link {
                options,
                endpoint,
                status: status.clone(),
                source,
                sink,
            },
            stop_rx,
        ));
        Ok(Self {
            status,
            stop,
            task: Some(task),
        })
    }

    pub fn status(&self) -> Arc<LinkStatus> {
        self.status.clone()
    }

    pub fn connected(&self) -> bool {
        self.status.connected()
    }

    /// Sends what was counted since the last report and closes the stream.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ClientLink {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

struct Link {
    options: LinkOptions,
    endpoint: Endpoint,
    status: Arc<LinkStatus>,
    source: Arc<dyn ReportSource>,
    sink: Arc<dyn InstructionSink>,
}

async fn run(link: Link, mut stop: Stop) {
    let mut backoff = link.options.backoff.clone();
    loop {
        match link.session(&mut stop, &mut backoff).await {
            Ok(()) => return,
            Err(reason) => {
                link.status.connected.store(false, Ordering::Relaxed);
                tracing::warn!(aggregator = %link.options.aggregator, "control-plane link down: {reason}");
            }
        }
        if sleep_or_stop(backoff.next_delay(), &mut stop).await {
            return;
        }
    }
}

impl Link {
    /// One stream, from connecting to its end: `Ok` when stopped, `Err` when lost.
    async fn session(&self, stop: &mut Stop, backoff: &mut Backoff) -> Result<(), String> {
        if net::stopped(stop) {
            return Ok(());
        }
        let channel = tokio::select! {
            c = self.endpoint.connect() => c.map_err(|e| format!("cannot connect: {e}"))?,
            _ = stop.changed() => return Ok(()),
        };
        let mut client = v1::aggregator_client::AggregatorClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::channel::<v1::Report>(4);
        let mut inbound = client
            .link(ReceiverStream::new(rx))
            .await
            .map_err(|s| format!("the aggregator refused the stream: {}", s.message()))?
            .into_inner();
        self.status.connected.store(true, Ordering::Relaxed);
        self.status.connects.fetch_add(1, Ordering::Relaxed);
        backoff.reset();
        tracing::info!(aggregator = %self.options.aggregator, "control-plane link up");

        // Whatever was counted while disconnected is no rate of any one interval: start afresh.
        self.source.report();
        let mut tally = Tally::new(now_ms());
        let mut interval = self.interval();
        let mut due = interval.sequence_at(now_ms());
        // The tail is marked only when the stream was open before it started.
        let mut tail_due = now_ms() < Tally::tail_start(interval, due);
        loop {
            let at = if tail_due {
                Tally::tail_start(interval, due)
            } else {
                interval.end_of(due)
            };
            let wait = at.saturating_sub(now_ms());
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait)) => {
                    let now = now_ms();
                    if tail_due {
                        tail_due = false;
                        // A mark that fired far too late (a stalled runtime) would scale a few
                        // milliseconds up to a quarter: no tail this interval then.
                        let late = interval.ms() / TAIL_PARTS / 2;
                        if now < Tally::tail_start(interval, due) + late {
                            tally.mark_tail(self.source.report(), now);
                        }
                        continue;
                    }
                    let report = self.report(&mut tally, due, interval, now);
                    tx.send(report).await.map_err(|_| "the stream closed".to_owned())?;
                    self.status.reports.fetch_add(1, Ordering::Relaxed);
                    due = (due + 1).max(interval.sequence_at(now_ms()));
                    tail_due = now_ms() < Tally::tail_start(interval, due);
                }
                message = inbound.message() => match message {
                    Ok(Some(instructions)) => {
                        self.receive(instructions);
                        let now = self.interval();
                        if now != interval {
                            interval = now;
                            due = interval.sequence_at(now_ms());
                            tally.unmark_tail();
                            tail_due = now_ms() < Tally::tail_start(interval, due);
                        }
                    }
                    Ok(None) => return Err("the aggregator ended the stream".into()),
                    Err(status) => return Err(format!("stream error: {}", status.message())),
                },
                _ = stop.changed() => {
                    // Flush the partial interval so a stopping host's last requests are counted.
                    tally.unmark_tail();
                    let report = self.report(&mut tally, due, interval, now_ms());
                    let _ = tx.try_send(report);
                    return Ok(());
                }
            }
        }
    }

    fn interval(&self) -> Interval {
        Interval::from_ms(self.status.interval_ms.load(Ordering::Relaxed))
    }

    /// The report of interval `sequence`, closed at `now_ms`, from what `tally` counted.
    fn report(
        &self,
        tally: &mut Tally,
        sequence: u64,
        interval: Interval,
        now_ms: u64,
    ) -> v1::Report {
        v1::Report {
            host_id: self.options.host_id.clone(),
            zone: self.options.zone.clone(),
            region: self.options.region.clone(),
            rules_version: self.status.rules_version(),
            sequence,
            interval_ms: interval.ms(),
            buckets: tally.close(self.source.report(), now_ms, interval),
        }
    }

    fn receive(&self, instructions: v1::Instructions) {
        // Rules first: the instructions may name buckets that only the new rules have.
        if let Some(rules) = &instructions.rules
            && rules.version != self.status.rules_version()
        {
            match self.sink.apply_rules(rules.version, &rules.yaml) {
                Ok(()) => {
                    self.status
                        .rules_version
                        .store(rules.version, Ordering::Relaxed);
                    tracing::info!(
                        version = rules.version,
                        "rules from the control plane applied"
                    );
                }
                Err(err) => tracing::error!(
                    version = rules.version,
                    "rules from the control plane refused, keeping version {}: {err}",
                    self.status.rules_version()
                ),
            }
        }
        let ttl = Duration::from_millis(instructions.ttl_ms);
        let interval_end_ms =
            Interval::from_ms(instructions.interval_ms).end_of(instructions.sequence);
        for b in &instructions.buckets {
            self.sink.apply(
                Instruction {
                    service: &b.service,
                    bucket: &b.bucket,
                    drop_ratio: Ratio::from_raw(b.drop_ratio),
                    share: b.share.map(Ratio::from_raw),
                    scope_offered_rps: b.scope_offered_rps,
                    scope_hosts: b.scope_hosts,
                    interval_end_ms,
                },
                ttl,
            );
        }
        if instructions.interval_ms > 0 {
            self.status.interval_ms.store(
                Interval::from_ms(instructions.interval_ms).ms(),
                Ordering::Relaxed,
            );
        }
        self.status
            .last_instructions_ms
            .store(now_ms(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(offered: u64) -> Vec<BucketReport> {
        vec![BucketReport {
            service: "api".into(),
            bucket: "a".into(),
            offered,
            allowed: offered / 2,
            shadow_dropped: 0,
        }]
    }

    #[test]
    fn a_report_carries_its_tail_scaled_to_a_quarter() {
        let interval = Interval::from_ms(1000);
        assert_eq!(Tally::tail_start(interval, 7), 7_750);
        // 100 req/s until 7.500 s, then 1,000 req/s; the tail mark fires 10 ms late.
        let mut tally = Tally::new(7_000);
        tally.mark_tail(counted(50 + 250 + 10), 7_760);
        assert!(tally.tail_marked());
        let report = tally.close(counted(240), 8_000, interval);
        assert_eq!(report.len(), 1);
        assert_eq!(report[0].offered, 550);
        assert_eq!(report[0].allowed, 275);
        assert_eq!(report[0].offered_tail, Some(250));
        // The next interval starts counting at 8.000 s, with no tail until it is marked.
        assert!(!tally.tail_marked());
        let report = tally.close(counted(1_000), 9_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, None);
    }

    #[test]
    fn a_stream_opened_late_scales_its_counts_and_an_unmarked_tail_is_unknown() {
        let interval = Interval::from_ms(1000);
        // Opened at 7.700 s, before the tail, and marked on time.
        let mut tally = Tally::new(7_700);
        tally.mark_tail(counted(50), 7_750);
        let report = tally.close(counted(250), 8_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, Some(250));
        // Opened at 7.900 s, within the tail: the tail is unknown.
        let mut tally = Tally::new(7_900);
        let report = tally.close(counted(100), 8_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, None);
        // Unmarked (the interval changed), the tail folds back into the whole.
        let mut tally = Tally::new(7_000);
        tally.mark_tail(counted(750), 7_750);
        tally.unmark_tail();
        let report = tally.close(counted(250), 8_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, None);
    }
}
