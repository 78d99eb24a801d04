//! `POST /v1/rules:apply`: carrying out the planner's diff as one modification.

use serde_json::Value;

use super::audit::Audit;
use super::planner::{ApplyDiff, Step, UpdatedRule, plan};
use super::rules::{all_in, check_conflict, delete_in, insert_rule};
use super::{AuditAction, ChangeError, Store, User};
use crate::rule::RuleInput;

impl Store {
    /// Makes the permanent rules exactly those of a configuration, as one modification (none
    /// when nothing differs). Incident overrides are left alone: they end by themselves.
    pub async fn apply(
        &self,
        actor: &User,
        wanted: Vec<RuleInput>,
        dry_run: bool,
        reason: Option<&str>,
    ) -> Result<ApplyDiff, ChangeError> {
        let (version, rules) = self.snapshot().await?;
        if dry_run {
            let mut diff = plan(&rules, &wanted).0;
            diff.version = version;
            diff.dry_run = true;
            return Ok(diff);
        }
        // An apply that changes nothing is not a modification and spends no budget.
        let mut diff = plan(&rules, &wanted).0;
        if diff.is_empty() {
            diff.version = self.version().await?;
            return Ok(diff);
        }
        // Planned again under the writers' lock: another writer may have committed since.
        let (mut tx, version, now) = self.begin_change(Some(actor)).await?;
        let rules = all_in(&mut tx).await?;
        let (mut diff, steps) = plan(&rules, &wanted);
        diff.version = version;
        // Filled in below with the rules as stored, ids and versions included.
        diff.created.clear();
        diff.updated.clear();
        let mut before = Vec::new();
        let mut after = Vec::new();
        // Every delete first, so that a rule may take over the unique key (subject, value, api) or the name that another one
        // gives up in the same apply.
        for step in &steps {
            if let Step::Delete(old) | Step::Update(old, _) = step {
                delete_in(&mut tx, &old.id).await?;
            }
        }
        for step in steps {
            match step {
                Step::Delete(old) => before.push(old.to_json()),
                Step::Update(old, input) => {
                    let rule = insert_rule(
                        &mut tx,
                        &old.id,
                        input,
                        version,
                        &old.created_by,
                        old.created_at,
                        now,
                    )
                    .await?;
                    before.push(old.to_json());
                    after.push(rule.to_json());
                    diff.updated.push(UpdatedRule {
                        before: old.to_json(),
                        after: rule.to_json(),
                    });
                }
                Step::Create(input) => {
                    check_conflict(&mut tx, input, None).await?;
                    let id = uuid::Uuid::new_v4().to_string();
                    let rule =
                        insert_rule(&mut tx, &id, input, version, &actor.name, now, now).await?;
                    after.push(rule.to_json());
                    diff.created.push(rule.to_json());
                }
            }
        }
        self.finish_change(
            tx,
            version,
            now,
            Audit {
                actor: &actor.name,
                actor_id: Some(&actor.id),
                action: AuditAction::Apply,
                rule_id: None,
                before: Some(Value::Array(before)),
                after: Some(Value::Array(after)),
                reason,
            },
        )
        .await?;
        Ok(diff)
    }
}
