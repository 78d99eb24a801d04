//! What mutual TLS costs the control plane: one aggregator on loopback, measured in
//! plaintext and over mutual TLS in the same run, interleaved (plain, TLS, plain, TLS, ...) so
//! the machine's noise falls on both.
//!
//! ```text
//! cargo run --release -p spillway-control --example ingest -- [--clients 64] [--seconds 5]
//!     [--connects 200] [--rounds 3]
//! ```
//!
//! Two things per round and transport:
//! - **Opening a link**: `spillway_link::Target::connect` to the running aggregator (TCP, the
//!   TLS handshake with both certificates verified, HTTP/2 setup), `--connects` times one after
//!   another; the median and p99 of each, and the CPU each costs both ends together.
//! - **Steady-state ingest**: `--clients` streams, each on its own connection under its own
//!   proxy certificate (host `hN` of region `eu`, zone `a`), send `Report`s to `Aggregator/Link`
//!   as fast as the aggregator takes them for `--seconds`, then close their half of the stream.
//!   The aggregator ends a stream's answer only after it has handed every report of it to its
//!   zone core, so a stream that ends cleanly had all its reports ingested (the aggregator
//!   counts no ingested reports itself: `/metrics` has only the late ones). Reports per second
//!   run from the start to the last stream's end; CPU is read from `/proc/self/task/*/schedstat`
//!   over the same span, for the whole process and for the aggregator's own threads.
//!
//! The clients and the aggregator share the process and its cores, so the process's CPU counts
//! both ends of every byte (encrypted by a client, decrypted by the aggregator); the
//! aggregator's threads are what a zone's aggregator would spend.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spillway_control::{Aggregator, AggregatorOptions};
use spillway_link::{Target, now_ms};
use spillway_proto::v1;
use spillway_proto::v1::aggregator_client::AggregatorClient;
use spillway_tls::certs::{self, Leaf, LeafRole};
use spillway_tls::{Expect, TlsFiles, TlsSource, WorkloadRole};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

type BoxError = Box<dyn Error + Send + Sync>;

const TRUST_DOMAIN: &str = "spillway.local";
const REGION: &str = "eu";
const ZONE: &str = "a";
const INTERVAL_MS: u64 = 1000;
/// The aggregator's controller: a port nobody listens on, so its upstream link only retries.
const NO_CONTROLLER: &str = "127.0.0.1:9";
/// A cap on one stream's reports, whatever the machine's speed.
const MAX_REPORTS_PER_STREAM: u64 = 50_000_000;
/// How long opening one link, or a stream's last reports, may take before the run fails.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Links opened before each handshake series and not counted (first-use costs).
const WARM_UP_CONNECTS: usize = 5;
/// Reports queued on a stream before its sender waits for the aggregator.
const QUEUE: usize = 256;

#[derive(Debug, Clone, Copy)]
struct Args {
    clients: usize,
    seconds: u64,
    connects: usize,
    rounds: usize,
}

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = Args {
            clients: 64,
            seconds: 5,
            connects: 200,
            rounds: 3,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            if flag == "--help" || flag == "-h" {
                return Err(
                    "usage: ingest [--clients N] [--seconds S] [--connects K] [--rounds R]".into(),
                );
            }
            let value = it.next().ok_or(format!("{flag} needs a value"))?;
            let number = |max: u64| -> Result<u64, String> {
                match value.parse::<u64>() {
                    Ok(n) if (1..=max).contains(&n) => Ok(n),
                    _ => Err(format!(
                        "{flag} takes a number from 1 to {max}, not {value:?}"
                    )),
                }
            };
            match flag.as_str() {
                "--clients" => args.clients = number(1024)? as usize,
                "--seconds" => args.seconds = number(600)?,
                "--connects" => args.connects = number(100_000)? as usize,
                "--rounds" => args.rounds = number(99)? as usize,
                _ => return Err(format!("unknown flag {flag}; try --help")),
            }
        }
        Ok(args)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Plain,
    Tls,
}

/// In the order of every round.
const TRANSPORTS: [Transport; 2] = [Transport::Plain, Transport::Tls];

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Plain => "plaintext",
            Transport::Tls => "mutual TLS",
        }
    }
}

/// The development PKI of the run: an aggregator leaf and one proxy leaf per client host.
struct Pki {
    _dir: tempfile::TempDir,
    aggregator: Arc<TlsSource>,
    proxies: Vec<Arc<TlsSource>>,
}

fn leaf(role: LeafRole, host: Option<String>) -> Leaf {
    Leaf {
        role,
        region: Some(REGION.into()),
        zone: Some(ZONE.into()),
        host,
        names: vec![],
        days: 1,
    }
}

