//! Following the store from the consumer's side: the one loop that turns each rule set a
//! [`RulesWatcher`] announces into what its consumer runs, so the controller command, `spillway
//! up`, the demo and the proxy cannot drift apart in how they follow.

use std::sync::Arc;

use spillway_core::config::ConfigFile;
use spillway_core::rules::{RulesError, RulesSnapshot};
use tokio::sync::watch;

use crate::watch::{RuleSet, RulesWatcher};

/// Each rule set of the store, as a snapshot with the store's version and `base`'s identity,
/// control and redis sections (the store keeps buckets only), for as long as `watcher` runs.
///
/// The first snapshot is rendered here: a store whose rules cannot be rendered with `base` is an
/// error at start. Later ones that cannot be rendered are logged and the snapshot in force stays,
/// because a running tier must not drop its rules over one bad change. Spawns a task: call it on
/// a tokio runtime.
pub fn follow(
    watcher: &RulesWatcher,
    base: ConfigFile,
) -> Result<watch::Receiver<Arc<RulesSnapshot>>, RulesError> {
    let render = move |set: &RuleSet| {
        // A store version is a count of commits, never negative.
        RulesSnapshot::from_model(u64::try_from(set.version).unwrap_or(0), &set.model(&base))
            .map(Arc::new)
    };
    let mut sets = watcher.subscribe();
    let first = sets.borrow_and_update().clone();
    let (tx, rx) = watch::channel(render(&first)?);
    tokio::spawn(each_newer(sets, move |set| match render(set) {
        Ok(rules) => {
            tx.send_replace(rules);
        }
        Err(err) => tracing::error!(
            store_version = set.version,
            "{err}; keeping the rules in force"
        ),
    }));
    Ok(rx)
}

/// Calls `apply` with the store's rule set now and with every newer one, until the watcher
/// stops: for a consumer that applies the rules itself rather than receiving snapshots (the
/// proxy merges them into its own file and reloads its client).
pub async fn apply_each(watcher: &RulesWatcher, mut apply: impl FnMut(&RuleSet)) {
    let mut sets = watcher.subscribe();
    let now = sets.borrow_and_update().clone();
    apply(&now);
    each_newer(sets, apply).await;
}

/// Calls `apply` with every rule set newer than the one `sets` last saw. The set is cloned out
/// of the channel first: holding the borrow while applying would block the watcher's sender.
async fn each_newer(mut sets: watch::Receiver<Arc<RuleSet>>, mut apply: impl FnMut(&RuleSet)) {
    while sets.changed().await.is_ok() {
        let set = sets.borrow_and_update().clone();
        apply(&set);
    }
}
