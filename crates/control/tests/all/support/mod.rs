//! A fleet on loopback for the end-to-end control-plane tests: controllers and aggregators as
//! real gRPC servers, and simulated clients linked to them by `spillway_link::ClientLink`, each
//! offering a constant rate per bucket and admitting `offered x (1 - ratio)`. The loop's own
//! behaviour, and every bound on its timing, is tested on simulated time in `spillway-loop`;
//! these tests only wait (generously) for what must come true over real streams.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use spillway_control::{Aggregator, AggregatorOptions, Controller, ControllerOptions, FileRules};
use spillway_core::algo::DropRatio;
use spillway_core::clock::{Clock, Nanos, SystemClock};
use spillway_core::config::{self, Config};
use spillway_core::counters::Snapshot;
use spillway_link::{Backoff, ClientLink, HostLimiters, LinkOptions};
use spillway_loop::{BucketKey, DecodeRules, HostStep, LinkRules};
use spillway_proto::v1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reconnects fast, so a restarted controller is found within an interval or two.
pub fn quick_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(40), Duration::from_millis(150))
}

/// Rules of one global drop-ratio bucket of `limit`/s, reports every 200 ms, instructions valid
/// for 1 s.
pub fn rules(limit: u32) -> String {
    format!(
        "version: 1\ncontrol:\n  report_interval: 200ms\n  instruction_ttl: 1s\nservices:\n  api:\n    buckets:\n      - {{ name: global, limit: {limit}/s, scope: global }}\n"
    )
}

/// `a` is within `tolerance` of `b`.
pub fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance
}

/// Rewrites the rules file with a later modification time, so the poller sees it at once.
pub fn rewrite(path: &Path, yaml: &str) {
    std::fs::write(path, yaml).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(1))
        .unwrap();
}

/// One bucket of a simulated client: its rate, what it offered and admitted so far (fractions
/// of a request included) and its drop-ratio limiter, as the link sets it.
struct Bucket {
    rate: f64,
    offered: f64,
    admitted: f64,
    limiter: DropRatio,
}

struct SimState {
    config: Arc<Config>,
    rules_version: u64,
    /// The last rules message that came down, as it came.
    received: Option<v1::Rules>,
    buckets: HashMap<BucketKey, Bucket>,
    /// Load is integrated up to here.
    since: Nanos,
}

impl SimState {
    fn bucket(&mut self, key: BucketKey) -> &mut Bucket {
        self.buckets.entry(key).or_insert_with(|| Bucket {
            rate: 0.0,
            offered: 0.0,
            admitted: 0.0,
            limiter: DropRatio::new(Duration::from_secs(1)),
        })
    }

    /// Integrates offered and admitted load up to `now` at the rates and ratios in force.
    fn advance(&mut self, now: Nanos) {
        let secs = now.saturating_sub(self.since) as f64 / 1e9;
        for b in self.buckets.values_mut() {
            let ratio = b.limiter.current(self.since).map_or(0.0, |r| r.as_f64());
            b.offered += b.rate * secs;
            b.admitted += b.rate * secs * (1.0 - ratio);
        }
        self.since = self.since.max(now);
    }
}

/// A simulated rate-limit client: a constant offered rate per bucket, linked like a real one.
pub struct SimClient {
    pub host: String,
    pub region: String,
    pub zone: String,
    clock: SystemClock,
    state: Mutex<SimState>,
}

impl SimClient {
    /// Host `host` of `zone` running its own file `yaml` until the control plane sends rules.
    pub fn new(host: String, region: &str, zone: &str, yaml: &str) -> Self {
        Self {
            host,
            region: region.to_owned(),
            zone: zone.to_owned(),
            clock: SystemClock::new(),
            state: Mutex::new(SimState {
                config: Arc::new(config::load_str(yaml, "rules.yaml").unwrap()),
                rules_version: 0,
                received: None,
                buckets: HashMap::new(),
                since: 0,
            }),
        }
    }

