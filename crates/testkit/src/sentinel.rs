//! A private Redis Sentinel deployment: a primary, a replica and three sentinels tuned to fail
//! over within a few seconds, so a test can kill the primary and watch clients follow.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::process::{Process, STARTUP_TIMEOUT, find_on_path, on_free_port, wait_for};
use crate::redis::{RedisOptions, RedisServer, info_field, pings};
use crate::resp;

/// The name under which the sentinels monitor the primary.
pub const MASTER_NAME: &str = "mymaster";

const SENTINELS: usize = 3;
const QUORUM: usize = 2;
/// A primary silent this long is subjectively down; Redis's default is 30 s.
const DOWN_AFTER_MS: u64 = 1000;
/// Bounds one failover attempt; Redis's default is 3 minutes.
const FAILOVER_TIMEOUT_MS: u64 = 3000;
/// How many of each sentinel's last log events a failover that did not come reports.
const FAILOVER_EVENTS: usize = 8;

struct Sentinel {
    port: u16,
    // Held only so that drop kills the process.
    _process: Process,
}

impl Sentinel {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `SENTINEL <subcommand> mymaster`.
    fn ask(&self, subcommand: &str) -> Option<resp::Reply> {
        resp::command(self.addr(), &["SENTINEL", subcommand, MASTER_NAME]).ok()
    }

    fn primary(&self) -> Option<SocketAddr> {
        let reply = self.ask("GET-MASTER-ADDR-BY-NAME")?;
        let [ip, port] = reply.items() else {
            return None;
        };
        let ip: Ipv4Addr = ip.text()?.parse().ok()?;
        let port: u16 = port.text()?.parse().ok()?;
        Some(SocketAddr::from((ip, port)))
    }
}

/// One primary, one replica and three `redis-sentinel` processes monitoring them as
/// [`MASTER_NAME`] with a quorum of two. Everything is killed on drop.
pub struct RedisSentinelSet {
    // Declared first so the sentinels die before the servers and never start a failover
    // while the set is being dropped.
    sentinels: Vec<Sentinel>,
    nodes: Vec<RedisServer>,
    dir: TempDir,
}

impl RedisSentinelSet {
    /// Starts the primary, the replica and the sentinels, and returns once every sentinel
    /// knows the replica and the two other sentinels, so that a failover can happen at once.
    pub fn start() -> Result<Self> {
        let program = find_on_path("redis-sentinel")?;
        let primary = RedisServer::start()?;
        let replica = RedisServer::start_with(RedisOptions::default().replica_of(primary.addr()))?;
        wait_for(
            || {
                format!(
                    "the replica {} to sync with {}",
                    replica.addr(),
                    primary.addr()
                )
            },
            STARTUP_TIMEOUT,
            || {
                let link = replica.info_field("replication", "master_link_status");
                (link.as_deref() == Some("up")).then_some(())
            },
        )?;

        let dir = tempfile::Builder::new()
            .prefix("spillway-sentinel-")
            .tempdir()
            .map_err(|e| Error::io("creating a temporary folder for the sentinels", e))?;
        let sentinels = (0..SENTINELS)
            .map(|i| start_sentinel(&program, dir.path(), i, primary.addr()))
            .collect::<Result<Vec<_>>>()?;
        let set = RedisSentinelSet {
            sentinels,
            nodes: vec![primary, replica],
            dir,
        };
        set.wait_until_acquainted()?;
        Ok(set)
    }

