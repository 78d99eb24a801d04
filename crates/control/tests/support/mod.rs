//! A fleet on loopback for the control-loop tests: controllers, aggregators and simulated
//! clients that close the loop (each admits `offered x (1 - ratio)` of its own load).

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_control::{
    Aggregator, AggregatorOptions, Backoff, BucketKey, BucketReport, ClientLink, Controller,
    ControllerOptions, FileRules, Instruction, InstructionSink, LinkOptions, LinkStatus,
    ReportSource,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reconnects fast, so a restarted controller is found within one 200 ms interval.
pub fn quick_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(40), Duration::from_millis(150))
}

/// A configuration with the given report interval, TTL and bucket lines.
pub fn config(interval_ms: u64, ttl_ms: u64, buckets: &[&str]) -> String {
    let mut yaml = format!(
        "version: 1\ncontrol:\n  report_interval: {interval_ms}ms\n  instruction_ttl: {ttl_ms}ms\nservices:\n  api:\n    buckets:\n"
    );
    for b in buckets {
        yaml.push_str("      - ");
        yaml.push_str(b);
        yaml.push('\n');
    }
    yaml
}

/// Rewrites the rules file with a later modification time, so the poller sees it at once.
pub fn rewrite(path: &Path, yaml: &str) {
    std::fs::write(path, yaml).unwrap();
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(std::time::SystemTime::now() + Duration::from_secs(1))
        .unwrap();
}

#[derive(Default)]
struct SimState {
    rates: HashMap<BucketKey, f64>,
    ratios: HashMap<BucketKey, (f64, Instant)>,
    shares: HashMap<BucketKey, f64>,
    /// Offered and allowed since the last report, integrated over time.
    acc: HashMap<BucketKey, (f64, f64)>,
    since: Option<Instant>,
    /// The first drop ratio above 0 applied per bucket, with when (Unix ms), until cleared.
    first_drop: HashMap<BucketKey, (f64, u64)>,
    rules_version: u64,
    yaml: String,
}

impl SimState {
    fn ratio(&self, key: &BucketKey, now: Instant) -> f64 {
        match self.ratios.get(key) {
            Some(&(ratio, expires)) if expires > now => ratio,
            _ => 0.0,
        }
    }

    /// Integrates offered and admitted load up to `now` at the rates and ratios in force.
    fn advance(&mut self, now: Instant) {
        let since = self.since.replace(now).unwrap_or(now);
        let secs = now.saturating_duration_since(since).as_secs_f64();
        let rates: Vec<(BucketKey, f64)> =
            self.rates.iter().map(|(k, r)| (k.clone(), *r)).collect();
        for (key, rate) in rates {
            let ratio = self.ratio(&key, now);
            let acc = self.acc.entry(key).or_default();
            acc.0 += rate * secs;
            acc.1 += rate * secs * (1.0 - ratio);
        }
    }
}

/// A simulated rate-limit client: a constant offered rate per bucket.
pub struct SimClient {
    pub host: String,
    pub region: String,
    pub zone: String,
    state: Mutex<SimState>,
}

impl SimClient {
    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap()
    }

    pub fn set_rate(&self, bucket: &str, rps: f64) {
        let mut state = self.lock();
        state.advance(Instant::now());
        state.rates.insert(BucketKey::new("api", bucket), rps);
    }

    pub fn rate(&self, bucket: &str) -> f64 {
        self.lock()
            .rates
            .get(&BucketKey::new("api", bucket))
            .copied()
            .unwrap_or(0.0)
    }

    /// The drop ratio in force now (0 once the instruction expired).
    pub fn ratio(&self, bucket: &str) -> f64 {
        self.lock()
            .ratio(&BucketKey::new("api", bucket), Instant::now())
    }

    /// What this client lets through now: offered x (1 - ratio).
    pub fn admitted(&self, bucket: &str) -> f64 {
        self.rate(bucket) * (1.0 - self.ratio(bucket))
    }

    pub fn share(&self, bucket: &str) -> Option<f64> {
        self.lock()
            .shares
            .get(&BucketKey::new("api", bucket))
            .copied()
    }

    /// The first drop ratio above 0 applied to `bucket` since the last call of
    /// [`SimClient::clear_first_drop`], and when it was applied (Unix ms).
    pub fn first_drop(&self, bucket: &str) -> Option<(f64, u64)> {
        self.lock()
            .first_drop
            .get(&BucketKey::new("api", bucket))
            .copied()
    }

    pub fn clear_first_drop(&self) {
        self.lock().first_drop.clear();
    }

    pub fn rules_version(&self) -> u64 {
        self.lock().rules_version
    }

    pub fn rules_yaml(&self) -> String {
        self.lock().yaml.clone()
    }
}

