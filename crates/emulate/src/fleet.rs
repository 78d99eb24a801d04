//! The fleet: N emulated hosts, each with its own [`ClientLink`] (its own stream, its own host
//! core, and with TLS its own certificate), read every 100 ms until the run ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use spillway_core::clock::{Clock, SystemClock};
use spillway_core::config::Config;
use spillway_link::{Backoff, ClientLink, Housekeeping, LinkOptions, LinkStatus, Stop, UrlError};
use spillway_loop::{BucketKey, HostCore, HostId};
use spillway_tls::{TlsError, TlsFiles, TlsSource};
use tokio::task::JoinSet;

use crate::host::{Common, EmulatedHost};
use crate::record::{FleetSummary, Reading, Record, TICK_S};
use crate::shape::LoadShape;

/// Hosts whose links' housekeeping one task runs ([`Housekeeping`]). Small groups keep each
/// turn of a task short, so the hosts' reports at the end of an interval wait little behind it:
/// with groups of 64, a fleet too large for the emulator's cores (5,000 hosts on 2 cores, 7
/// December 2026) had its reports later and admitted 1.12-1.22 times the limit against 1.09-1.12
/// with 16 (and 1.04-1.09 with a task per host); at 2,000 hosts, which it keeps up with, every
/// size held the limit.
const HOUSEKEEPING_GROUP: usize = 16;

/// Each host's certificate: `DIR/HOST/cert.pem`, `key.pem` and `ca.pem`, as
/// `spillway certs issue --role proxy --hosts N --out DIR` writes them.
#[derive(Debug, Clone)]
pub struct HostCerts {
    pub dir: PathBuf,
    pub trust_domain: String,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// The hosts' own rules until the control plane sends its own: the controller's file.
    pub config: Arc<Config>,
    pub hosts: usize,
    /// Load goes to the first this many control-plane buckets of the rules.
    pub buckets: usize,
    /// The zone's aggregators: one, or several that the hosts spread over and fail over between.
    pub aggregators: Vec<String>,
    pub region: String,
    pub zone: String,
    /// Host ids are `PREFIX-0`, `PREFIX-1`, ...
    pub host_prefix: String,
    pub seconds: Duration,
    /// The fleet's offered rate per loaded bucket, requests per second, before the shape's
    /// multiple; `None`: 1.5 times each bucket's limit.
    pub rate: Option<f64>,
    pub shape: LoadShape,
    pub tls: Option<HostCerts>,
    pub backoff: Backoff,
}

/// Why a fleet cannot run; each says what to change.
#[derive(Debug, thiserror::Error)]
pub enum EmulateError {
    #[error("--hosts must be at least 1")]
    NoHosts,
    #[error(
        "the rules have no bucket on the control plane (a drop-ratio or adaptive bucket of store: control-plane), so there is nothing to emulate"
    )]
    NoBuckets,
    #[error(
        "--buckets {asked}: the rules have only {has} control-plane bucket{}; give at most {has} or add buckets to the file",
        if *has == 1 { "" } else { "s" }
    )]
    TooManyBuckets { asked: usize, has: usize },
    #[error(
        "host {host}'s certificate: {source} (issue them with `spillway certs issue --role proxy --hosts N --out DIR`)"
    )]
    Certs {
        host: String,
        #[source]
        source: TlsError,
    },
    #[error(transparent)]
    Url(#[from] UrlError),
}

/// The id of host `i`.
pub fn host_id(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i}")
}

/// The control-plane buckets of `config` in the host core's order, with their limits per second.
pub fn control_buckets(config: &Config) -> Vec<(BucketKey, f64)> {
    let core = HostCore::new(
        HostId {
            host_id: String::new(),
            region: String::new(),
            zone: String::new(),
        },
        config,
        0,
    );
    core.buckets()
        .map(|key| {
            let limit = config
                .services
                .iter()
                .filter(|s| s.name == key.service)
                .flat_map(|s| &s.buckets)
                .find(|b| b.name == key.bucket)
                .map_or(0.0, |b| b.limit.per_second());
            (key.clone(), limit)
        })
        .collect()
}

