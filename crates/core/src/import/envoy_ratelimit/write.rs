//! Writing the Spillway configuration: the header that says where it came from, one service per
//! domain, and YAML scalars quoted only where they must be.

use super::*;

pub(super) fn header(domains: &[Domain], options: &Options) -> String {
    let mut yaml = String::new();
    yaml.push_str(
        "# Converted from envoyproxy/ratelimit's configuration by `spillway import envoy-ratelimit`:\n",
    );
    for domain in domains {
        let _ = writeln!(
            yaml,
            "#   {} (domain {})",
            comment(&domain.file),
            comment(&domain.domain)
        );
    }
    let _ = writeln!(
        yaml,
        "# Each descriptor is a descriptor bucket (docs/envoy.md), counted by {} in {}.",
        options.algorithm, options.store
    );
    yaml.push_str("version: 1\n");
    if options.store == StateStore::Redis {
        yaml.push_str("redis:\n  url: redis://127.0.0.1:6379     # envoyproxy/ratelimit's REDIS_URL: write yours\n");
    }
    yaml
}

pub(super) fn write_service(yaml: &mut String, domain: &Domain, service: &str, options: &Options) {
    let _ = writeln!(yaml, "  {}:", scalar(service));
    yaml.push_str("    buckets:\n");
    // Names: a rate_limit's own name where it is one Spillway accepts and the first to take
    // it, then the statistics key of envoyproxy/ratelimit for the others.
    let mut names: Vec<Option<String>> = vec![None; domain.descriptors.len()];
    let mut taken: Vec<String> = Vec::new();
    for (slot, descriptor) in names.iter_mut().zip(&domain.descriptors) {
        if let Some(name) = &descriptor.name
            && is_name(name)
            && !taken.contains(name)
        {
            taken.push(name.clone());
            *slot = Some(name.clone());
        }
    }
    for (slot, descriptor) in names.iter_mut().zip(&domain.descriptors) {
        if slot.is_none() {
            let name = unique(
                sanitize(&stat_key(&descriptor.entries), "descriptor"),
                &taken,
            );
            taken.push(name.clone());
            *slot = Some(name);
        }
    }
    let names: Vec<String> = names.into_iter().map(|n| n.unwrap_or_default()).collect();
    for (descriptor, name) in domain.descriptors.iter().zip(&names) {
        let _ = writeln!(
            yaml,
            "      - name: {}    # {}:{}",
            scalar(name),
            comment(&domain.file),
            descriptor.at
        );
        yaml.push_str("        match:\n          descriptor:\n");
        let _ = writeln!(yaml, "            domain: {}", scalar(&domain.domain));
        yaml.push_str("            entries:\n");
        for (key, value) in &descriptor.entries {
            match value {
                Some(value) => {
                    let _ = writeln!(
                        yaml,
                        "              - {{ key: {}, value: {} }}",
                        scalar(key),
                        scalar(value)
                    );
                }
                None => {
                    let _ = writeln!(yaml, "              - {{ key: {} }}", scalar(key));
                }
            }
        }
        let (answer, limit) = match descriptor.rule {
            Rule::Limit { count, unit } => (None, unit.limit(count)),
            Rule::OverLimit { unit } => (Some("over-limit"), unit.limit(1)),
            Rule::Unlimited => (Some("unlimited"), "1/s".to_owned()),
            Rule::Allow => (Some("allow"), "1/s".to_owned()),
        };
        if let Some(answer) = answer {
            let _ = writeln!(yaml, "            answer: {answer}");
        }
        if !descriptor.replaces.is_empty() {
            let mut replaced: Vec<&str> = Vec::new();
            for (name, _) in &descriptor.replaces {
                for (other, other_name) in domain.descriptors.iter().zip(&names) {
                    if other.name.as_deref() == Some(name)
                        && !replaced.contains(&other_name.as_str())
                    {
                        replaced.push(other_name);
                    }
                }
            }
            let list: Vec<Cow<'_, str>> = replaced.iter().map(|n| scalar(n)).collect();
            let _ = writeln!(yaml, "            replaces: [ {} ]", list.join(", "));
        }
        let unused = match descriptor.rule {
            Rule::Limit { .. } => "",
            Rule::OverLimit { .. } => "    # only its unit counts: always over the limit",
            Rule::Unlimited | Rule::Allow => "    # not used by this answer",
        };
        let _ = writeln!(yaml, "        limit: {limit}{unused}");
        if descriptor.shadow
            && matches!(descriptor.rule, Rule::Limit { .. } | Rule::OverLimit { .. })
        {
            yaml.push_str("        mode: shadow\n");
        }
        let _ = writeln!(yaml, "        algorithm: {}", options.algorithm);
        let _ = writeln!(yaml, "        store: {}", options.store);
    }
}

/// Text as a YAML scalar: plain when it cannot be read as anything else, else double-quoted
/// with escapes.
pub(super) fn scalar(text: &str) -> Cow<'_, str> {
    let plain = text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '/')
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !matches!(
            text.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "y" | "n" | "null"
        );
    if plain {
        return Cow::Borrowed(text);
    }
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                let _ = write!(quoted, "\\u{:04x}", u32::from(c));
            }
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    Cow::Owned(quoted)
}

/// Text for a comment: one line, whatever it holds.
pub(super) fn comment(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// envoyproxy/ratelimit's name for a descriptor in its statistics: `key_value.key2`.
pub(super) fn stat_key(entries: &[(String, Option<String>)]) -> String {
    entries
        .iter()
        .map(|(key, value)| match value {
            Some(value) => format!("{key}_{value}"),
            None => key.clone(),
        })
        .collect::<Vec<_>>()
        .join(".")
}
