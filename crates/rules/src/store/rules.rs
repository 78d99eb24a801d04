//! Reading rules, and changing one at a time: create, update, delete, and the expiry of
//! incident overrides. Each change is one modification (see the `store` module).

use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::audit::Audit;
use super::{AuditAction, ChangeError, Store, StoreError, User};
use crate::rule::{Rule, RuleInput};
use crate::time::now_millis;

const RULE_COLUMNS: &str = "rule_id, service, bucket_json, expires_at, reason, version, created_by, created_at, updated_at";

impl Store {
    /// Live rules (overrides that have expired are left out), by service and name.
    pub async fn list_rules(&self, service: Option<&str>) -> Result<Vec<Rule>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM rules WHERE (expires_at IS NULL OR expires_at > $1) \
             AND ($2 IS NULL OR service = $2) ORDER BY service, name"
        )))
        .bind(now_millis())
        .bind(service)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(rule_from_row).collect()
    }

    pub async fn get_rule(&self, id: &str) -> Result<Option<Rule>, StoreError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {RULE_COLUMNS} FROM rules WHERE rule_id = $1 \
             AND (expires_at IS NULL OR expires_at > $2)"
        )))
        .bind(id)
        .bind(now_millis())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(rule_from_row).transpose()
    }

    /// `POST /v1/rules`: one modification.
    pub async fn create_rule(&self, actor: &User, input: RuleInput) -> Result<Rule, ChangeError> {
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        check_conflict(&mut tx, &input, None).await?;
        check_room(&mut tx, now).await?;
        let id = uuid::Uuid::new_v4().to_string();
        let rule = insert_rule(&mut tx, &id, &input, version, &actor.name, now, now).await?;
        let action = if input.ttl.is_some() {
            AuditAction::Override
        } else {
            AuditAction::Create
        };
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action,
                rule_id: Some(&id),
                before: None,
                after: Some(rule.to_json()),
                reason: input.reason.as_deref(),
            },
        )
        .await?;
        Ok(rule)
    }

    /// `PUT /v1/rules/{id}`: replaces the rule if it is still at `expected` (when given).
    pub async fn update_rule(
        &self,
        actor: &User,
        id: &str,
        expected: Option<i64>,
        input: RuleInput,
    ) -> Result<Rule, ChangeError> {
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        let before = current_in(&mut tx, id, expected, now).await?;
        check_conflict(&mut tx, &input, Some(id)).await?;
        delete_in(&mut tx, id).await?;
        let rule = insert_rule(
            &mut tx,
            id,
            &input,
            version,
            &before.created_by,
            before.created_at,
            now,
        )
        .await?;
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action: AuditAction::Update,
                rule_id: Some(id),
                before: Some(before.to_json()),
                after: Some(rule.to_json()),
                reason: input.reason.as_deref(),
            },
        )
        .await?;
        Ok(rule)
    }

    /// `DELETE /v1/rules/{id}`.
    pub async fn delete_rule(
        &self,
        actor: &User,
        id: &str,
        expected: Option<i64>,
        reason: Option<&str>,
    ) -> Result<Rule, ChangeError> {
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        let before = current_in(&mut tx, id, expected, now).await?;
        delete_in(&mut tx, id).await?;
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action: AuditAction::Delete,
                rule_id: Some(id),
                before: Some(before.to_json()),
                after: None,
                reason,
            },
        )
        .await?;
        Ok(before)
    }

    /// Deletes incident overrides whose time is up, each as a modification of its own by
    /// `system`, which spends nobody's budget. Returns how many ended.
    pub async fn expire_overrides(&self) -> Result<usize, ChangeError> {
        let due: Vec<String> = sqlx::query_scalar(
            "SELECT rule_id FROM rules WHERE expires_at IS NOT NULL AND expires_at <= $1",
        )
        .bind(now_millis())
        .fetch_all(&self.pool)
        .await?;
        let mut ended = 0;
        for id in due {
            let (mut tx, version, now) = self.begin_change(None).await?;
            let Some(before) = rule_in(&mut tx, &id).await? else {
                continue;
            };
            delete_in(&mut tx, &id).await?;
            self.finish_change(
                tx,
                version,
                now,
                Audit {
                    actor: "system",
                    actor_id: None,
                    action: AuditAction::Expire,
                    rule_id: Some(&id),
                    before: Some(before.to_json()),
                    after: None,
                    reason: before.reason.as_deref(),
                },
            )
            .await?;
            ended += 1;
        }
        Ok(ended)
    }
}

/// Every stored rule, expired overrides included, by service and name.
pub(super) async fn all_in(tx: &mut Transaction<'static, Any>) -> Result<Vec<Rule>, StoreError> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {RULE_COLUMNS} FROM rules ORDER BY service, name"
    )))
    .fetch_all(&mut **tx)
    .await?;
    rows.iter().map(rule_from_row).collect()
}

