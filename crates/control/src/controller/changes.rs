//! A change of the rules as the dashboard lists it: one entry of the rules store's audit log,
//! summed up in a line (`api/all: limit 100/s -> 200/s`).

use serde_json::Value;

/// One entry of the rules store's audit log, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesChange {
    /// The rules version the change produced.
    pub version: u64,
    /// When, as the store wrote it (RFC 3339, UTC).
    pub at: String,
    pub actor: String,
    /// `create`, `update`, `delete`, `apply`, `override` or `expire`.
    pub action: String,
    /// What changed, in a line: `api/all: limit 100/s -> 200/s`.
    pub summary: String,
    pub reason: Option<String>,
}

impl RulesChange {
    /// An audit entry with the rule (or, for an `apply`, the array of rules) it held `before`
    /// and `after`, as the rules API writes them: each rule's JSON has its `service`, `name`,
    /// `limit` and `mode`.
    pub fn summarised(
        version: u64,
        at: &str,
        actor: &str,
        action: &str,
        reason: Option<&str>,
        before: Option<&Value>,
        after: Option<&Value>,
    ) -> Self {
        Self {
            version,
            at: at.to_owned(),
            actor: actor.to_owned(),
            action: action.to_owned(),
            summary: summary(before, after),
            reason: reason.map(str::to_owned),
        }
    }
}

/// What the rules `before` and `after` differ in, a part per rule.
fn summary(before: Option<&Value>, after: Option<&Value>) -> String {
    let rules = |v: Option<&Value>| -> Vec<Value> {
        match v {
            Some(Value::Array(rules)) => rules.clone(),
            Some(rule) => vec![rule.clone()],
            None => Vec::new(),
        }
    };
    let (before, after) = (rules(before), rules(after));
    let mut parts = Vec::new();
    for old in &before {
        match after.iter().find(|new| name(new) == name(old)) {
            Some(new) => parts.push(format!("{}: {}", name(old), difference(old, new))),
            None => parts.push(format!(
                "{}: deleted (was {})",
                name(old),
                text(old, "limit")
            )),
        }
    }
    for new in after
        .iter()
        .filter(|new| !before.iter().any(|old| name(old) == name(new)))
    {
        let mut line = format!("{}: created, limit {}", name(new), text(new, "limit"));
        if text(new, "mode") == "shadow" {
            line.push_str(", shadow");
        }
        if new.get("expires_at").is_some() {
            line.push_str(&format!(", until {}", text(new, "expires_at")));
        }
        parts.push(line);
    }
    if parts.is_empty() {
        return "no rule changed".into();
    }
    parts.join("; ")
}

/// `service/name` of a rule.
fn name(rule: &Value) -> String {
    format!("{}/{}", text(rule, "service"), text(rule, "name"))
}

/// A field of a rule as text: `?` when it has none, `enforce` for a mode not written.
fn text(rule: &Value, field: &str) -> String {
    match rule.get(field) {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None if field == "mode" => "enforce".into(),
        None => "?".into(),
    }
}

/// What changed between two versions of a rule: its limit and its mode, or something else.
fn difference(old: &Value, new: &Value) -> String {
    let changed: Vec<String> = ["limit", "mode"]
        .into_iter()
        .filter_map(|field| {
            let (a, b) = (text(old, field), text(new, field));
            (a != b).then(|| format!("{field} {a} -> {b}"))
        })
        .collect();
    if changed.is_empty() {
        "changed (not its limit or mode)".into()
    } else {
        changed.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rule(name: &str, limit: &str, mode: &str) -> Value {
        json!({ "id": "x", "service": "api", "name": name, "limit": limit, "mode": mode })
    }

    fn summed(before: Option<Value>, after: Option<Value>) -> String {
        RulesChange::summarised(
            2,
            "t",
            "alice",
            "update",
            None,
            before.as_ref(),
            after.as_ref(),
        )
        .summary
    }

    #[test]
    fn an_update_names_what_changed_of_limit_and_mode() {
        let old = rule("all", "100/s", "shadow");
        assert_eq!(
            summed(Some(old.clone()), Some(rule("all", "200/s", "shadow"))),
            "api/all: limit 100/s -> 200/s"
        );
        assert_eq!(
            summed(Some(old.clone()), Some(rule("all", "100/s", "enforce"))),
            "api/all: mode shadow -> enforce"
        );
        assert_eq!(
            summed(Some(old.clone()), Some(old)),
            "api/all: changed (not its limit or mode)"
        );
    }

    #[test]
    fn creations_and_deletions_say_so_with_the_limit() {
        assert_eq!(
            summed(None, Some(rule("new", "5/s", "shadow"))),
            "api/new: created, limit 5/s, shadow"
        );
        assert_eq!(
            summed(Some(rule("old", "7/s", "enforce")), None),
            "api/old: deleted (was 7/s)"
        );
        let mut temporary = rule("incident", "1/s", "enforce");
        temporary["expires_at"] = json!("2030-01-01T00:00:00Z");
        assert_eq!(
            summed(None, Some(temporary)),
            "api/incident: created, limit 1/s, until 2030-01-01T00:00:00Z"
        );
    }

    #[test]
    fn an_apply_lists_every_rule_it_changed() {
        let before = json!([rule("a", "1/s", "enforce"), rule("gone", "2/s", "enforce")]);
        let after = json!([rule("a", "3/s", "enforce"), rule("b", "4/s", "enforce")]);
        assert_eq!(
            summed(Some(before), Some(after)),
            "api/a: limit 1/s -> 3/s; api/gone: deleted (was 2/s); api/b: created, limit 4/s"
        );
        assert_eq!(summed(Some(json!([])), Some(json!([]))), "no rule changed");
    }
}
