//! The rules service's store as the controller's source of rules: seeded from a configuration
//! file, then followed, every version rendered with the file's identity and control sections (the
//! store keeps buckets only).

use std::sync::Arc;

use spillway_loop::RulesSnapshot;
use spillway_core::config::ConfigFile;
use spillway_rules::rule::{input_of, parse_config};
use spillway_rules::{Role, RuleSet, RulesWatcher, Store};
use tokio::sync::watch;

use crate::DemoError;

/// A store seeded from a file and followed.
pub struct StoreRules {
    pub store: Store,
    /// Held for as long as the rules are followed.
    pub watcher: RulesWatcher,
    pub rules: watch::Receiver<Arc<RulesSnapshot>>,
    /// An admin token, printed once, when this start created the store.
    pub admin_token: Option<String>,
}

/// Connects to `url`, makes the permanent rules those of `yaml` (one modification, none when
/// nothing differs) and follows the store from then on.
pub async fn seed_and_follow(url: &str, yaml: &str, name: &str) -> Result<StoreRules, DemoError> {
    spillway_core::config::load_str(yaml, name).map_err(|e| DemoError::Config(e.to_string()))?;
    let file: ConfigFile =
        yaml_serde::from_str(yaml).map_err(|e| DemoError::Config(format!("{name}: {e}")))?;
    let store = Store::connect(url).await.map_err(DemoError::store)?;
    let fresh = store.version().await.map_err(DemoError::store)? == 0;
    let admin_token = if fresh {
        Some(
            store
                .create_user("admin", Role::Admin)
                .await
                .map_err(DemoError::store)?
                .1,
        )
    } else {
        None
    };
    let (seeder, _) = store
        .create_user("spillway-up", Role::Service)
        .await
        .map_err(DemoError::store)?;
    let inputs = parse_config(yaml)
        .map_err(|e| DemoError::Config(format!("{name}: {e}")))?
        .into_iter()
        .map(|(service, bucket)| input_of(service, bucket))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| DemoError::Config(format!("{name}: {e}")))?;
    store
        .apply(
            &seeder,
            inputs,
            false,
            Some("seeded from the configuration file at start"),
        )
        .await
        .map_err(|e| DemoError::Store(e.to_string()))?;
    let watcher = RulesWatcher::start(url).await.map_err(DemoError::store)?;
    let rules = follow(&watcher, file)?;
    Ok(StoreRules {
        store,
        watcher,
        rules,
        admin_token,
    })
}

/// Each rule set of the store as a snapshot carrying `file`'s identity and control sections.
fn follow(
    watcher: &RulesWatcher,
    file: ConfigFile,
) -> Result<watch::Receiver<Arc<RulesSnapshot>>, DemoError> {
    let render = move |set: &RuleSet| {
        RulesSnapshot::from_model(u64::try_from(set.version).unwrap_or(0), &set.model(&file))
            .map(Arc::new)
    };
    let mut sets = watcher.subscribe();
    let first = render(&sets.borrow_and_update()).map_err(|e| DemoError::Config(e.to_string()))?;
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        while sets.changed().await.is_ok() {
            let set = sets.borrow_and_update().clone();
            match render(&set) {
                Ok(rules) => {
                    tx.send_replace(rules);
                }
                Err(err) => tracing::error!("{err}; keeping the rules in force"),
            }
        }
    });
    Ok(rx)
}
