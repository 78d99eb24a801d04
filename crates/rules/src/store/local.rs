//! Writers and watchers of one SQLite file in this process meet here: a write bumps the file's
//! version at once, so a watcher in the same process need not wait for its next poll.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use tokio::sync::watch;

type Registry = Mutex<HashMap<String, watch::Sender<i64>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The name under which watchers of one SQLite file meet the stores that write it.
pub(crate) fn local_key(url: &str) -> String {
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let path = path.split('?').next().unwrap_or(path);
    std::fs::canonicalize(path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.to_owned())
}

pub(crate) fn local_channel(key: &str) -> watch::Receiver<i64> {
    let mut map = registry().lock().unwrap_or_else(|e| e.into_inner());
    map.entry(key.to_owned())
        .or_insert_with(|| watch::channel(0).0)
        .subscribe()
}

pub(crate) fn notify_local(key: &str, version: i64) {
    let map = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(sender) = map.get(key) {
        sender.send_replace(version);
    }
}
