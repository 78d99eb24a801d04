//! The rules every tier passes down, as data.
//!
//! A controller's source (its YAML file, or the rules service's store) gives a validated
//! configuration; what goes down the link is only what the hosts run from it, the `control`
//! section and the `services` with their buckets ([`LinkRules`]), serialized from the parsed
//! model: never the file's text, its comments or its `redis` section. A host runs them with its
//! own process's `identity` and `redis` ([`LinkRules::with_own`]), so a Redis password stays in
//! the process that uses it.
//!
//! Wire evolution: [`v1::Rules`] carries the data in `json`; its older field `yaml` carries the
//! same rules rendered as a file (with the controller's `identity`, which older hosts ran, and
//! without `redis`), for hosts that predate `json`. A host reads `json` when it is set, and the
//! `control` and `services` of `yaml` when it is not (a controller older than the field).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spillway_core::config::{self, Config, ConfigError, ConfigFile, Control, RedisFile, Services};
use spillway_proto::v1;

/// Why rules could not become a snapshot, or rules a host received could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("cannot render the rules: {0}")]
    Render(String),
    /// The rules of a [`v1::Rules`] do not read as rules at all.
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

    /// The rules of a message of either shape: its `json`, or, from a controller older than
    /// that field, the `control` and `services` of its `yaml` (whatever else that file holds,
    /// its `identity` and `redis` included, is not taken).
    pub fn decode(message: &v1::Rules) -> Result<Self, RulesError> {
        if !message.json.is_empty() {
            return Self::from_json(&message.json).map_err(|e| RulesError::Received {
                version: message.version,
                field: "json",
                message: e,
            });
        }
        let file: ConfigFile =
            yaml_serde::from_str(&message.yaml).map_err(|e| RulesError::Received {
                version: message.version,
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

    /// The message that carries these rules.
    pub fn message(&self) -> v1::Rules {
        v1::Rules {
            version: self.version,
            yaml: self.yaml.to_string(),
            json: self.json.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str =
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 10/s }\n";

    const SECRET: &str = "# secret comment\nversion: 1\nidentity:\n  user: header:x-account\ncontrol:\n  report_interval: 2s\n  instruction_ttl: 10s\nservices:\n  api:\n    buckets:\n      - { name: all, limit: 10/s }\n      - { name: exact, limit: 5/s, algorithm: token-bucket, store: redis, match: { user: \"*\" } }\nredis: { url: \"redis://:hunter2@127.0.0.1:6379\" }\n";

    #[test]
    fn a_descriptor_bucket_runs_on_a_host_from_the_rules_as_sent() {
        // The link writes every default out, `cost: 1` among them, which a descriptor bucket
        // must not name in a file: what is sent must still run.
        let yaml = "version: 1\nservices:\n  edge:\n    buckets:\n      - name: per-ip\n        match: { descriptor: { domain: edge, entries: [ {key: remote_address} ] } }\n        limit: 10/s\n        algorithm: fixed-window\n";
        let snapshot = RulesSnapshot::parse(4, yaml, "rules.yaml").unwrap();
        let own = config::load_str(ONE, "own.yaml").unwrap();
        let config = LinkRules::decode(&snapshot.message())
            .unwrap()
            .with_own(&own, "received")
            .unwrap();
        let (_, bucket) = config.buckets().next().unwrap();
        assert_eq!(bucket.descriptor.as_ref().unwrap().domain.as_ref(), "edge");
    }

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

    #[test]
    fn what_goes_down_holds_no_comment_and_no_redis_section() {
        let rules = RulesSnapshot::parse(3, SECRET, "rules.yaml").unwrap();
        let message = rules.message();
        for field in [&message.yaml, &message.json] {
            assert!(!field.contains("secret comment"), "{field}");
            assert!(!field.contains("hunter2"), "{field}");
            assert!(!field.contains("6379"), "{field}");
        }
        assert!(
            !message.yaml.lines().any(|l| l.starts_with("redis")),
            "{}",
            message.yaml
        );
        // The data is the control section and the services, nothing else.
        let json: serde_json::Value = serde_json::from_str(&message.json).unwrap();
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["control", "services"]);
        assert_eq!(json["control"]["report_interval"], "2s");
    }

    #[test]
    fn a_host_runs_the_services_with_its_own_identity_and_redis() {
        let controller = RulesSnapshot::parse(3, SECRET, "rules.yaml").unwrap();
        let own = config::load_str(
            "version: 1\nredis: { url: redis://10.0.0.9:6379, password_file: /run/pw }\n",
            "own.yaml",
        )
        .unwrap();
        let received = LinkRules::decode(&controller.message()).unwrap();
        let config = received.with_own(&own, "control-plane rules").unwrap();
        assert_eq!(config.redis, own.redis);
        assert_eq!(config.identity, own.identity);
        assert_eq!(config.control, controller.config.control);
        assert_eq!(config.services, controller.config.services);
    }

    #[test]
    fn a_host_without_redis_refuses_a_redis_bucket_clearly() {
        let controller = RulesSnapshot::parse(3, SECRET, "rules.yaml").unwrap();
        let own = config::load_str("version: 1\n", "own.yaml").unwrap();
        let err = LinkRules::decode(&controller.message())
            .unwrap()
            .with_own(&own, "control-plane rules version 3")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("store: redis needs a top-level `redis` section"),
            "{err}"
        );
    }

    #[test]
    fn a_message_of_the_previous_shape_gives_its_control_and_services_only() {
        let old = v1::Rules {
            version: 9,
            yaml: SECRET.to_owned(),
            json: String::new(),
        };
        let received = LinkRules::decode(&old).unwrap();
        let file: ConfigFile = yaml_serde::from_str(SECRET).unwrap();
        assert_eq!(received, LinkRules::of(&file));
    }

    #[test]
    fn unreadable_rules_say_which_field_and_where() {
        let bad = v1::Rules {
            version: 4,
            yaml: String::new(),
            json: "{\"control\": {}, \"services\": 7}".to_owned(),
        };
        let err = LinkRules::decode(&bad).unwrap_err().to_string();
        assert!(err.contains("version 4"), "{err}");
        assert!(err.contains("(json)"), "{err}");
        assert!(err.contains("column"), "{err}");
    }
}
