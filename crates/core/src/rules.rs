//! The rules every tier passes down, as data.
//!
//! A controller's source (its YAML file, or the rules service's store) gives a validated
//! configuration; what goes down the link is only what the hosts run from it, the `control`
//! section and the `services` with their buckets ([`LinkRules`]), serialized from the parsed
//! model: never the file's text, its comments or its `redis` section. A host runs them with its
//! own process's `identity` and `redis` ([`LinkRules::with_own`]), so a Redis password stays in
//! the process that uses it.
//!
//! Wire evolution: the link's rules message carries the data in `json`; its older field `yaml`
//! carries the same rules rendered as a file (with the controller's `identity`, which older hosts
//! ran, and without `redis`), for hosts that predate `json`. A host reads `json` when it is set,
//! and the `control` and `services` of `yaml` when it is not (a controller older than the field).
//! The message itself is the link's (spillway-loop's `rules` module); this is the data, so that
//! whoever only produces rules (the rules service) needs nothing of the link.

use std::sync::Arc;

use crate::config::{self, Config, ConfigError, ConfigFile, Control, RedisFile, Services};
use serde::{Deserialize, Serialize};

/// Why rules could not become a snapshot, or rules a host received could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("cannot render the rules: {0}")]
    Render(String),
    /// The rules of a received message do not read as rules at all.
    #[error("the control plane's rules version {version} do not read ({field}): {message}")]
    Received {
        version: u64,
        /// Which field of the message: `json` or `yaml`.
        field: &'static str,
        message: String,
    },
}

/// The rules as the link carries them: the control loop's timing, which the whole
/// fleet shares with its controller, and the services with their buckets. Nothing of a process's
/// own settings: a host reads its request attributes with its own `identity` and counts exact
/// buckets in its own `redis`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkRules {
    pub control: Control,
    pub services: Services,
}

impl LinkRules {
    /// What of `file` the link carries.
    pub fn of(file: &ConfigFile) -> Self {
        Self {
            control: file.control.clone(),
            services: file.services.clone(),
        }
    }

    /// The `json` field of [`v1::Rules`]: the model serialized, every default written out.
    pub fn to_json(&self) -> Result<String, RulesError> {
        serde_json::to_string(self).map_err(|e| RulesError::Render(e.to_string()))
    }

    /// Reads [`LinkRules::to_json`]'s output back; the error says where and what.
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The rules of a message of either shape (its `version`, `json` and `yaml` fields): its
    /// `json`, or, from a controller older than that field, the `control` and `services` of its
    /// `yaml` (whatever else that file holds, its `identity` and `redis` included, is not taken).
    pub fn decode_fields(version: u64, json: &str, yaml: &str) -> Result<Self, RulesError> {
        if !json.is_empty() {
            return Self::from_json(json).map_err(|e| RulesError::Received {
                version,
                field: "json",
                message: e,
            });
        }
        let file: ConfigFile = yaml_serde::from_str(yaml).map_err(|e| RulesError::Received {
            version,
            field: "yaml",
            message: e.to_string(),
        })?;
        Ok(Self::of(&file))
    }

    /// The configuration a host runs from these rules: its own `identity` and `redis` (of
    /// `own`, its configuration in force), the received `control` and `services`, validated as
    /// a whole (`name` is what errors call it). A `store: redis` bucket needs a `redis` section
    /// of the host's own.
    pub fn with_own(&self, own: &Config, name: &str) -> Result<Config, RulesError> {
        let file = ConfigFile {
            version: own.version,
            identity: own.identity.clone(),
            control: self.control.clone(),
            services: self.services.clone(),
            redis: own.redis.as_ref().map(RedisFile::from),
        };
        let yaml = yaml_serde::to_string(&file).map_err(|e| RulesError::Render(e.to_string()))?;
        // Rendered here with every default spelled out: bounded by its buckets, not its bytes
        // (the message it came in is bounded by the link's largest message).
        let mut config = config::load_rendered(&yaml, name)?;
        // The in-flight limit on the upstream is the host's own, like its identity.
        config.concurrency = own.concurrency;
        config.proxy = own.proxy.clone();
        Ok(config)
    }
}

/// One version of the rules a controller sends down: the validated configuration, and the two
/// forms of it the link carries, rendered once.
#[derive(Debug, Clone)]
pub struct RulesSnapshot {
    /// Grows with every change of one source.
    pub version: u64,
    /// For hosts older than `json`: the rules rendered as a configuration file (`version`,
    /// `identity`, `control`, `services`), never the source's text: no comment, no `redis`.
    pub yaml: Arc<str>,
    /// The rules as data ([`LinkRules`] as JSON): what hosts run.
    pub json: Arc<str>,
    pub config: Arc<Config>,
}

impl RulesSnapshot {
    /// Validates `yaml` (`name` is what errors call it) as version `version`. What goes down
    /// is rendered from the parsed model, so the text's comments and its `redis` section stay
    /// here.
    pub fn parse(version: u64, yaml: &str, name: &str) -> Result<Self, RulesError> {
        let config = config::load_str(yaml, name)?;
        // `load_str` read the same text into this model before it validated it. A
        // `concurrency` section is the proxy's own and does not go down.
        let file: config::DocumentFile =
            yaml_serde::from_str(yaml).map_err(|e| RulesError::Render(e.to_string()))?;
        let (file, _, _) = file.split();
        Self::rendered(version, &file, config)
    }

    /// The rules of a store (the rules service's), given as the file model, as version
    /// `version`.
    pub fn from_model(version: u64, file: &ConfigFile) -> Result<Self, RulesError> {
        let yaml = yaml_serde::to_string(file).map_err(|e| RulesError::Render(e.to_string()))?;
        // Rendered here: bounded by its buckets, not its bytes.
        let config = config::load_rendered(&yaml, "the rules store")?;
        Self::rendered(version, file, config)
    }

    fn rendered(version: u64, file: &ConfigFile, config: Config) -> Result<Self, RulesError> {
        let legacy = ConfigFile {
            version: file.version,
            identity: file.identity.clone(),
            control: file.control.clone(),
            services: file.services.clone(),
            redis: None,
        };
        let yaml = yaml_serde::to_string(&legacy).map_err(|e| RulesError::Render(e.to_string()))?;
        Ok(Self {
            version,
            yaml: yaml.into(),
            json: LinkRules::of(file).to_json()?.into(),
            config: Arc::new(config),
        })
    }

    /// Whether `other` sends the same rules down (an edit of a comment, of the `redis`
    /// section or of nothing at all does not).
    pub fn sends_the_same(&self, other: &RulesSnapshot) -> bool {
        self.json == other.json && self.yaml == other.yaml
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str =
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 10/s }\n";

    #[test]
    fn a_model_renders_to_the_yaml_it_came_from() {
        let file: ConfigFile = yaml_serde::from_str(ONE).unwrap();
        let rules = RulesSnapshot::from_model(7, &file).unwrap();
        assert_eq!(rules.version, 7);
        assert_eq!(*rules.config, config::load_str(ONE, "one.yaml").unwrap());
    }

    #[test]
    fn an_invalid_text_names_where() {
        let err = RulesSnapshot::parse(1, "version: 1\nservices: 7\n", "r.yaml").unwrap_err();
        assert!(err.to_string().contains("r.yaml:2:11"), "{err}");
    }
}
