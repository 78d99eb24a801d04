//! One server process with its output in a log file: spawning, polling for readiness with a
//! deadline, signalling, and the free-port and program lookups every instance kind shares.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::error::{Error, Result};

/// How long a server may take to answer its first readiness probe.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// How many fresh ports a start tries when another process grabs the picked one first.
const PORT_ATTEMPTS: usize = 5;

const POLL_INTERVAL: Duration = Duration::from_millis(50);
const LOG_TAIL_LINES: usize = 30;

/// Picks a port that was free a moment ago. Another process may take it before the server
/// binds it, so callers retry on a clash (see [`Process::port_clashed`]).
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::io("binding 127.0.0.1:0 to pick a free port", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading the picked port", e))?;
    Ok(addr.port())
}

/// Why one start attempt failed, and whether a fresh port may fix it.
pub(crate) struct StartFailure {
    pub(crate) error: Error,
    pub(crate) port_clash: bool,
}

impl From<Error> for StartFailure {
    fn from(error: Error) -> Self {
        StartFailure {
            error,
            port_clash: false,
        }
    }
}

/// Runs `start` on a free port, and again on another one while the failure is a port clash.
pub(crate) fn on_free_port<T>(
    mut start: impl FnMut(u16) -> std::result::Result<T, StartFailure>,
) -> Result<T> {
    let mut attempt = 1;
    loop {
        match start(free_port()?) {
            Ok(started) => return Ok(started),
            Err(failure) if failure.port_clash && attempt < PORT_ATTEMPTS => attempt += 1,
            Err(failure) => return Err(failure.error),
        }
    }
}

/// Polls `check` until it returns something, or fails with a timeout naming `what` (asked
/// only then, so it may describe the state that was not reached) after `timeout`.
pub(crate) fn wait_for<T>(
    what: impl FnOnce() -> String,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = check() {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what(),
                after: timeout,
            });
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Finds `program` on `PATH`.
pub(crate) fn find_on_path(program: &'static str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| Error::NotFound {
            program,
            searched: "PATH".into(),
        })
}

/// The last `LOG_TAIL_LINES` lines of `text`.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// The last lines of a log file, or a note saying why there are none.
pub(crate) fn log_tail(path: &Path) -> String {
    match fs::read_to_string(path) {
        Ok(text) if text.trim().is_empty() => "(the log is empty)".into(),
        Ok(text) => tail(&text),
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}

/// A running (or exited) server process whose stdout and stderr go to a log file.
pub(crate) struct Process {
    child: Child,
    what: String,
    log: PathBuf,
    /// Where this run's output starts in the log, which a restart appends to.
    log_start: u64,
    reaped: bool,
}

impl Process {
    /// Spawns `command` with its output appended to `log`. `what` names the server in errors.
    pub(crate) fn spawn(mut command: Command, what: String, log: &Path) -> Result<Self> {
        let open_log = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|e| Error::io(format!("opening the log {}", log.display()), e))
        };
        let stdout: File = open_log()?;
        let log_start = stdout
            .metadata()
            .map_err(|e| Error::io(format!("reading {}", log.display()), e))?
            .len();
        let stderr = stdout
            .try_clone()
            .map_err(|e| Error::io(format!("duplicating the log {}", log.display()), e))?;
        command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        let child = command
            .spawn()
            .map_err(|e| Error::io(format!("spawning {what} ({command:?})"), e))?;
        Ok(Process {
            child,
            what,
            log: log.to_path_buf(),
            log_start,
            reaped: false,
        })
    }

    /// Polls `ready` until it says yes, the process exits, or `timeout` passes.
    pub(crate) fn wait_ready(
        &mut self,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Err(self.start_error(format!("it exited with {status}")));
            }
            if ready() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.start_error(format!("not ready after {timeout:?}")));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits as [`Process::wait_ready`] does; on failure the process is killed and the
    /// failure says whether it lost its port to another process.
    pub(crate) fn started(
        mut self,
        timeout: Duration,
        ready: impl FnMut() -> bool,
    ) -> std::result::Result<Self, StartFailure> {
        match self.wait_ready(timeout, ready) {
            Ok(()) => Ok(self),
            Err(error) => {
                self.kill();
                Err(StartFailure {
                    error,
                    port_clash: self.port_clashed(),
                })
            }
        }
    }

    /// A start failure for this process, with the tail of its log.
    pub(crate) fn start_error(&self, reason: String) -> Error {
        Error::Start {
            what: self.what.clone(),
            reason,
            log_tail: log_tail(&self.log),
        }
    }

    /// Whether this run failed because its port was taken, so a fresh port may succeed.
    pub(crate) fn port_clashed(&self) -> bool {
        let mut text = String::new();
        let read = File::open(&self.log).and_then(|mut file| {
            file.seek(SeekFrom::Start(self.log_start))?;
            file.read_to_string(&mut text)
        });
        read.is_ok() && text.contains("Address already in use")
    }

    /// The exit status, if the process has exited.
    pub(crate) fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            self.reaped = true;
        }
        status
    }

    pub(crate) fn is_running(&mut self) -> bool {
        !self.reaped && self.exit_status().is_none()
    }

    /// Sends `signal` and waits up to `grace` for the exit, then kills the process outright.
    pub(crate) fn stop(&mut self, signal: Signal, grace: Duration) {
        if !self.is_running() {
            return;
        }
        // The signal can only fail if the process is already gone, which the wait below sees.
        let _ = kill_process(Pid::from_child(&self.child), signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exit_status().is_some() {
                return;
            }
            thread::sleep(POLL_INTERVAL);
        }
        self.kill();
    }

    /// SIGKILL, as in a crash, and reap the process.
    pub(crate) fn kill(&mut self) {
        if self.reaped {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_can_be_bound_again() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the picked port is free");
    }

    #[test]
    fn tail_keeps_only_the_last_lines() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let tail = tail(&text);
        assert_eq!(tail.lines().count(), LOG_TAIL_LINES);
        assert!(tail.starts_with("line 70"));
        assert!(tail.ends_with("line 99"));
    }

    #[test]
    fn a_missing_program_is_named_in_the_error() {
        let err = find_on_path("spillway-no-such-program").unwrap_err();
        assert!(
            err.to_string().contains("spillway-no-such-program"),
            "{err}"
        );
    }

    #[test]
    fn a_process_that_exits_early_fails_with_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sh.log");
        let mut command = Command::new("sh");
        command.args(["-c", "echo 'bad things happened'; exit 3"]);
        let mut process = Process::spawn(command, "a shell".into(), &log).unwrap();
        let started = Instant::now();
        let err = process
            .wait_ready(STARTUP_TIMEOUT, || false)
            .unwrap_err()
            .to_string();
        assert!(
            started.elapsed() < STARTUP_TIMEOUT,
            "an exit is noticed at once"
        );
        assert!(err.contains("a shell did not start"), "{err}");
        assert!(err.contains("exit status: 3"), "{err}");
        assert!(err.contains("bad things happened"), "{err}");
    }

    #[test]
    fn a_process_that_never_gets_ready_times_out_and_is_killed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new("sleep");
        command.arg("60");
        let mut process =
            Process::spawn(command, "sleep".into(), &dir.path().join("sleep.log")).unwrap();
        let err = process
            .wait_ready(Duration::from_millis(200), || false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not ready after 200ms"), "{err}");
        let pid = Pid::from_child(&process.child);
        drop(process);
        // Signal 0 only checks for existence: the reaped child no longer exists.
        assert!(rustix::process::test_kill_process(pid).is_err());
    }
}
