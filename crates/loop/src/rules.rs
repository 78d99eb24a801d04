//! The rules every tier passes down, as the link carries them: the data ([`LinkRules`],
//! [`RulesSnapshot`]) lives in spillway-core, so that whoever only produces rules (the rules
//! service) needs nothing of the link; here is its message, [`v1::Rules`].
//!
//! Wire evolution: [`v1::Rules`] carries the data in `json`; its older field `yaml` carries the
//! same rules rendered as a file (with the controller's `identity`, which older hosts ran, and
//! without `redis`), for hosts that predate `json`. A host reads `json` when it is set, and the
//! `control` and `services` of `yaml` when it is not (a controller older than the field).

pub use spillway_core::rules::{LinkRules, RulesError, RulesSnapshot};
use spillway_proto::v1;

/// The message that carries a snapshot's rules.
pub trait RulesMessage {
    fn message(&self) -> v1::Rules;
}

impl RulesMessage for RulesSnapshot {
    fn message(&self) -> v1::Rules {
        v1::Rules {
            version: self.version,
            yaml: self.yaml.to_string(),
            json: self.json.to_string(),
        }
    }
}

/// Reading the rules of a received [`v1::Rules`].
pub trait DecodeRules: Sized {
    /// The rules of a message of either shape: its `json`, or, from a controller older than
    /// that field, the `control` and `services` of its `yaml` (whatever else that file holds,
    /// its `identity` and `redis` included, is not taken).
    fn decode(message: &v1::Rules) -> Result<Self, RulesError>;
}

impl DecodeRules for LinkRules {
    fn decode(message: &v1::Rules) -> Result<Self, RulesError> {
        LinkRules::decode_fields(message.version, &message.json, &message.yaml)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::config::{self, ConfigFile};

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