    /// The state with its load integrated up to now.
    fn lock(&self) -> MutexGuard<'_, SimState> {
        let mut state = self.state.lock().unwrap();
        state.advance(self.clock.now());
        state
    }

    pub fn set_rate(&self, bucket: &str, rps: f64) {
        self.lock().bucket(BucketKey::new("api", bucket)).rate = rps;
    }

    pub fn rate(&self, bucket: &str) -> f64 {
        self.lock().bucket(BucketKey::new("api", bucket)).rate
    }

    /// The drop ratio the limiter applies now (0 once the instruction expired).
    pub fn ratio(&self, bucket: &str) -> f64 {
        let now = self.clock.now();
        let mut state = self.lock();
        let b = state.bucket(BucketKey::new("api", bucket));
        b.limiter.current(now).map_or(0.0, |r| r.as_f64())
    }

    /// Whether this client drops `ratio` of `bucket` now, to within 0.03.
    pub fn drops(&self, bucket: &str, ratio: f64) -> bool {
        close(self.ratio(bucket), ratio, 0.03)
    }

    /// What this client lets through now: offered x (1 - ratio).
    pub fn admitted(&self, bucket: &str) -> f64 {
        self.rate(bucket) * (1.0 - self.ratio(bucket))
    }

    pub fn rules_version(&self) -> u64 {
        self.lock().rules_version
    }

    /// The last rules message that came down, as it came (`None`: none yet).
    pub fn received_rules(&self) -> Option<v1::Rules> {
        self.lock().received.clone()
    }

    /// The configuration this client runs.
    pub fn running(&self) -> Arc<Config> {
        self.lock().config.clone()
    }

    /// Whether it runs the control section and the services of the file `yaml`.
    pub fn runs_rules_of(&self, yaml: &str) -> bool {
        let file = config::load_str(yaml, "expected").unwrap();
        let running = self.running();
        running.services == file.services && running.control == file.control
    }
}

impl HostLimiters for SimClient {
    fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn config(&self) -> Arc<Config> {
        self.lock().config.clone()
    }

    fn counters(&self, key: &BucketKey) -> Snapshot {
        let mut state = self.lock();
        // Whole requests only, as real counters hold.
        let b = state.bucket(key.clone());
        let allowed = b.admitted.floor() as u64;
        Snapshot {
            allowed,
            dropped: (b.offered.floor() as u64).saturating_sub(allowed),
            ..Snapshot::default()
        }
    }

    fn apply(&self, key: &BucketKey, step: &HostStep) {
        let now = self.clock.now();
        let mut state = self.lock();
        let limiter = &state.bucket(key.clone()).limiter;
        match *step {
            HostStep::DropRatio { ratio, ttl, .. } => limiter.set_for(ratio, now, ttl),
            HostStep::Surge { ratio, until, .. } => limiter.set_surge(ratio, until),
            // No adaptive bucket here: its shares are tested on simulated time.
            _ => {}
        }
    }

    fn apply_rules(
        &self,
        version: u64,
        rules: &v1::Rules,
    ) -> Result<Arc<Config>, Box<dyn std::error::Error + Send + Sync>> {
        // Run with its own settings and validated like a real client's before it switches.
        let mut state = self.lock();
        state.received = Some(rules.clone());
        let config = LinkRules::decode(rules)?.with_own(&state.config, "control-plane")?;
        let config = Arc::new(config);
        state.config = config.clone();
        state.rules_version = version;
        Ok(config)
    }
}

/// One region's controller with its address, so it can be killed and restarted in place.
pub struct RegionNode {
    pub name: String,
    pub addr: SocketAddr,
    pub controller: Option<Controller>,
    pub aggregators: Vec<Aggregator>,
}

/// The whole fleet.
pub struct Fleet {
    pub dir: tempfile::TempDir,
    pub rules: PathBuf,
    pub regions: Vec<RegionNode>,
    pub clients: Vec<Arc<SimClient>>,
    pub links: Vec<ClientLink>,
    /// The report interval of the rules it started with.
    pub interval: Duration,
}

