//! The checks of what a bucket matches: its `match` (subject patterns, caller and procedure) or its
//! `descriptor`, and the key under which two rules would be the same rule.

use super::*;

pub(super) fn check_match(
    check: &Checker<'_>,
    path: &str,
    spec: &MatchFile,
) -> Result<MatchSpec, Located> {
    if spec.descriptor.is_some() {
        let others = [
            ("caller", spec.caller.is_some()),
            ("procedure", spec.procedure.is_some()),
            ("user", spec.user.is_some()),
            ("org", spec.org.is_some()),
            ("api_key", spec.api_key.is_some()),
            ("ip", spec.ip.is_some()),
        ];
        if let Some((key, _)) = others.iter().find(|(_, present)| *present) {
            return Err(check.at_key(
                &child(path, key),
                format!(
                    "a descriptor bucket matches Envoy descriptors, never HTTP requests, so it takes no `{key}`; put the attribute in the descriptor's entries (as Envoy's rate limit actions send it), or make an HTTP bucket of its own"
                ),
            ));
        }
        return Ok(MatchSpec::default());
    }
    let keyed: [(&str, &Option<String>); 6] = [
        ("caller", &spec.caller),
        ("procedure", &spec.procedure),
        ("user", &spec.user),
        ("org", &spec.org),
        ("api_key", &spec.api_key),
        ("ip", &spec.ip),
    ];
    for (key, value) in keyed {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(check.at_value(
                &child(path, key),
                format!(
                    "`{key}` is empty, which no request matches; leave the key out to match any {key}, or write \"*\""
                ),
            ));
        }
    }
    let mut subject: Option<(SubjectKind, &str)> = None;
    let subjects = [
        (SubjectKind::User, &spec.user),
        (SubjectKind::Org, &spec.org),
        (SubjectKind::ApiKey, &spec.api_key),
        (SubjectKind::Ip, &spec.ip),
    ];
    // Report the subject written second in the file, whatever the struct's order.
    let mut written: Vec<(Position, SubjectKind, &str)> = subjects
        .iter()
        .filter_map(|(kind, value)| {
            let value = value.as_deref()?;
            Some((check.positions.key(&child(path, kind.key())), *kind, value))
        })
        .collect();
    written.sort_by_key(|(position, ..)| *position);
    for (position, kind, value) in written {
        if let Some((first, _)) = subject {
            return Err(Located {
                position,
                message: format!(
                    "a match names at most one subject (user, org, api_key or ip), and this one already names `{first}`; make a bucket per subject"
                ),
            });
        }
        subject = Some((kind, value));
    }
    Ok(MatchSpec {
        caller: spec.caller.as_deref().map(Pattern::new),
        procedure: spec.procedure.as_deref().map(Pattern::new),
        subject: subject.map(|(kind, value)| Subject {
            kind,
            value: SubjectValue::new(value),
        }),
    })
}

pub(super) fn check_descriptor(
    check: &Checker<'_>,
    path: &str,
    descriptor: &DescriptorFile,
) -> Result<DescriptorSpec, Located> {
    if descriptor.domain.trim().is_empty() {
        return Err(check.at_value(
            &child(path, "domain"),
            "the descriptor's domain is empty; write the domain Envoy's rate limit filter sends, like `domain: rl`",
        ));
    }
    let entries_path = child(path, "entries");
    if descriptor.entries.is_empty() {
        return Err(check.at_value(
            &entries_path,
            "a descriptor needs at least one entry, like `entries: [ {key: remote_address} ]`",
        ));
    }
    let mut entries = Vec::with_capacity(descriptor.entries.len());
    for (i, entry) in descriptor.entries.iter().enumerate() {
        let entry_path = item(&entries_path, i);
        if entry.key.is_empty() {
            return Err(check.at_value(
                &child(&entry_path, "key"),
                "the entry's key is empty; write the key Envoy sends, like `key: remote_address`",
            ));
        }
        if entry.key == crate::descriptor::CRITICALITY_KEY {
            return Err(check.at_value(
                &child(&entry_path, "key"),
                "the key `criticality` names a request's tier and is never matched: a descriptor that carries it is matched without it, so leave it out of the bucket's entries",
            ));
        }
        if let Some(value) = &entry.value {
            let at = child(&entry_path, "value");
            if value.is_empty() {
                return Err(check.at_value(
                    &at,
                    "the entry's value is empty; leave `value` out to match any value (each counted apart)",
                ));
            }
            if value.trim_end_matches('*').contains('*') || value.ends_with("**") {
                return Err(check.at_value(
                    &at,
                    format!(
                        "value \"{value}\": a `*` may only end a value (a prefix, like \"shady*\"), as in envoyproxy/ratelimit"
                    ),
                ));
            }
        }
        entries.push(EntrySpec {
            key: entry.key.as_str().into(),
            value: EntryValue::new(entry.value.as_deref()),
        });
    }
    for (i, name) in descriptor.replaces.iter().enumerate() {
        if !is_name(name) {
            return Err(check.at_value(
                &item(&child(path, "replaces"), i),
                format!("\"{name}\" is no bucket name; name a descriptor bucket of this service"),
            ));
        }
    }
    Ok(DescriptorSpec {
        domain: descriptor.domain.as_str().into(),
        entries: entries.into(),
        answer: descriptor.answer,
        replaces: descriptor
            .replaces
            .iter()
            .map(|n| n.as_str().into())
            .collect(),
    })
}

/// The per-subject quota's unique key: (subject, subject value, api). A rule without a subject key is about its
/// caller; an absent caller or procedure is the same as `*`.
pub(super) fn rule_key(spec: &MatchSpec) -> (&'static str, String, String) {
    let (subject, value) = match &spec.subject {
        Some(s) => (s.kind.key(), s.value.as_str().to_owned()),
        None => (
            "caller",
            spec.caller.as_ref().map_or("*", Pattern::as_str).to_owned(),
        ),
    };
    let api = spec
        .procedure
        .as_ref()
        .map_or("*", Pattern::as_str)
        .to_owned();
    (subject, value, api)
}

pub(super) fn describe_subject(subject: &str, value: &str) -> String {
    match (subject, value) {
        ("caller", "*") => "every caller".to_owned(),
        (_, "*") => format!("each {subject}"),
        _ => format!("{subject} \"{value}\""),
    }
}

pub(super) fn describe_api(api: &str) -> String {
    if api == "*" {
        "every procedure".to_owned()
    } else {
        format!("procedure \"{api}\"")
    }
}
