//! The rules store's latest changes for the controller's dashboard: the audit log read again
//! whenever the rules version moves.

use std::sync::Arc;

use spillway_control::controller::RulesChange;
use spillway_loop::RulesSnapshot;
use spillway_rules::Store;
use spillway_rules::store::AuditEntry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How many of the latest changes the dashboard shows.
pub const SHOWN: i64 = 20;

/// Reads the store's latest [`SHOWN`] changes now and again every time `rules` moves to a new
/// version, until the task is aborted or the rules stop being followed. A read that fails (the
/// store is down) keeps the changes read before.
pub fn follow_changes(
    store: Store,
    mut rules: watch::Receiver<Arc<RulesSnapshot>>,
) -> (watch::Receiver<Arc<Vec<RulesChange>>>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(Arc::new(Vec::new()));
    let task = tokio::spawn(async move {
        loop {
            match store.audit(SHOWN, None).await {
                Ok(entries) => {
                    tx.send_replace(Arc::new(entries.iter().map(change_of).collect()));
                }
                Err(err) => tracing::debug!("dashboard: cannot read the audit log: {err}"),
            }
            if rules.changed().await.is_err() {
                return;
            }
        }
    });
    (rx, task)
}

/// One audit entry as the dashboard shows it.
pub fn change_of(entry: &AuditEntry) -> RulesChange {
    RulesChange::summarised(
        u64::try_from(entry.version).unwrap_or(0),
        &entry.at,
        &entry.actor,
        entry.action.as_str(),
        entry.reason.as_deref(),
        entry.before.as_ref(),
        entry.after.as_ref(),
    )
}
