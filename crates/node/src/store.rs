//! The rules service's store as the controller's source of rules: seeded from a configuration
//! file, then followed, every version rendered with the file's identity and control sections (the
//! store keeps buckets only).

use std::sync::Arc;

use spillway_core::config::ConfigFile;
use spillway_loop::RulesSnapshot;
use spillway_rules::rule::{input_of, parse_config};
use spillway_rules::{Role, RulesWatcher, Store};
use tokio::sync::watch;

use crate::NodeError;

/// The service user that seeds the store from the file.
const SEEDER: &str = "spillway-up";

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
pub async fn seed_and_follow(url: &str, yaml: &str, name: &str) -> Result<StoreRules, NodeError> {
    spillway_core::config::load_str(yaml, name).map_err(|e| NodeError::Config(e.to_string()))?;
    let file: ConfigFile =
        yaml_serde::from_str(yaml).map_err(|e| NodeError::Config(format!("{name}: {e}")))?;
    let store = Store::connect(url).await?;
    // Every start after the first finds its users there: a start that stopped between making
    // them and seeding the rules, or any later one, makes none again.
    let fresh = store.version().await? == 0;
    let admin_token = if fresh && store.user_named("admin").await?.is_none() {
        Some(store.create_user("admin", Role::Admin).await?.1)
    } else {
        None
    };
    let seeder = match store.user_named(SEEDER).await? {
        Some(seeder) => seeder,
        None => store.create_user(SEEDER, Role::Service).await?.0,
    };
    let inputs = parse_config(yaml)
        .map_err(|e| NodeError::Config(format!("{name}: {e}")))?
        .into_iter()
        .map(|(service, bucket)| input_of(service, bucket))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| NodeError::Config(format!("{name}: {e}")))?;
    store
        .apply(
            &seeder,
            inputs,
            false,
            Some("seeded from the configuration file at start"),
        )
        .await?;
    let watcher = RulesWatcher::start(url).await?;
    let rules = spillway_rules::follow(&watcher, file)?;
    Ok(StoreRules {
        store,
        watcher,
        rules,
        admin_token,
    })
}
