//! The README's "TLS in a few commands" block, run as a reader runs it: `bash` from the
//! repository's root with `spillway` on `PATH`. The block's `mktemp -d` lands in a temporary
//! folder of the test's own (through `TMPDIR`), and the shell runs in a process group of its own,
//! so the controller, aggregator and proxy it leaves in the background are ended with the group
//! whatever happens.

use std::fs::{self, File};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HEADING: &str = "## TLS in a few commands";

/// The block waits 20 s at most for the link and a second more; the certificates take a moment.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(90);

/// The first ```sh block after `HEADING`.
fn block(readme: &str) -> String {
    let section = readme
        .split_once(HEADING)
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("README.md has no \"{HEADING}\" section"));
    let body = section
        .split_once("```sh\n")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no ```sh block under \"{HEADING}\""));
    let (script, _) = body
        .split_once("```")
        .expect("the ```sh block under the TLS heading is closed");
    assert!(!script.trim().is_empty(), "the TLS block is empty");
    script.to_owned()
}

/// The processes of group `pgid` still running, from `/proc` (a zombie has ended; it only waits
/// for its parent).
fn running(pgid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid pgrp ...`: comm may hold spaces and parentheses.
            let (_, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let pgrp = fields.nth(1)?.parse::<u32>().ok()?;
            (pgrp == pgid && state != "Z").then_some(pid)
        })
        .collect()
}

/// The block's shell and everything it started: one process group, stopped when dropped.
struct Group {
    shell: Child,
    pgid: u32,
}

impl Group {
    fn signal(&self, signal: &str) {
        let _ = Command::new("bash")
            .args([
                "-c",
                &format!("kill -{signal} -- -{} 2>/dev/null", self.pgid),
            ])
            .status();
    }

    /// Waits up to `within` for the group to end; whether it did.
    fn ended_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let _ = self.shell.try_wait();
            if running(self.pgid).is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, on which every role stops cleanly, then SIGKILL for whatever is left after 10 s;
    /// returns the processes still running after that (none, normally).
    fn stop(&mut self) -> Vec<u32> {
        self.signal("TERM");
        if !self.ended_within(Duration::from_secs(10)) {
            self.signal("KILL");
            self.ended_within(Duration::from_secs(5));
        }
        running(self.pgid)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every `*.log` the block wrote (in the folder its `mktemp -d` made), for a failure's message.
fn logs(temp: &Path) -> String {
    let mut out = String::new();
    for dir in fs::read_dir(temp).into_iter().flatten().flatten() {
        for file in fs::read_dir(dir.path()).into_iter().flatten().flatten() {
            let path = file.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = fs::read_to_string(&path).unwrap_or_default();
                out.push_str(&format!("--- {}\n{text}\n", path.display()));
            }
        }
    }
    out
}

#[test]
fn the_readme_tls_block_links_a_proxy_over_mutual_tls() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let script = block(&fs::read_to_string(root.join("README.md")).unwrap());
    assert!(
        Command::new("curl")
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        "the README's TLS block uses curl, which is not installed"
    );

    let temp = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_spillway")).parent().unwrap();
    let path = match std::env::var_os("PATH") {
        Some(path) => {
            let mut dirs = vec![bin.to_owned()];
            dirs.extend(std::env::split_paths(&path));
            std::env::join_paths(dirs).unwrap()
        }
        None => bin.as_os_str().to_owned(),
    };
    let script_file = temp.path().join("block.sh");
    fs::write(&script_file, &script).unwrap();
    let stdout_file = temp.path().join("stdout");
    let stderr_file = temp.path().join("stderr");
    // Files rather than pipes: the processes left in the background inherit them, and a pipe
    // would stay open until they end.
    let shell = Command::new("bash")
        .arg(&script_file)
        .current_dir(&root)
        .env("PATH", path)
        .env("TMPDIR", temp.path())
        .stdin(Stdio::null())
        .stdout(File::create(&stdout_file).unwrap())
        .stderr(File::create(&stderr_file).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut group = Group {
        pgid: shell.id(),
        shell,
    };

    let deadline = Instant::now() + BLOCK_TIMEOUT;
    let finished = loop {
        match group.shell.try_wait() {
            Ok(Some(_)) => break true,
            _ if Instant::now() >= deadline => break false,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let stdout = fs::read_to_string(&stdout_file).unwrap_or_default();
    let linked = stdout
        .lines()
        .any(|line| line.trim() == "spillway_control_plane_connected 1");
    let logs = logs(temp.path());
    let left = group.stop();

    let stderr = fs::read_to_string(&stderr_file).unwrap_or_default();
    assert!(
        finished,
        "the block did not finish within {BLOCK_TIMEOUT:?}\nstdout:\n{stdout}\nstderr:\n{stderr}\n{logs}"
    );
    assert!(
        linked,
        "the proxy's /metrics never showed spillway_control_plane_connected 1\nstdout:\n{stdout}\nstderr:\n{stderr}\n{logs}"
    );
    assert!(
        left.is_empty(),
        "processes of the block still running after SIGKILL: {left:?}"
    );
}
