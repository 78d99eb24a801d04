//! A private PostgreSQL server: `initdb` in a temporary folder and `postgres` on a free
//! loopback port, with trust authentication, which a test may stop and restart.

use std::fs;
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use rustix::process::Signal;
use tempfile::TempDir;

use crate::error::{Error, Result};
use crate::process::{Process, STARTUP_TIMEOUT, StartFailure, find_on_path, on_free_port};

/// The superuser `initdb` creates, which every URL of the harness connects as.
const SUPERUSER: &str = "postgres";
/// Where Debian installs the server binaries, one folder per major version.
const DEBIAN_LIB: &str = "/usr/lib/postgresql";
/// How long an immediate shutdown may take before the postmaster is killed outright.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How a [`Postgres`] is started.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    database: String,
    settings: Vec<(String, String)>,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            database: "spillway".into(),
            settings: Vec::new(),
        }
    }
}

impl PostgresOptions {
    /// The database created at start and named in [`Postgres::url`] (default `spillway`).
    pub fn database(mut self, name: impl Into<String>) -> Self {
        self.database = name.into();
        self
    }

    /// A server setting, passed as `-c NAME=VALUE`.
    pub fn setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }
}

/// The account the server runs as when the harness runs as root, which PostgreSQL refuses.
#[derive(Debug, Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
}

/// A PostgreSQL server on `127.0.0.1` and a free port, with its data and Unix socket in its own
/// temporary folder. It is shut down and the folder removed on drop.
pub struct Postgres {
    port: u16,
    options: PostgresOptions,
    bin: PathBuf,
    owner: Option<Owner>,
    process: Process,
    // Dropped last, after the server that writes into it.
    dir: TempDir,
}

impl Postgres {
    /// Starts a server with default options and a database named `spillway`.
    pub fn start() -> Result<Self> {
        Self::start_with(PostgresOptions::default())
    }

    /// Runs `initdb`, starts the server (on a fresh port if the first one picked is taken
    /// meanwhile) and creates the options' database.
    pub fn start_with(options: PostgresOptions) -> Result<Self> {
        let bin = find_bin_dir()?;
        let owner = if rustix::process::geteuid().is_root() {
            Some(postgres_account()?)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("spillway-pg-")
            .tempdir()
            .map_err(|e| Error::io("creating a temporary folder for PostgreSQL", e))?;
        let socket_dir = dir.path().join("sock");
        fs::create_dir(&socket_dir)
            .map_err(|e| Error::io(format!("creating {}", socket_dir.display()), e))?;
        if let Some(owner) = owner {
            for path in [dir.path(), &socket_dir] {
                chown(path, Some(owner.uid), Some(owner.gid)).map_err(|e| {
                    Error::io(format!("giving {} to the postgres user", path.display()), e)
                })?;
            }
        }

        let mut initdb = tool(&bin, "initdb", dir.path(), owner);
        initdb
            .arg("--pgdata")
            .arg(dir.path().join("data"))
            .args(["--username", SUPERUSER, "--auth", "trust"])
            .args(["--encoding", "UTF8", "--locale", "C", "--no-sync"]);
        run(initdb)?;

        let (port, process) = on_free_port(|port| {
            spawn_ready(&bin, dir.path(), owner, port, &options).map(|process| (port, process))
        })?;
        let server = Postgres {
            port,
            options,
            bin,
            owner,
            process,
            dir,
        };
        if server.options.database != SUPERUSER {
            server.create_database(&server.options.database)?;
        }
        Ok(server)
    }

    /// The port the server listens on, which stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The database named in [`Postgres::url`].
    pub fn database(&self) -> &str {
        &self.options.database
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE`; no password is needed.
    pub fn url(&self) -> String {
        self.url_for(&self.options.database)
    }

    /// The URL of another database on this server.
    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a database and returns its URL.
    pub fn create_database(&self, name: &str) -> Result<String> {
        let mut createdb = tool(&self.bin, "createdb", self.dir.path(), self.owner);
        createdb.args(client_args(self.port)).arg(name);
        run(createdb)?;
        Ok(self.url_for(name))
    }

    /// The folder that holds the server's Unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// The server's temporary folder: `data/`, `sock/` and its log, `postgres.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the postmaster is still alive.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Stops the server at once (an immediate shutdown: connections are cut and committed data
    /// is recovered from the write-ahead log at the next start).
    pub fn stop(&mut self) {
        self.process.stop(Signal::QUIT, STOP_GRACE);
    }

    /// Starts the server again on the same port with the same data, stopping it first if it
    /// is running. Fails if another process took the port meanwhile.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.process = spawn_ready(
            &self.bin,
            self.dir.path(),
            self.owner,
            self.port,
            &self.options,
        )
        .map_err(|failure| failure.error)?;
        Ok(())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGKILL would leave the backends running on, holding the shared memory; an
        // immediate shutdown takes them down with the postmaster.
        self.stop();
    }
}

fn client_args(port: u16) -> Vec<String> {
    [
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--username",
        SUPERUSER,
    ]
    .map(String::from)
    .to_vec()
}

/// The folder of `initdb` and `postgres`: next to `initdb` on `PATH` when there is one there,
/// else the newest version under `/usr/lib/postgresql` (Debian keeps them off `PATH`).
fn find_bin_dir() -> Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Ok(initdb) = find_on_path("initdb") {
        // Follow the link to the real folder: PATH may hold only links, or Debian's wrapper.
        let dir = fs::canonicalize(&initdb)
            .ok()
            .and_then(|real| real.parent().map(Path::to_path_buf));
        if let Some(dir) = dir.filter(|dir| has_server(dir)) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir(DEBIAN_LIB)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_server(bin))
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| Error::NotFound {
            program: "initdb",
            searched: format!("PATH and {DEBIAN_LIB}/*/bin"),
        })
}

