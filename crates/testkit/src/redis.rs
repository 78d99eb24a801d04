//! A private `redis-server` without persistence, which a test may crash and restart on the
//! same port.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::process::{
    Process, STARTUP_TIMEOUT, StartFailure, find_on_path, free_port, on_free_port,
};
use crate::resp::{self, Reply};

/// How a [`RedisServer`] is started.
#[derive(Debug, Clone, Default)]
pub struct RedisOptions {
    replica_of: Option<SocketAddr>,
    cluster: bool,
    args: Vec<String>,
}

impl RedisOptions {
    /// Starts the server as a replica of `primary` (`--replicaof`).
    pub fn replica_of(mut self, primary: SocketAddr) -> Self {
        self.replica_of = Some(primary);
        self
    }

    /// Starts the server in cluster mode (`--cluster-enabled yes`), with its cluster bus on a
    /// second free port rather than the default port + 10000, which may be taken or above 65535.
    /// It starts with no slots: [`crate::RedisCluster`] assigns them and introduces the nodes.
    pub fn cluster(mut self) -> Self {
        self.cluster = true;
        self
    }

    /// Appends a command-line argument, for example `"--maxmemory"` then `"10mb"`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }
}

/// A `redis-server` on `127.0.0.1` and a free port, in its own temporary folder. It is killed
/// and the folder removed on drop.
pub struct RedisServer {
    port: u16,
    bus_port: Option<u16>,
    options: RedisOptions,
    program: PathBuf,
    process: Process,
    // Dropped last, after the process that writes into it.
    dir: TempDir,
}

impl RedisServer {
    /// Starts a primary with default options.
    pub fn start() -> Result<Self> {
        Self::start_with(RedisOptions::default())
    }

    /// Starts a server, on a fresh port if the first one picked is taken meanwhile.
    pub fn start_with(options: RedisOptions) -> Result<Self> {
        let program = find_on_path("redis-server")?;
        let dir = tempfile::Builder::new()
            .prefix("spillway-redis-")
            .tempdir()
            .map_err(|e| Error::io("creating a temporary folder for redis-server", e))?;
        let (port, bus_port, process) = on_free_port(|port| {
            let bus_port = if options.cluster {
                Some(other_free_port(port)?)
            } else {
                None
            };
            spawn_ready(&program, dir.path(), port, bus_port, &options)
                .map(|process| (port, bus_port, process))
        })?;
        Ok(RedisServer {
            port,
            bus_port,
            options,
            program,
            process,
            dir,
        })
    }

    /// The port the server listens on, which stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster bus port, for a server started in cluster mode.
    pub fn cluster_bus_port(&self) -> Option<u16> {
        self.bus_port
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT`, for a client.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's temporary folder, which holds its log (`redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the process is still alive.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Kills the server with SIGKILL, as a crash would. Its data is lost (no persistence).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the server again on the same port with the same options, killing it first if it
    /// is still running. Fails if another process took the port meanwhile.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        self.process = spawn_ready(
            &self.program,
            self.dir.path(),
            self.port,
            self.bus_port,
            &self.options,
        )
        .map_err(|failure| failure.error)?;
        Ok(())
    }

    /// One line of the `INFO` section `section`, for example `info("replication", "role")`.
    pub(crate) fn info_field(&self, section: &str, field: &str) -> Option<String> {
        info_field(self.addr(), section, field)
    }
}

/// Reads `field` from `INFO section` of the server at `addr`.
pub(crate) fn info_field(addr: SocketAddr, section: &str, field: &str) -> Option<String> {
    let info = resp::command(addr, &["INFO", section]).ok()?.text()?;
    let prefix = format!("{field}:");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map(|value| value.trim().to_owned())
}

/// Whether the server at `addr` answers `PING`.
pub(crate) fn pings(addr: SocketAddr) -> bool {
    matches!(resp::command(addr, &["PING"]), Ok(Reply::Status(pong)) if pong == "PONG")
}

/// A free port other than `taken`, which was free a moment ago too.
fn other_free_port(taken: u16) -> Result<u16> {
    loop {
        let port = free_port()?;
        if port != taken {
            return Ok(port);
        }
    }
}

/// Spawns `redis-server` on `port` (and its cluster bus on `bus_port`, in cluster mode) and
/// waits until it answers `PING`.
fn spawn_ready(
    program: &Path,
    dir: &Path,
    port: u16,
    bus_port: Option<u16>,
    options: &RedisOptions,
) -> std::result::Result<Process, StartFailure> {
    let mut command = Command::new(program);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no", "--logfile", ""])
        .args(["--protected-mode", "no"])
        // A replica's first sync would otherwise wait 5 s for more replicas to share it.
        .args(["--repl-diskless-sync-delay", "0"])
        .arg("--dir")
        .arg(dir);
    if let Some(primary) = options.replica_of {
        command.args([
            "--replicaof",
            &primary.ip().to_string(),
            &primary.port().to_string(),
        ]);
    }
    if let Some(bus_port) = bus_port {
        // The node writes its identity and view of the cluster to nodes.conf in its own folder,
        // so a restarted node rejoins as itself. A short node timeout lets a test see a killed
        // node marked failed within seconds (Redis's default is 15 s).
        command
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-port", &bus_port.to_string()])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "2000"]);
    }
    command.args(&options.args).current_dir(dir);
    let what = match (options.replica_of, bus_port) {
        (Some(primary), _) => format!("redis-server on port {port} (replica of {primary})"),
        (None, Some(bus)) => format!("redis-server on port {port} (cluster bus on {bus})"),
        (None, None) => format!("redis-server on port {port}"),
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    Process::spawn(command, what, &dir.join("redis.log"))?.started(STARTUP_TIMEOUT, || pings(addr))
}