impl Fleet {
    /// `regions` regions of `zones` zones of `clients` clients each, on one rules file that
    /// every controller watches.
    pub async fn start(yaml: &str, regions: usize, zones: usize, clients: usize) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, yaml).unwrap();
        let interval = config::load_str(yaml, "rules.yaml")
            .unwrap()
            .control
            .report_interval;
        // Bind every controller first so each can name the others as peers.
        let addrs: Vec<SocketAddr> = (0..regions)
            .map(|_| {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap()
            })
            .collect();
        let mut fleet = Fleet {
            dir,
            rules,
            regions: Vec::new(),
            clients: Vec::new(),
            links: Vec::new(),
            interval,
        };
        for (r, addr) in addrs.iter().enumerate() {
            let name = format!("r{}", r + 1);
            let mut node = RegionNode {
                name: name.clone(),
                addr: *addr,
                controller: Some(fleet.controller(&name, *addr, &addrs).await),
                aggregators: Vec::new(),
            };
            for z in 0..zones {
                let zone = format!("{name}z{}", z + 1);
                let mut options = AggregatorOptions::new(
                    "127.0.0.1:0".parse().unwrap(),
                    &name,
                    &zone,
                    format!("http://{addr}"),
                );
                options.backoff = quick_backoff();
                let aggregator = Aggregator::start(options).await.unwrap();
                for c in 0..clients {
                    let host = format!("{zone}h{}", c + 1);
                    let client = Arc::new(SimClient::new(host, &name, &zone, yaml));
                    let mut options = LinkOptions::new(
                        format!("http://{}", aggregator.local_addr()),
                        &client.host,
                        &name,
                        &zone,
                    );
                    options.backoff = quick_backoff();
                    fleet
                        .links
                        .push(ClientLink::spawn(options, client.clone()).unwrap());
                    fleet.clients.push(client);
                }
                node.aggregators.push(aggregator);
            }
            fleet.regions.push(node);
        }
        fleet
    }

    async fn controller(&self, region: &str, addr: SocketAddr, all: &[SocketAddr]) -> Controller {
        let rules = FileRules::load(&self.rules)
            .unwrap()
            .watch(Duration::from_millis(30));
        let mut options = ControllerOptions::new(addr, region, rules);
        options.peers = all
            .iter()
            .filter(|a| **a != addr)
            .map(|a| format!("http://{a}"))
            .collect();
        options.backoff = quick_backoff();
        options.admin = Some("127.0.0.1:0".parse().unwrap());
        // The port was free a moment ago; a restart may briefly race its own old socket.
        for _ in 0..50 {
            match Controller::start(options.clone()).await {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        panic!("cannot start the controller of {region} on {addr}");
    }

    /// Stops a region's controller, ending its streams.
    pub async fn kill_controller(&mut self, region: usize) {
        if let Some(c) = self.regions[region].controller.take() {
            c.shutdown().await;
        }
    }

    /// Starts a region's controller again on its old address.
    pub async fn restart_controller(&mut self, region: usize) {
        let all: Vec<SocketAddr> = self.regions.iter().map(|r| r.addr).collect();
        let name = self.regions[region].name.clone();
        let addr = self.regions[region].addr;
        let c = self.controller(&name, addr, &all).await;
        self.regions[region].controller = Some(c);
    }

    pub fn controller_of(&self, region: usize) -> &Controller {
        self.regions[region].controller.as_ref().unwrap()
    }

    /// Long enough for anything the loop does in a few intervals to have happened on a
    /// loaded machine: fifty intervals.
    pub fn patience(&self) -> Duration {
        50 * self.interval
    }

    /// Waits until every link is up and every controller knows all its hosts.
    pub async fn wait_linked(&self) {
        let per_region = self.clients.len() / self.regions.len();
        wait_for(
            Duration::from_secs(20),
            "every client linked and known to its controller",
            || {
                self.links.iter().all(|l| l.connected())
                    && self.regions.iter().all(|r| {
                        r.controller
                            .as_ref()
                            .is_some_and(|c| c.hosts().len() == per_region)
                    })
            },
        )
        .await;
    }

    /// Sum of what every client admits now.
    pub fn admitted(&self, bucket: &str) -> f64 {
        self.clients.iter().map(|c| c.admitted(bucket)).sum()
    }

    pub async fn shutdown(mut self) {
        for link in std::mem::take(&mut self.links) {
            link.shutdown().await;
        }
        for region in std::mem::take(&mut self.regions) {
            for a in region.aggregators {
                a.shutdown().await;
            }
            if let Some(c) = region.controller {
                c.shutdown().await;
            }
        }
    }
}

/// Polls `condition` every 10 ms until it holds; panics naming `what` after `limit`. Returns how
/// long it took.
pub async fn wait_for(
    limit: Duration,
    what: &str,
    mut condition: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if condition() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// GETs `path` of an admin listener every 20 ms until its status is 200 and `accept` holds for
/// its body, at most `limit`, and returns the body.
pub async fn wait_get(
    admin: SocketAddr,
    path: &str,
    limit: Duration,
    accept: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let (status, body) = get(admin, path).await;
        if status == 200 && accept(&body) {
            return body;
        }
        assert!(
            start.elapsed() < limit,
            "{path} never showed it: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`wait_get`] for a JSON document.
pub async fn wait_json(
    admin: SocketAddr,
    path: &str,
    limit: Duration,
    accept: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let parse = |body: &str| serde_json::from_str::<serde_json::Value>(body).ok();
    let body = wait_get(admin, path, limit, |body| {
        parse(body).is_some_and(|d| accept(&d))
    })
    .await;
    parse(&body).unwrap()
}

/// A GET on an admin listener: (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}