    /// The name the sentinels know the primary by ([`MASTER_NAME`]).
    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// The sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(Sentinel::addr).collect()
    }

    /// The sentinels as `redis://127.0.0.1:PORT` URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The Redis servers: at start the primary first, then the replica.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The server listening on `addr`, to kill or restart it.
    pub fn node_mut(&mut self, addr: SocketAddr) -> Option<&mut RedisServer> {
        self.nodes.iter_mut().find(|node| node.addr() == addr)
    }

    /// The primary's address as the first sentinel that answers reports it.
    pub fn primary_addr(&self) -> Result<SocketAddr> {
        self.sentinels
            .iter()
            .find_map(Sentinel::primary)
            .ok_or_else(|| {
                Error::Sentinels(format!(
                    "none of {:?} reports a primary",
                    self.sentinel_addrs()
                ))
            })
    }

    /// Kills (SIGKILL) the server the sentinels report as primary and returns its address.
    pub fn kill_primary(&mut self) -> Result<SocketAddr> {
        let primary = self.primary_addr()?;
        match self.node_mut(primary) {
            Some(node) => {
                node.kill();
                Ok(primary)
            }
            None => Err(Error::Sentinels(format!(
                "report {primary} as primary, which is none of the set's servers"
            ))),
        }
    }

    /// Waits until every sentinel reports the same primary other than `old`, and that server
    /// says it is a primary. Returns the new primary's address.
    pub fn wait_for_failover(&self, old: SocketAddr, timeout: Duration) -> Result<SocketAddr> {
        wait_for(
            || {
                format!(
                    "the sentinels to fail over from {old}; {}",
                    self.failover_state()
                )
            },
            timeout,
            || {
                let reports: Vec<_> = self.sentinels.iter().map(Sentinel::primary).collect();
                let new = (*reports.first()?).filter(|&first| first != old)?;
                let agreed = reports.iter().all(|report| *report == Some(new));
                let role = info_field(new, "replication", "role");
                (agreed && role.as_deref() == Some("master")).then_some(new)
            },
        )
    }

    /// What each sentinel says of the primary, whether it is in TILT mode (a sentinel whose
    /// timer ran late, on a loaded machine, stops acting for 30 s), and the last failover events
    /// of its log: why a failover did not come.
    fn failover_state(&self) -> String {
        self.sentinels
            .iter()
            .enumerate()
            .map(|(i, sentinel)| {
                let tilt = info_field(sentinel.addr(), "sentinel", "sentinel_tilt");
                let log = fs::read_to_string(self.dir.path().join(format!("sentinel-{i}.log")))
                    .unwrap_or_default();
                let events: Vec<&str> = log
                    .lines()
                    .filter(|line| line.contains(" +") || line.contains(" -"))
                    .collect();
                let last = events[events.len().saturating_sub(FAILOVER_EVENTS)..].join(" | ");
                format!(
                    "{} reports the primary {:?}, tilt {}, last events: {last}",
                    sentinel.addr(),
                    sentinel.primary(),
                    tilt.as_deref().unwrap_or("unknown"),
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Every sentinel must have met the others (through the primary's hello channel) and the
    /// replica before it can vote a failover through.
    fn wait_until_acquainted(&self) -> Result<()> {
        wait_for(
            || {
                let state: Vec<String> = self
                    .sentinels
                    .iter()
                    .map(|s| {
                        let count = |what| s.ask(what).map_or(0, |r| r.items().len());
                        format!(
                            "{} knows {} sentinels and {} replicas",
                            s.addr(),
                            count("SENTINELS"),
                            count("REPLICAS")
                        )
                    })
                    .collect();
                format!("the sentinels to find each other ({})", state.join("; "))
            },
            STARTUP_TIMEOUT,
            || {
                let acquainted = self.sentinels.iter().all(|s| {
                    let count = |what| s.ask(what).map_or(0, |r| r.items().len());
                    count("SENTINELS") == SENTINELS - 1 && count("REPLICAS") == 1
                });
                acquainted.then_some(())
            },
        )
    }
}

fn start_sentinel(
    program: &Path,
    dir: &Path,
    index: usize,
    primary: SocketAddr,
) -> Result<Sentinel> {
    on_free_port(|port| {
        // Sentinel rewrites its configuration file as it learns, so each gets its own.
        let config = dir.join(format!("sentinel-{index}.conf"));
        let text = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
             sentinel monitor {MASTER_NAME} {ip} {primary_port} {QUORUM}\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n",
            dir = dir.display(),
            ip = primary.ip(),
            primary_port = primary.port(),
        );
        fs::write(&config, text)
            .map_err(|e| Error::io(format!("writing {}", config.display()), e))?;
        let mut command = Command::new(program);
        command.arg(&config).current_dir(dir);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let log = dir.join(format!("sentinel-{index}.log"));
        let process = Process::spawn(command, format!("redis-sentinel on port {port}"), &log)?
            .started(STARTUP_TIMEOUT, || pings(addr))?;
        Ok(Sentinel {
            port,
            _process: process,
        })
    })
}