impl ReportSource for SimClient {
    fn report(&self) -> Vec<BucketReport> {
        let mut state = self.lock();
        state.advance(Instant::now());
        // Whole requests only, as real counters hold; the fractions carry over to the next.
        state
            .acc
            .iter_mut()
            .map(|(key, (offered, allowed))| {
                let whole = (offered.floor(), allowed.floor());
                *offered -= whole.0;
                *allowed -= whole.1;
                BucketReport {
                    service: key.service.clone(),
                    bucket: key.bucket.clone(),
                    offered: whole.0 as u64,
                    allowed: whole.1 as u64,
                    shadow_dropped: 0,
                }
            })
            .collect()
    }
}

impl InstructionSink for SimClient {
    fn apply_rules(
        &self,
        version: u64,
        yaml: &str,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        // Validate like a real client would before switching.
        spillway_core::config::load_str(yaml, "control-plane")?;
        let mut state = self.lock();
        state.rules_version = version;
        state.yaml = yaml.to_owned();
        Ok(())
    }

    fn apply(&self, instruction: Instruction<'_>, ttl: Duration) {
        let now = Instant::now();
        let mut state = self.lock();
        state.advance(now);
        let key = BucketKey::new(instruction.service, instruction.bucket);
        if let Some(share) = instruction.share {
            state.shares.insert(key.clone(), share.as_f64());
        }
        let ratio = instruction.drop_ratio.as_f64();
        if ratio > 0.0 {
            state
                .first_drop
                .entry(key.clone())
                .or_insert((ratio, spillway_control::timing::now_ms()));
        }
        state.ratios.insert(key, (ratio, now + ttl));
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
    pub interval: Duration,
}

impl Fleet {
    /// `regions` regions of `zones` zones of `clients` clients each, on one rules file that
    /// every controller watches.
    pub async fn start(
        yaml: &str,
        interval: Duration,
        regions: usize,
        zones: usize,
        clients: usize,
    ) -> Fleet {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(&rules, yaml).unwrap();
        // Bind every controller first so each can name the others as peers.
        let mut addrs = Vec::new();
        for _ in 0..regions {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            addrs.push(l.local_addr().unwrap());
        }
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
                controller: None,
                aggregators: Vec::new(),
            };
            node.controller = Some(fleet.controller(&name, *addr, &addrs).await);
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
                    let client = Arc::new(SimClient {
                        host: format!("{zone}h{}", c + 1),
                        region: name.clone(),
                        zone: zone.clone(),
                        state: Mutex::new(SimState::default()),
                    });
                    let mut options = LinkOptions::new(
                        format!("http://{}", aggregator.local_addr()),
                        &client.host,
                        &name,
                        &zone,
                    );
                    options.interval = interval;
                    options.backoff = quick_backoff();
                    let link = ClientLink::spawn(options, client.clone(), client.clone()).unwrap();
                    fleet.clients.push(client);
                    fleet.links.push(link);
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

    pub fn clients_of(&self, region: &str) -> Vec<Arc<SimClient>> {
        self.clients
            .iter()
            .filter(|c| c.region == region)
            .cloned()
            .collect()
    }

    pub fn statuses(&self) -> Vec<Arc<LinkStatus>> {
        self.links.iter().map(|l| l.status()).collect()
    }

    /// Waits until every link is up and every controller knows all its hosts.
    pub async fn wait_linked(&self) {
        let per_region = self.clients.len() / self.regions.len();
        wait_for(
            Duration::from_secs(10),
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