/// Refuses a rule whose (service, subject, subject value, api) or (service, name) another
/// rule already holds, naming that rule.
pub(super) async fn check_conflict(
    tx: &mut Transaction<'static, Any>,
    input: &RuleInput,
    except: Option<&str>,
) -> Result<(), ChangeError> {
    let row = sqlx::query(
        "SELECT rule_id, name FROM rules WHERE service = $1 AND rule_id <> $2 AND \
         ((subject_scope = $3 AND subject_value = $4 AND api = $5) OR name = $6)",
    )
    .bind(&input.service)
    .bind(except.unwrap_or(""))
    .bind(input.key.subject_scope)
    .bind(&input.key.subject_value)
    .bind(&input.key.api)
    .bind(&input.bucket.name)
    .fetch_optional(&mut **tx)
    .await?;
    if let Some(row) = row {
        let id: String = row.try_get("rule_id")?;
        let name: String = row.try_get("name")?;
        let why = if name == input.bucket.name {
            format!(
                "the name \"{name}\" is taken in service \"{}\"",
                input.service
            )
        } else {
            format!(
                "it limits the same (subject {} \"{}\", api \"{}\") in service \"{}\"",
                input.key.subject_scope, input.key.subject_value, input.key.api, input.service
            )
        };
        return Err(ChangeError::Conflict(format!(
            "rule {id} (\"{name}\") conflicts: {why}; change that rule instead, or make this one narrower"
        )));
    }
    Ok(())
}

/// Refuses a new rule when the live ones already number
/// [`MAX_BUCKETS`](spillway_core::config::MAX_BUCKETS): the rules the controller sends down are
/// one configuration, which holds no more.
async fn check_room(tx: &mut Transaction<'static, Any>, now: i64) -> Result<(), ChangeError> {
    let limit = spillway_core::config::MAX_BUCKETS;
    let live: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM rules WHERE expires_at IS NULL OR expires_at > $1",
    )
    .bind(now)
    .fetch_one(&mut **tx)
    .await?;
    if usize::try_from(live).unwrap_or(usize::MAX) >= limit {
        return Err(ChangeError::Full { limit });
    }
    Ok(())
}

/// Stores `input` as rule `id` at `version`; `created_by` and `created_at` are the first
/// version's, so that an update keeps them.
pub(super) async fn insert_rule(
    tx: &mut Transaction<'static, Any>,
    id: &str,
    input: &RuleInput,
    version: i64,
    created_by: &str,
    created_at: i64,
    now: i64,
) -> Result<Rule, ChangeError> {
    let bucket_json =
        serde_json::to_string(&input.bucket).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let match_json = serde_json::to_string(&input.bucket.match_)
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let cost_json = serde_json::to_string(&input.bucket.cost)
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let expires_at = input
        .ttl
        .map(|ttl| now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)));
    let reason = input.ttl.and(input.reason.as_deref());
    let k = &input.key;
    sqlx::query(
        "INSERT INTO rules (rule_id, service, name, subject_scope, subject_value, api, algorithm, \
         max_requests, window_seconds, burst_size, match_json, scope, mode, store, cost_json, \
         on_store_failure, bucket_json, expires_at, reason, version, created_by, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)",
    )
    .bind(id)
    .bind(&input.service)
    .bind(&input.bucket.name)
    .bind(k.subject_scope)
    .bind(&k.subject_value)
    .bind(&k.api)
    .bind(k.algorithm)
    .bind(k.max_requests)
    .bind(k.window_seconds)
    .bind(k.burst_size)
    .bind(match_json)
    .bind(k.scope)
    .bind(k.mode)
    .bind(k.store)
    .bind(cost_json)
    .bind(k.on_store_failure)
    .bind(bucket_json)
    .bind(expires_at)
    .bind(reason)
    .bind(version)
    .bind(created_by)
    .bind(created_at)
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(unique_to_conflict)?;
    Ok(Rule {
        id: id.to_owned(),
        service: input.service.clone(),
        bucket: input.bucket.clone(),
        expires_at,
        reason: reason.map(str::to_owned),
        version,
        created_by: created_by.to_owned(),
        created_at,
        updated_at: now,
    })
}

pub(super) async fn delete_in(
    tx: &mut Transaction<'static, Any>,
    id: &str,
) -> Result<(), ChangeError> {
    sqlx::query("DELETE FROM rules WHERE rule_id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Rule `id` as the transaction sees it, expired or not.
async fn rule_in(
    tx: &mut Transaction<'static, Any>,
    id: &str,
) -> Result<Option<Rule>, ChangeError> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {RULE_COLUMNS} FROM rules WHERE rule_id = $1"
    )))
    .bind(id)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.as_ref().map(rule_from_row).transpose()?)
}

/// The rule an update or a delete starts from: rule `id` if it is live at `now` and, when the
/// caller names the version it read (`if-match`), still at that version.
async fn current_in(
    tx: &mut Transaction<'static, Any>,
    id: &str,
    expected: Option<i64>,
    now: i64,
) -> Result<Rule, ChangeError> {
    let rule = rule_in(tx, id)
        .await?
        .filter(|r| r.expires_at.is_none_or(|at| at > now))
        .ok_or_else(|| ChangeError::NotFound(id.to_owned()))?;
    if let Some(expected) = expected
        && expected != rule.version
    {
        return Err(ChangeError::VersionMoved {
            expected,
            current: rule.version,
        });
    }
    Ok(rule)
}

fn unique_to_conflict(err: sqlx::Error) -> ChangeError {
    match &err {
        sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::UniqueViolation => {
            ChangeError::Conflict(format!(
                "another rule already limits the same (subject, subject value, api) or has the same name in this service: {}",
                db.message()
            ))
        }
        _ => ChangeError::from(err),
    }
}

fn rule_from_row(row: &AnyRow) -> Result<Rule, StoreError> {
    let bucket_json: String = row.try_get("bucket_json")?;
    Ok(Rule {
        id: row.try_get("rule_id")?,
        service: row.try_get("service")?,
        bucket: serde_json::from_str(&bucket_json)
            .map_err(|e| StoreError::Corrupt(format!("rule bucket: {e}")))?,
        expires_at: row.try_get("expires_at")?,
        reason: row.try_get("reason")?,
        version: row.try_get("version")?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}
