//! One rule of the rules service as its REST API carries it: [`RuleBody`] is what a client
//! sends (`POST /v1/rules`, `PUT /v1/rules/{id}`), [`Rule`] what the service stores and answers.
//!
//! Both are a bucket of the configuration file with its `service` beside it, in one flat JSON
//! object: `{"service": "api", "name": "gw-a", "limit": "100/s", ...}`. They live here, below
//! the service, so that its client and the configurator read and write the same JSON without
//! depending on the server.

use serde::{Deserialize, Serialize};

use crate::config::BucketFile;
use crate::time::{format_millis, parse_millis};

/// A stored rule, as `GET /v1/rules` answers it: the bucket, its service, and what the service
/// adds. Times are Unix milliseconds, written as `2026-11-29T17:04:11.123Z`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rule {
    /// A UUID.
    pub id: String,
    pub service: String,
    #[serde(flatten)]
    pub bucket: BucketFile,
    /// The rules version of the rule's last change; sent back in `if-match`.
    pub version: i64,
    pub created_by: String,
    #[serde(with = "millis_text")]
    pub created_at: i64,
    #[serde(with = "millis_text")]
    pub updated_at: i64,
    /// When an incident override ends by itself; `None` for a rule in force until changed.
    #[serde(
        default,
        with = "option_millis_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub expires_at: Option<i64>,
    /// Why an incident override was made; every change's reason is in the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Rule {
    /// The service's JSON answer (what [`Serialize`] writes, as a JSON value).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The rule as the API takes it back to replace it: its service and bucket, with `reason`
    /// for the change to come.
    pub fn to_body(&self, reason: Option<String>) -> RuleBody {
        RuleBody {
            service: self.service.clone(),
            bucket: self.bucket.clone(),
            ttl: None,
            reason,
        }
    }

    /// Whether the rule is an incident override (it ends by itself).
    pub fn is_override(&self) -> bool {
        self.expires_at.is_some()
    }
}

/// A rule as a client sends it. With a `ttl` it is an incident override, which the service
/// refuses without a `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleBody {
    pub service: String,
    #[serde(flatten)]
    pub bucket: BucketFile,
    /// How long an incident override lasts, written like `15m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Why the change is made, for the audit log: at most 4096 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Unix milliseconds as `2026-11-29T17:04:11.123Z`.
mod millis_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(millis: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_millis(*millis))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_millis(&text).map_err(serde::de::Error::custom)
    }
}

/// [`millis_text`], or nothing.
mod option_millis_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(millis: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match millis {
            Some(millis) => s.serialize_str(&super::format_millis(*millis)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| super::parse_millis(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A rule as the service answers it reads into the type and writes back the same object.
    #[test]
    fn a_served_rule_reads_and_writes_the_same_json() {
        let served = json!({
            "id": "0b8e6a52-3c1e-4d6f-9b1a-2f4c5d6e7f80",
            "service": "api",
            "name": "gw-a",
            "match": {"caller": "gw", "procedure": "/a"},
            "limit": "100/s",
            "algorithm": "token-bucket",
            "mode": "shadow",
            "scope": "global",
            "cost": 1,
            "candidate": {"limit": "150/s", "since": "2026-12-03T07:00:00Z"},
            "version": 7,
            "created_by": "configurator",
            "created_at": "2026-11-29T17:04:11.123Z",
            "updated_at": "2026-12-03T07:00:00.000Z",
            "reason": "why",
        });
        let rule: Rule = serde_json::from_value(served.clone()).unwrap();
        assert_eq!(rule.service, "api");
        assert_eq!(rule.bucket.name, "gw-a");
        assert_eq!(rule.bucket.limit.per_second(), 100.0);
        assert_eq!(rule.created_at, 1_795_971_851_123);
        assert!(!rule.is_override());
        let candidate = rule.bucket.candidate.as_ref().unwrap();
        assert_eq!(candidate.limit.per_second(), 150.0);
        let written = serde_json::to_value(&rule).unwrap();
        assert_eq!(
            serde_json::from_value::<Rule>(written.clone()).unwrap(),
            rule
        );
        assert_eq!(written["created_at"], served["created_at"]);
        assert_eq!(written["candidate"], served["candidate"]);
        assert_eq!(written["match"], served["match"]);
        assert!(written.get("expires_at").is_none());

        let body = serde_json::to_value(rule.to_body(Some("because".into()))).unwrap();
        assert_eq!(body["service"], "api");
        assert_eq!(body["name"], "gw-a");
        assert_eq!(body["reason"], "because");
        for owned in [
            "id",
            "version",
            "created_by",
            "created_at",
            "updated_at",
            "ttl",
        ] {
            assert!(body.get(owned).is_none(), "{owned} in {body}");
        }
    }

    #[test]
    fn a_bad_time_says_what_it_is() {
        let err = serde_json::from_value::<Rule>(json!({
            "id": "x", "service": "api", "name": "b", "limit": "1/s", "version": 1,
            "created_by": "a", "created_at": "yesterday", "updated_at": "2026-01-01T00:00:00Z",
        }))
        .unwrap_err();
        assert!(err.to_string().contains("yesterday"), "{err}");
    }
}
