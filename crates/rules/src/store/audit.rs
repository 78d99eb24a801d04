//! The audit log: one row per modification, saying who changed what, when, and from which rules
//! version to which.

use std::str::FromStr;

use serde::Serialize;
use serde_json::Value;
use sqlx::{Any, Row, Transaction};

use super::{Store, StoreError};
use crate::time::format_millis;

/// What a modification did. Its name is what the audit log stores and what `GET /v1/audit`
/// answers in `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditAction {
    /// A permanent rule was created (`POST /v1/rules` without a `ttl`).
    Create,
    /// A rule was replaced (`PUT /v1/rules/{id}`).
    Update,
    /// A rule was deleted (`DELETE /v1/rules/{id}`).
    Delete,
    /// A whole configuration was applied (`POST /v1/rules:apply`), as one modification.
    Apply,
    /// An incident override was created (`POST /v1/rules` with a `ttl`).
    Override,
    /// An incident override's time was up and `system` deleted it.
    Expire,
}

impl AuditAction {
    /// Every action, in the order the API documents them.
    pub const ALL: [AuditAction; 6] = [
        AuditAction::Create,
        AuditAction::Update,
        AuditAction::Delete,
        AuditAction::Apply,
        AuditAction::Override,
        AuditAction::Expire,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuditAction::Create => "create",
            AuditAction::Update => "update",
            AuditAction::Delete => "delete",
            AuditAction::Apply => "apply",
            AuditAction::Override => "override",
            AuditAction::Expire => "expire",
        }
    }
}

impl std::fmt::Display for AuditAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AuditAction {
    type Err = StoreError;
    fn from_str(text: &str) -> Result<Self, StoreError> {
        AuditAction::ALL
            .into_iter()
            .find(|action| action.as_str() == text)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown audit action {text:?}")))
    }
}

/// One row of the audit log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// The rules version this modification produced.
    pub version: i64,
    /// The version it started from.
    pub from_version: i64,
    pub at: String,
    pub actor: String,
    pub action: AuditAction,
    pub rule_id: Option<String>,
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub reason: Option<String>,
}

/// The audit row a modification writes as it commits.
pub(super) struct Audit<'a> {
    pub actor: &'a str,
    /// `None` for `system`, whose modifications spend nobody's budget.
    pub actor_id: Option<&'a str>,
    pub action: AuditAction,
    pub rule_id: Option<&'a str>,
    pub before: Option<Value>,
    pub after: Option<Value>,
    pub reason: Option<&'a str>,
}

impl Audit<'_> {
    /// Writes the row for the modification that produces `version` at `now`.
    pub(super) async fn insert(
        self,
        tx: &mut Transaction<'static, Any>,
        version: i64,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        let text = |v: Option<Value>| v.map(|v| v.to_string());
        sqlx::query(
            "INSERT INTO audit_log (version, actor, actor_id, at, action, rule_id, before_json, after_json, reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(version)
        .bind(self.actor)
        .bind(self.actor_id)
        .bind(now)
        .bind(self.action.as_str())
        .bind(self.rule_id)
        .bind(text(self.before))
        .bind(text(self.after))
        .bind(self.reason)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

impl Store {
    /// The newest `limit` entries of the audit log older than version `before` (all when
    /// `None`), newest first: a page, walked by passing the last version of one as the `before`
    /// of the next.
    pub async fn audit(
        &self,
        limit: i64,
        before: Option<i64>,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let rows = sqlx::query(
            "SELECT version, actor, at, action, rule_id, before_json, after_json, reason \
             FROM audit_log WHERE version < $1 ORDER BY version DESC LIMIT $2",
        )
        .bind(before.unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let version: i64 = row.try_get("version")?;
                let json = |column: &str| -> Result<Option<Value>, StoreError> {
                    let text: Option<String> = row.try_get(column)?;
                    text.map(|t| {
                        serde_json::from_str(&t).map_err(|e| StoreError::Corrupt(e.to_string()))
                    })
                    .transpose()
                };
                let action: String = row.try_get("action")?;
                Ok(AuditEntry {
                    version,
                    from_version: version - 1,
                    at: format_millis(row.try_get("at")?),
                    actor: row.try_get("actor")?,
                    action: action.parse()?,
                    rule_id: row.try_get("rule_id")?,
                    before: json("before_json")?,
                    after: json("after_json")?,
                    reason: row.try_get("reason")?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use utoipa::OpenApi;

    #[test]
    fn names_are_those_the_log_has_always_stored() {
        let names: Vec<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            names,
            ["create", "update", "delete", "apply", "override", "expire"]
        );
    }

    #[test]
    fn each_name_reads_back_as_its_action_and_serializes_as_itself() {
        for action in AuditAction::ALL {
            assert_eq!(action.as_str().parse::<AuditAction>().unwrap(), action);
            assert_eq!(
                serde_json::to_value(action).unwrap(),
                json!(action.as_str())
            );
            assert_eq!(action.to_string(), action.as_str());
        }
    }

    #[test]
    fn an_unknown_name_is_corrupt_data_not_a_guess() {
        for text in ["", "Create", "CREATE", "created", "overrides"] {
            assert!(
                matches!(text.parse::<AuditAction>(), Err(StoreError::Corrupt(m)) if m.contains("unknown audit action")),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_openapi_document_lists_every_action() {
        let doc = serde_json::to_value(crate::api::ApiDoc::openapi()).unwrap();
        let action = &doc["components"]["schemas"]["AuditAnswer"]["properties"]["action"];
        assert_eq!(action["type"], "string");
        let described = action["description"].as_str().unwrap();
        for name in AuditAction::ALL.map(AuditAction::as_str) {
            assert!(
                described.contains(name),
                "{name} missing from {described:?}"
            );
        }
    }
}