fn source(dir: &Path) -> Result<Arc<TlsSource>, BoxError> {
    Ok(TlsSource::load(
        TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            ca: Some(dir.join("ca.pem")),
        },
        TRUST_DOMAIN,
    )?)
}

impl Pki {
    fn make(clients: usize) -> Result<Self, BoxError> {
        let dir = tempfile::tempdir()?;
        let ca = dir.path().join("ca");
        certs::init(&ca, TRUST_DOMAIN, false)?;
        let issue = |role, host: Option<String>, out: PathBuf| -> Result<_, BoxError> {
            certs::issue(&ca, TRUST_DOMAIN, &leaf(role, host), &out, false)?;
            source(&out)
        };
        let aggregator = issue(LeafRole::Aggregator, None, dir.path().join("agg"))?;
        let proxies = (0..clients)
            .map(|i| issue(LeafRole::Proxy, Some(host(i)), dir.path().join(host(i))))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            _dir: dir,
            aggregator,
            proxies,
        })
    }
}

fn host(i: usize) -> String {
    format!("h{i}")
}

/// What a proxy accepts as its aggregator, as `spillway_link::ClientLink` does.
fn expect_aggregator() -> Expect {
    Expect::new(
        format!("the aggregator of region {REGION}, zone {ZONE}"),
        |identity| match &identity.role {
            WorkloadRole::Aggregator { region, zone } if region == REGION && zone == ZONE => Ok(()),
            _ => Err("a proxy reports only to its own zone's aggregator".into()),
        },
    )
}

fn target(transport: Transport, aggregator: &Aggregator, client: &Arc<TlsSource>) -> Target {
    let addr = aggregator.local_addr();
    let made = match transport {
        Transport::Plain => Target::plain(&format!("http://{addr}")),
        Transport::Tls => Target::new(
            &format!("https://{addr}"),
            Some((client.clone(), expect_aggregator())),
        ),
    };
    made.expect("a loopback address is a usable URL")
}

/// A realistic report: three buckets of one second's counts.
fn report(host: &str) -> v1::Report {
    let bucket = |service: &str, bucket: &str, offered: u64, allowed: u64| v1::BucketCounts {
        service: service.into(),
        bucket: bucket.into(),
        offered,
        allowed,
        shadow_dropped: 0,
        offered_tail: Some(offered / 4),
        offered_squares: None,
        hosts: None,
        tier_offered: Vec::new(),
        id: 0,
    };
    v1::Report {
        surge: false,
        host_id: host.into(),
        zone: ZONE.into(),
        region: REGION.into(),
        rules_version: 0,
        sequence: 0,
        interval_ms: INTERVAL_MS,
        buckets: vec![
            bucket("checkout", "per-caller", 1_200, 1_150),
            bucket("checkout", "all", 1_200, 1_200),
            bucket("search", "all", 5_400, 5_400),
        ],
    }
}

/// CPU time so far, in nanoseconds: the process's live threads, and the aggregator's among them
/// (its runtime's threads are named `agg`). Threads are kept alive for the whole run, so the
/// live threads' sum is the process's.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    process_ns: u64,
    aggregator_ns: u64,
}

impl Cpu {
    fn now() -> Self {
        let mut cpu = Cpu::default();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return cpu;
        };
        for task in tasks.flatten() {
            let path = task.path();
            let Some(ns) = std::fs::read_to_string(path.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            else {
                continue;
            };
            cpu.process_ns += ns;
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            if comm.starts_with("agg") {
                cpu.aggregator_ns += ns;
            }
        }
        cpu
    }

    fn since(self, start: Cpu) -> Cpu {
        Cpu {
            process_ns: self.process_ns.saturating_sub(start.process_ns),
            aggregator_ns: self.aggregator_ns.saturating_sub(start.aggregator_ns),
        }
    }
}

/// The process's CPU time as the kernel accounts it for the whole process (exited threads
/// included), in seconds: utime + stime of `/proc/self/stat`, at 100 ticks a second.
fn process_stat_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command's closing parenthesis start at field 3 (state).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(utime), Some(stime)) => (utime + stime) as f64 / 100.0,
        _ => 0.0,
    }
}

#[derive(Debug, Clone, Default)]
struct Handshakes {
    p50: Duration,
    p99: Duration,
    /// CPU per link opened, both ends.
    cpu_per_connect: Duration,
}

