//! Standalone reload: poll the YAML file, swap the rules when it changes and validates, and keep
//! the rules in force (logging `FILE:LINE:COLUMN`) when it does not.
//!
//! Polling the file's bytes every half second costs one small read and needs no platform
//! notification API; an edit is live within about half a second, well inside a few seconds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;

/// How often the file is read.
pub const DEFAULT_POLL: Duration = Duration::from_millis(500);

/// Spawns a task on the current tokio runtime that reloads `client` from `path` whenever the
/// file's contents change. It also runs the client's housekeeping ([`Client::tick`]) every
/// second. Abort the handle to stop it.
///
/// The file is read once before this returns, as the version the client runs: call it right
/// after loading the client from the same file.
pub fn watch_file(
    client: Arc<Client>,
    path: PathBuf,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let mut last = std::fs::read(&path).ok();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ticks_per_second = (Duration::from_secs(1).as_nanos() / every.as_nanos().max(1)).max(1);
        let mut n: u128 = 0;
        loop {
            interval.tick().await;
            n += 1;
            if n.is_multiple_of(ticks_per_second) {
                client.tick();
            }
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(err) => {
                    if last.is_some() {
                        tracing::error!(path = %path.display(), "cannot read the configuration ({err}); keeping the rules in force");
                        last = None;
                    }
                    continue;
                }
            };
            if last.as_deref() == Some(&bytes[..]) {
                continue;
            }
            let name = path.display().to_string();
            match spillway_core::config::load_bytes(&bytes, &name)
                .map_err(crate::ClientError::from)
                .and_then(|config| client.reload(config))
            {
                Ok(version) => tracing::info!(path = %name, version, "configuration reloaded"),
                Err(err) => {
                    tracing::error!("{err}; the file was not applied and the rules in force stay")
                }
            }
            last = Some(bytes);
        }
    })
}