/// The `postgres` account's user and group ids, from `id`.
fn postgres_account() -> Result<Owner> {
    let id = |flag: &str| -> Result<u32> {
        let mut command = Command::new("id");
        command.args([flag, SUPERUSER]);
        let output = run(command)?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim().parse().map_err(|_| Error::Command {
            command: format!("id {flag} {SUPERUSER}"),
            status: output.status,
            output: format!("not a number: {text:?}"),
        })
    };
    Ok(Owner {
        uid: id("-u")?,
        gid: id("-g")?,
    })
}

/// A PostgreSQL program, run as the owner when there is one, in `dir` (the caller's current
/// folder may be closed to the `postgres` user) and in the C locale (whatever the caller's is).
fn tool(bin: &Path, program: &str, dir: &Path, owner: Option<Owner>) -> Command {
    let mut command = Command::new(bin.join(program));
    command.current_dir(dir).env("LC_ALL", "C");
    if let Some(owner) = owner {
        command.uid(owner.uid).gid(owner.gid);
    }
    command
}

/// Runs a helper command to completion and fails with its output if it fails.
fn run(mut command: Command) -> Result<Output> {
    let shown = format!("{command:?}");
    let output = command
        .output()
        .map_err(|e| Error::io(format!("running {shown}"), e))?;
    if output.status.success() {
        return Ok(output);
    }
    Err(Error::Command {
        command: shown,
        status: output.status,
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

/// Starts `postgres` on `port` and waits until `pg_isready` says it accepts connections.
fn spawn_ready(
    bin: &Path,
    dir: &Path,
    owner: Option<Owner>,
    port: u16,
    options: &PostgresOptions,
) -> std::result::Result<Process, StartFailure> {
    let mut postgres = tool(bin, "postgres", dir, owner);
    postgres
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string()])
        .arg("-k")
        .arg(dir.join("sock"))
        .args(["-c", "listen_addresses=127.0.0.1"])
        // Tests never survive a machine crash, so skip the syncs that only protect against one.
        .args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
    for (name, value) in &options.settings {
        postgres.arg("-c").arg(format!("{name}={value}"));
    }
    let what = format!("postgres on port {port}");
    let process = Process::spawn(postgres, what, &dir.join("postgres.log"))?;
    process.started(STARTUP_TIMEOUT, || {
        let mut ready = tool(bin, "pg_isready", dir, owner);
        ready
            .args(client_args(port))
            .args(["--dbname", SUPERUSER, "--timeout", "1", "--quiet"]);
        ready.output().is_ok_and(|output| output.status.success())
    })
}