async fn handshakes(
    transport: Transport,
    aggregator: &Aggregator,
    client: &Arc<TlsSource>,
    connects: usize,
) -> Result<Handshakes, BoxError> {
    let target = target(transport, aggregator, client);
    let open = || async {
        match tokio::time::timeout(STEP_TIMEOUT, target.connect()).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(err)) => Err(BoxError::from(format!("connect: {err:?}"))),
            Err(_) => Err(BoxError::from("connect timed out")),
        }
    };
    for _ in 0..WARM_UP_CONNECTS {
        drop(open().await?);
    }
    let mut times = Vec::with_capacity(connects);
    let cpu = Cpu::now();
    for _ in 0..connects {
        let started = Instant::now();
        let channel = open().await?;
        times.push(started.elapsed());
        drop(channel);
    }
    // Let the aggregator finish with the last connections before reading its CPU.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cpu = Cpu::now().since(cpu);
    times.sort();
    Ok(Handshakes {
        p50: percentile(&times, 0.50),
        p99: percentile(&times, 0.99),
        cpu_per_connect: Duration::from_nanos(cpu.process_ns / connects as u64),
    })
}

/// The smallest value with at least `q` of them at or below it.
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[derive(Debug, Clone, Default)]
struct Ingest {
    reports: u64,
    failed_streams: usize,
    elapsed: Duration,
    cpu: Cpu,
}

impl Ingest {
    fn per_second(&self) -> f64 {
        self.reports as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU seconds per million reports, from `ns` of CPU.
    fn cpu_per_million(&self, ns: u64) -> f64 {
        ns as f64 / 1e9 / (self.reports.max(1) as f64 / 1e6)
    }
}

async fn ingest(
    transport: Transport,
    aggregator: &Aggregator,
    pki: &Pki,
    seconds: u64,
) -> Result<Ingest, BoxError> {
    // Every stream opens before the clock starts.
    let mut streams = Vec::with_capacity(pki.proxies.len());
    for (i, proxy) in pki.proxies.iter().enumerate() {
        let target = target(transport, aggregator, proxy);
        let channel = tokio::time::timeout(STEP_TIMEOUT, target.connect())
            .await
            .map_err(|_| "connect timed out")??;
        let (tx, rx) = mpsc::channel(QUEUE);
        let inbound = tokio::time::timeout(
            STEP_TIMEOUT,
            AggregatorClient::new(channel).link(ReceiverStream::new(rx)),
        )
        .await
        .map_err(|_| "opening the stream timed out")??
        .into_inner();
        streams.push((host(i), tx, inbound));
    }
    let cpu = Cpu::now();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let tasks: Vec<_> = streams
        .into_iter()
        .map(|(host, tx, mut inbound)| {
            tokio::spawn(async move {
                let template = report(&host);
                let mut sent = 0u64;
                while sent < MAX_REPORTS_PER_STREAM && Instant::now() < deadline {
                    let mut report = template.clone();
                    report.sequence = now_ms() / INTERVAL_MS;
                    if tx.send(report).await.is_err() {
                        return (sent, false);
                    }
                    sent += 1;
                }
                // Closing our half: the aggregator answers the stream's end once it has taken
                // every report queued before it.
                drop(tx);
                let drained = tokio::time::timeout(STEP_TIMEOUT, async {
                    loop {
                        match inbound.message().await {
                            Ok(Some(_instructions)) => continue,
                            Ok(None) => return true,
                            Err(_) => return false,
                        }
                    }
                })
                .await;
                (sent, drained == Ok(true))
            })
        })
        .collect();
    let mut result = Ingest::default();
    for task in tasks {
        let (sent, ok) = task.await?;
        if ok {
            result.reports += sent;
        } else {
            result.failed_streams += 1;
        }
    }
    result.elapsed = started.elapsed();
    result.cpu = Cpu::now().since(cpu);
    Ok(result)
}

async fn start_aggregator(transport: Transport, pki: &Pki) -> Result<Aggregator, BoxError> {
    let controller = match transport {
        Transport::Plain => format!("http://{NO_CONTROLLER}"),
        Transport::Tls => format!("https://{NO_CONTROLLER}"),
    };
    let mut options = AggregatorOptions::new("127.0.0.1:0".parse()?, REGION, ZONE, controller);
    if transport == Transport::Tls {
        options.tls = Some(pki.aggregator.clone());
    }
    Ok(Aggregator::start(options).await?)
}

/// One round's figures for one transport.
#[derive(Debug, Clone, Default)]
struct Round {
    handshakes: Handshakes,
    ingest: Ingest,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), BoxError> {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    // Threads live for the whole run, so the live threads' CPU is the process's.
    let runtime = |name: &str| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name(name)
            .thread_keep_alive(Duration::from_secs(24 * 3600))
            .enable_all()
            .build()
    };
    let agg_rt = runtime("agg")?;
    let client_rt = runtime("client")?;
    eprintln!(
        "making a CA and {} proxy leaves, then {} rounds of plain and mutual TLS ({} connects, {} streams for {} s each)",
        args.clients, args.rounds, args.connects, args.clients, args.seconds
    );
    let pki = Pki::make(args.clients)?;
    let stat_start = process_stat_seconds();
    let cpu_start = Cpu::now();
    let mut rounds: Vec<[Round; 2]> = Vec::with_capacity(args.rounds);
    for r in 0..args.rounds {
        let mut pair: [Round; 2] = Default::default();
        for (t, &transport) in TRANSPORTS.iter().enumerate() {
            let aggregator = agg_rt.block_on(start_aggregator(transport, &pki))?;
            let handshakes = client_rt.block_on(handshakes(
                transport,
                &aggregator,
                &pki.proxies[0],
                args.connects,
            ))?;
            let ingest = client_rt.block_on(ingest(transport, &aggregator, &pki, args.seconds))?;
            agg_rt.block_on(aggregator.shutdown());
            eprintln!(
                "round {} {:>10}: connect p50 {:.3} ms p99 {:.3} ms ({:.3} ms CPU); {} reports in {:.2} s = {:.0}/s, {:.2} CPU-s ({:.2} aggregator){}",
                r + 1,
                transport.name(),
                ms(handshakes.p50),
                ms(handshakes.p99),
                ms(handshakes.cpu_per_connect),
                ingest.reports,
                ingest.elapsed.as_secs_f64(),
                ingest.per_second(),
                ingest.cpu.process_ns as f64 / 1e9,
                ingest.cpu.aggregator_ns as f64 / 1e9,
                if ingest.failed_streams > 0 {
                    format!(", {} streams FAILED (not counted)", ingest.failed_streams)
                } else {
                    String::new()
                },
            );
            pair[t] = Round { handshakes, ingest };
        }
        rounds.push(pair);
    }
    let live = Cpu::now().since(cpu_start).process_ns as f64 / 1e9;
    let stat = process_stat_seconds() - stat_start;
    print_tables(&args, &rounds);
    println!();
    println!(
        "CPU check: {live:.2} s by the threads' schedstat, {stat:.2} s by /proc/self/stat (10 ms ticks)."
    );
    Ok(())
}

