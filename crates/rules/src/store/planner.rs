//! What an apply would change: the pure comparison of the stored permanent rules with a wanted
//! configuration, by (service, name). It reads no database, so its tests are plain values.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::rule::{Rule, RuleInput};

/// What `apply` changed, or would change on a dry run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ApplyDiff {
    /// The rules version after the apply (unchanged on a dry run or when nothing differs).
    pub version: i64,
    pub dry_run: bool,
    pub created: Vec<Value>,
    pub updated: Vec<UpdatedRule>,
    pub deleted: Vec<Value>,
    pub unchanged: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpdatedRule {
    pub before: Value,
    pub after: Value,
}

impl ApplyDiff {
    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.updated.is_empty() && self.deleted.is_empty()
    }
}

/// One change an apply makes to the rules table.
#[derive(Debug)]
pub(super) enum Step<'a> {
    Create(&'a RuleInput),
    /// The stored rule, and what replaces it under the same id.
    Update(&'a Rule, &'a RuleInput),
    Delete(&'a Rule),
}

/// Compares the permanent rules with a configuration, by (service, name).
///
/// A wanted bucket equal to the stored one is unchanged, a different one updates it, a new
/// (service, name) creates a rule, and every permanent rule the configuration does not name is
/// deleted. Incident overrides (rules with an expiry) are neither compared nor deleted: they end
/// by themselves. Creates and updates come in the configuration's order, deletes after them by
/// (service, name). The diff's `version` and `dry_run` are left for the caller to fill in.
pub(super) fn plan<'a>(rules: &'a [Rule], wanted: &'a [RuleInput]) -> (ApplyDiff, Vec<Step<'a>>) {
    let mut current: BTreeMap<(&str, &str), &Rule> = rules
        .iter()
        .filter(|r| r.expires_at.is_none())
        .map(|r| ((r.service.as_str(), r.bucket.name.as_str()), r))
        .collect();
    let mut diff = ApplyDiff::default();
    let mut steps = Vec::new();
    for input in wanted {
        match current.remove(&(input.service.as_str(), input.bucket.name.as_str())) {
            Some(old) if old.bucket == input.bucket => diff.unchanged += 1,
            Some(old) => {
                diff.updated.push(UpdatedRule {
                    before: old.to_json(),
                    after: proposed(input),
                });
                steps.push(Step::Update(old, input));
            }
            None => {
                diff.created.push(proposed(input));
                steps.push(Step::Create(input));
            }
        }
    }
    for old in current.into_values() {
        diff.deleted.push(old.to_json());
        steps.push(Step::Delete(old));
    }
    (diff, steps)
}

/// A rule that does not exist yet, for a diff: its bucket and its service, without the keys
/// only the store gives (id, version, ...).
fn proposed(input: &RuleInput) -> Value {
    let mut value = serde_json::to_value(&input.bucket).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut value {
        map.insert("service".into(), json!(input.service));
    }
    value
}

#[cfg(test)]
mod tests;