/// Runs the fleet for `options.seconds` or until `stop`, then closes every link (each flushes
/// its last report) and returns what it saw.
pub async fn run(options: FleetOptions, mut stop: Stop) -> Result<FleetSummary, EmulateError> {
    if options.hosts == 0 {
        return Err(EmulateError::NoHosts);
    }
    let all = control_buckets(&options.config);
    if all.is_empty() {
        return Err(EmulateError::NoBuckets);
    }
    if options.buckets > all.len() {
        return Err(EmulateError::TooManyBuckets {
            asked: options.buckets,
            has: all.len(),
        });
    }
    let loaded = &all[..options.buckets];
    let limit_rps: f64 = loaded.iter().map(|(_, limit)| limit).sum();
    // In the host core's order, the order the links ask in (`control_buckets`).
    let rates: Arc<Vec<(BucketKey, f64)>> = Arc::new(
        loaded
            .iter()
            .map(|(key, limit)| {
                let fleet = options.rate.unwrap_or(1.5 * limit);
                (key.clone(), fleet / options.hosts as f64)
            })
            .collect(),
    );

    // Every certificate is read before any host dials, so a missing one stops the run at once.
    let ids: Vec<String> = (0..options.hosts)
        .map(|i| host_id(&options.host_prefix, i))
        .collect();
    let mut sources = Vec::with_capacity(options.hosts);
    for id in &ids {
        sources.push(match &options.tls {
            None => None,
            Some(certs) => {
                let dir = certs.dir.join(id);
                let files = TlsFiles {
                    cert: dir.join("cert.pem"),
                    key: dir.join("key.pem"),
                    ca: Some(dir.join("ca.pem")),
                };
                Some(
                    TlsSource::load(files, &certs.trust_domain).map_err(|source| {
                        EmulateError::Certs {
                            host: id.clone(),
                            source,
                        }
                    })?,
                )
            }
        });
    }

    let common = Common {
        clock: SystemClock::new(),
        shape: options.shape,
    };
    // The links' 50 ms housekeeping runs in one task per group of hosts rather than one per
    // host: the groups spread it over the runtime's threads, and their turns over the 50 ms.
    let count = options.hosts.div_ceil(HOUSEKEEPING_GROUP);
    let turn = Duration::from_nanos(spillway_core::surge::TICK_NS);
    let groups: Vec<Housekeeping> = (0..count)
        .map(|g| Housekeeping::start_after(turn * g as u32 / count as u32))
        .collect();
    let mut hosts = Vec::with_capacity(options.hosts);
    let mut links = Vec::with_capacity(options.hosts);
    let mut statuses: Vec<Arc<LinkStatus>> = Vec::with_capacity(options.hosts);
    for (i, (id, tls)) in ids.into_iter().zip(sources).enumerate() {
        let host = Arc::new(EmulatedHost::new(
            common,
            options.config.clone(),
            rates.clone(),
        ));
        let mut link_options = LinkOptions::new("", id, &options.region, &options.zone);
        link_options.aggregators = options.aggregators.clone();
        link_options.backoff = options.backoff.clone();
        link_options.tls = tls;
        let link =
            ClientLink::spawn_kept(link_options, host.clone(), &groups[i / HOUSEKEEPING_GROUP])?;
        statuses.push(link.status());
        links.push(link);
        hosts.push(host);
    }
    tracing::info!(hosts = hosts.len(), "every host is dialling its aggregator");

    let read = |t: f64| {
        let mut reading = Reading {
            t,
            ..Reading::default()
        };
        for status in &statuses {
            reading.connected += usize::from(status.connected());
            reading.reports += status.reports();
            reading.instructions += status.instructions();
            reading.connects += status.connects();
        }
        for host in &hosts {
            let totals = host.totals();
            reading.offered += totals.offered;
            reading.admitted += totals.admitted;
        }
        reading
    };
    let mut record = Record::default();
    record.readings.push(read(0.0));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(TICK_S));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let end = options.seconds.as_secs_f64();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let t = common.clock.now() as f64 / 1e9;
        record.readings.push(read(t));
        if t >= end {
            break;
        }
    }

    // Every link flushes its last report and closes its stream, all at once.
    let mut closing = JoinSet::new();
    for link in links {
        closing.spawn(link.shutdown());
    }
    while closing.join_next().await.is_some() {}
    Ok(record.summary(
        options.hosts,
        options.buckets,
        options.tls.is_some(),
        limit_rps,
        options.shape.step,
    ))
}