fn print_tables(args: &Args, rounds: &[[Round; 2]]) {
    type Measure = fn(&Round) -> f64;
    // What each row shows, and its decimals.
    let rows: [(&str, Measure, usize); 6] = [
        ("reports/s ingested", |r| r.ingest.per_second(), 0),
        (
            "CPU-s per million reports (process: clients + aggregator)",
            |r| r.ingest.cpu_per_million(r.ingest.cpu.process_ns),
            2,
        ),
        (
            "CPU-s per million reports (aggregator's threads)",
            |r| r.ingest.cpu_per_million(r.ingest.cpu.aggregator_ns),
            2,
        ),
        ("link open (connect), p50 ms", |r| ms(r.handshakes.p50), 3),
        ("link open (connect), p99 ms", |r| ms(r.handshakes.p99), 3),
        (
            "CPU per link opened, both ends, ms",
            |r| ms(r.handshakes.cpu_per_connect),
            3,
        ),
    ];
    println!(
        "{} rounds, plain and TLS interleaved; {} streams for {} s; {} sequential connects. Medians over the rounds:",
        rounds.len(),
        args.clients,
        args.seconds,
        args.connects
    );
    println!();
    println!("| measure | plaintext | mutual TLS | TLS / plain |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, measure, decimals) in rows {
        let med = |t: usize| median(rounds.iter().map(|r| measure(&r[t])).collect());
        let (plain, tls) = (med(0), med(1));
        println!(
            "| {name} | {plain:.decimals$} | {tls:.decimals$} | {:.2}x |",
            tls / plain
        );
    }
    println!();
    println!("Every round:");
    println!();
    println!(
        "| round | transport | reports/s | CPU-s / M reports (process) | CPU-s / M reports (aggregator) | connect p50 ms | connect p99 ms | CPU ms / connect | failed streams |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (i, pair) in rounds.iter().enumerate() {
        for (transport, r) in TRANSPORTS.iter().zip(pair) {
            println!(
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {} |",
                i + 1,
                transport.name(),
                r.ingest.per_second(),
                r.ingest.cpu_per_million(r.ingest.cpu.process_ns),
                r.ingest.cpu_per_million(r.ingest.cpu.aggregator_ns),
                ms(r.handshakes.p50),
                ms(r.handshakes.p99),
                ms(r.handshakes.cpu_per_connect),
                r.ingest.failed_streams,
            );
        }
    }
}
