//! Reading one envoyproxy/ratelimit file: its domain and descriptors, each value checked where it is
//! written, and a note for every key the importer leaves behind.

use super::*;

pub(super) fn invalid(file: &str, text: &str, position: Position, message: String) -> ConfigError {
    ConfigError::Invalid {
        file: file.to_owned(),
        position: clamp(position, text),
        message,
    }
}

/// Reads one file's domain and descriptors.
pub(super) struct Reader<'a> {
    pub(super) file: &'a str,
    pub(super) text: &'a str,
    pub(super) notes: &'a mut Vec<Note>,
    /// The buckets keep one count each (a control-plane algorithm, `--algorithm drop-ratio`):
    /// a limited descriptor that counts each value of an entry apart is refused.
    pub(super) one_count: Option<Algorithm>,
    /// For each level of the descriptor being read, where its entry counts each value apart (no
    /// value, or a prefix value) and its key; `None` for a level with one value.
    pub(super) apart: Vec<Option<(Position, String)>>,
}

/// A mapping's entries by key.
pub(super) type Entries<'n> = &'n [(Node, Node)];

/// Keys that belong at another level, and where.
pub(super) const ELSEWHERE: &[(&str, &str)] = &[
    (
        "domain",
        "`domain` is a file's first key, above its `descriptors`",
    ),
    (
        "key",
        "`key` belongs to a descriptor, an item of `descriptors`",
    ),
    ("value", "`value` belongs to a descriptor, beside its `key`"),
    (
        "descriptors",
        "`descriptors` belongs to a descriptor (nested) or to the file's top level",
    ),
    (
        "rate_limit",
        "`rate_limit` belongs to a descriptor, beside its `key`",
    ),
    (
        "shadow_mode",
        "`shadow_mode` belongs to a descriptor, beside its `rate_limit`",
    ),
    (
        "detailed_metric",
        "`detailed_metric` belongs to a descriptor, beside its `rate_limit`",
    ),
    (
        "unit",
        "`unit` belongs in the descriptor's `rate_limit` block",
    ),
    (
        "requests_per_unit",
        "`requests_per_unit` belongs in the descriptor's `rate_limit` block",
    ),
    (
        "unlimited",
        "`unlimited` belongs in the descriptor's `rate_limit` block",
    ),
    (
        "name",
        "`name` belongs in the descriptor's `rate_limit` block",
    ),
    (
        "replaces",
        "`replaces` belongs in the descriptor's `rate_limit` block",
    ),
];

impl Reader<'_> {
    fn error(&self, at: Position, message: impl Into<String>) -> ConfigError {
        invalid(self.file, self.text, at, message.into())
    }

    fn note(&mut self, at: Position, message: impl Into<String>) {
        self.notes.push(Note {
            file: self.file.to_owned(),
            position: clamp(at, self.text),
            message: message.into(),
        });
    }

    pub(super) fn read(mut self) -> Result<Domain, ConfigError> {
        let root = yaml::parse(self.text)
            .map_err(|e| self.error(e.position, e.message))?
            .ok_or_else(|| {
                self.error(
                    Position::START,
                    "the file holds no configuration; an envoyproxy/ratelimit file starts with `domain:`",
                )
            })?;
        let entries = self.mapping(
            &root,
            "an envoyproxy/ratelimit file (`domain`, `descriptors`)",
        )?;
        self.known_keys(entries, &["domain", "descriptors"], "the file's top level")?;
        let Some(domain_node) = get(entries, "domain") else {
            return Err(self.error(
                root.at,
                "missing key `domain`; an envoyproxy/ratelimit file starts with `domain: NAME`",
            ));
        };
        let domain = self.text_of(domain_node, "domain")?;
        if domain.is_empty() {
            return Err(self.error(
                domain_node.at,
                "the domain is empty; envoyproxy/ratelimit refuses a file without a domain",
            ));
        }
        let mut descriptors = Vec::new();
        if let Some(list) = get(entries, "descriptors") {
            self.descriptors(list, &mut Vec::new(), &mut descriptors)?;
        }
        self.check_replaces(&domain, &descriptors)?;
        Ok(Domain {
            file: self.file.to_owned(),
            domain,
            at: domain_node.at,
            descriptors,
        })
    }

    /// A level of descriptors below the entries of `path`.
    fn descriptors(
        &mut self,
        list: &Node,
        path: &mut Vec<(String, Option<String>)>,
        out: &mut Vec<Descriptor>,
    ) -> Result<(), ConfigError> {
        let items = match &list.value {
            Value::Null => return Ok(()),
            Value::Seq(items) => items,
            _ => {
                return Err(self.error(
                    list.at,
                    format!(
                        "`descriptors` is a list of descriptors (`- key: ...`), not {}",
                        list.kind()
                    ),
                ));
            }
        };
        // envoyproxy/ratelimit keys a level by `key` or `key_value`, and refuses one twice.
        let mut seen: HashMap<String, Position> = HashMap::new();
        for item in items {
            let entries = self.mapping(item, "a descriptor (`key`, `value`, `rate_limit`, ...)")?;
            self.known_keys(
                entries,
                &[
                    "key",
                    "value",
                    "rate_limit",
                    "descriptors",
                    "shadow_mode",
                    "detailed_metric",
                ],
                "a descriptor",
            )?;
            let Some(key_node) = get(entries, "key") else {
                return Err(self.error(
                    item.at,
                    "missing key `key`; every descriptor has one, like `key: remote_address`",
                ));
            };
            let key = self.text_of(key_node, "key")?;
            if key.is_empty() {
                return Err(self.error(
                    key_node.at,
                    "the descriptor's key is empty; envoyproxy/ratelimit refuses it too",
                ));
            }
            let value = match get(entries, "value") {
                None => None,
                Some(node) => {
                    let value = self.text_of(node, "value")?;
                    if value.is_empty() {
                        // Go's YAML reads `value: ""` as no value at all.
                        self.note(
                            node.at,
                            "an empty value is no value to envoyproxy/ratelimit: this descriptor matches any value of its key, each counted apart",
                        );
                        None
                    } else {
                        Some((value, node.at))
                    }
                }
            };
            let composite = match &value {
                None => key.clone(),
                Some((v, _)) => format!("{key}_{v}"),
            };
            if value.is_none() && key.ends_with('*') {
                return Err(self.error(
                    key_node.at,
                    format!(
                        "key `{key}` without a value is a wildcard to envoyproxy/ratelimit, over its `key_value` text (whatever starts with `{}`), which descriptor buckets cannot express: they match keys exactly",
                        key.trim_end_matches('*')
                    ),
                ));
            }
            if let Some((v, at)) = &value {
                let body = v.strip_suffix('*').unwrap_or(v);
                if body.contains('*') {
                    return Err(self.error(
                        *at,
                        format!(
                            "value `{v}`: envoyproxy/ratelimit matches `*` inside a value as the character itself, which descriptor buckets cannot express (a `*` may only end a value, as a prefix)"
                        ),
                    ));
                }
            }
            if let Some(first) = seen.get(&composite) {
                return Err(self.error(
                    key_node.at,
                    format!(
                        "this descriptor is `{composite}` to envoyproxy/ratelimit, like the one at line {}; it refuses a level with two (duplicate descriptor composite key), so merge them",
                        first.line
                    ),
                ));
            }
            seen.insert(composite, key_node.at);

            let shadow = self.flag(entries, "shadow_mode")?;
            if self.flag(entries, "detailed_metric")? {
                let at = get(entries, "detailed_metric").map_or(item.at, |n| n.at);
                self.note(
                    at,
                    "detailed_metric is ignored: Spillway counts per bucket (spillway_requests_total{service,bucket}), never per value",
                );
            }
            self.apart.push(match &value {
                None => Some((key_node.at, format!("key `{key}` has no value"))),
                Some((v, at)) if v.ends_with('*') => {
                    Some((*at, format!("value `{v}` is a prefix")))
                }
                Some(_) => None,
            });
            path.push((key, value.map(|(v, _)| v)));
            let children = get(entries, "descriptors");
            let has_children = children.is_some_and(|c| match &c.value {
                Value::Seq(items) => !items.is_empty(),
                _ => false,
            });
            match get(entries, "rate_limit").filter(|n| n.value != Value::Null) {
                Some(rate_limit) => {
                    let (rule, name, replaces) = self.rate_limit(rate_limit)?;
                    if matches!(rule, Rule::Limit { .. } | Rule::OverLimit { .. }) {
                        self.one_count_holds(item.at)?;
                    }
                    out.push(Descriptor {
                        entries: path.clone(),
                        at: item.at,
                        rule,
                        shadow,
                        name,
                        replaces,
                    });
                }
                None => {
                    if shadow {
                        let at = get(entries, "shadow_mode").map_or(item.at, |n| n.at);
                        self.note(
                            at,
                            "shadow_mode without a rate_limit has no effect, in envoyproxy/ratelimit as here",
                        );
                    }
                    if !has_children {
                        out.push(Descriptor {
                            entries: path.clone(),
                            at: item.at,
                            rule: Rule::Allow,
                            shadow: false,
                            name: None,
                            replaces: Vec::new(),
                        });
                    }
                }
            }
            if let Some(children) = children {
                self.descriptors(children, path, out)?;
            }
            path.pop();
            self.apart.pop();
        }
        Ok(())
    }

    /// With a control-plane algorithm, refuses the limited descriptor at `at` when an entry on its
    /// path counts each value apart (envoyproxy/ratelimit keeps a count per value there; such a
    /// bucket keeps one), naming that entry's place.
    fn one_count_holds(&self, at: Position) -> Result<(), ConfigError> {
        let Some(algorithm) = self.one_count else {
            return Ok(());
        };
        let Some((place, what)) = self.apart.iter().flatten().next() else {
            return Ok(());
        };
        let at = clamp(at, self.text);
        let of = if clamp(*place, self.text).line == at.line {
            String::new()
        } else {
            format!(" for the limited descriptor at line {}", at.line)
        };
        Err(self.error(
            *place,
            format!(
                "{what}, so envoyproxy/ratelimit counts each of its values apart{of}; --algorithm {algorithm} keeps one count per bucket: give each entry of a limited descriptor an exact value, or choose a counting algorithm (fixed-window, token-bucket, gcra, ...)"
            ),
        ))
    }

    /// A `rate_limit` block: what it answers, its name and what it replaces.
    #[allow(clippy::type_complexity)]
    fn rate_limit(
        &mut self,
        node: &Node,
    ) -> Result<(Rule, Option<String>, Vec<(String, Position)>), ConfigError> {
        let entries = self.mapping(
            node,
            "a rate_limit block (`unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`)",
        )?;
        self.known_keys(
            entries,
            &["unit", "requests_per_unit", "unlimited", "name", "replaces"],
            "a rate_limit block",
        )?;
        let name = match get(entries, "name") {
            None => None,
            Some(node) => Some(self.text_of(node, "name")?).filter(|n| !n.is_empty()),
        };
        let replaces = match get(entries, "replaces") {
            None => Vec::new(),
            Some(node) => self.replaces(node, name.as_deref())?,
        };
        let unit_node = get(entries, "unit");
        let count_node = get(entries, "requests_per_unit");
        if self.flag(entries, "unlimited")? {
            if let Some(unit) = unit_node {
                return Err(self.error(
                    unit.at,
                    "a unit with `unlimited: true`: envoyproxy/ratelimit refuses a unit on an unlimited limit; remove `unit`",
                ));
            }
            if let Some(count) = count_node {
                self.note(
                    count.at,
                    "requests_per_unit is not used with `unlimited: true`, in envoyproxy/ratelimit as here",
                );
            }
            return Ok((Rule::Unlimited, name, replaces));
        }
        let Some(unit_node) = unit_node else {
            return Err(self.error(
                node.at,
                "missing key `unit`; a rate_limit has a `unit` (second, minute, hour, day, week, month or year) and `requests_per_unit`, or is `unlimited: true`",
            ));
        };
        let unit_text = self.text_of(unit_node, "unit")?;
        let Some(unit) = Unit::parse(&unit_text) else {
            let hint = match did_you_mean(&unit_text, &UNITS) {
                Some(best) => format!("did you mean `{best}`?"),
                None => "envoyproxy/ratelimit's units are second, minute, hour, day, week, month and year".to_owned(),
            };
            return Err(self.error(unit_node.at, format!("unknown unit `{unit_text}`; {hint}")));
        };
        let Some(count_node) = count_node else {
            return Err(self.error(
                node.at,
                "missing key `requests_per_unit`; envoyproxy/ratelimit reads a missing one as 0, always over the limit: write `requests_per_unit: 0` if that is meant",
            ));
        };
        let count = self.count(count_node)?;
        let rule = match count {
            0 => Rule::OverLimit { unit },
            count => Rule::Limit { count, unit },
        };
        Ok((rule, name, replaces))
    }

    fn replaces(
        &mut self,
        node: &Node,
        own: Option<&str>,
    ) -> Result<Vec<(String, Position)>, ConfigError> {
        let items = match &node.value {
            Value::Null => return Ok(Vec::new()),
            Value::Seq(items) => items,
            _ => {
                return Err(self.error(
                    node.at,
                    format!(
                        "`replaces` is a list of names, like `replaces: [ {{name: specific_limit}} ]`, not {}",
                        node.kind()
                    ),
                ));
            }
        };
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            let entries = self.mapping(item, "a replaced limit (`name: ...`)")?;
            self.known_keys(entries, &["name"], "an item of `replaces`")?;
            let name = match get(entries, "name") {
                None => String::new(),
                Some(n) => self.text_of(n, "name")?,
            };
            let at = get(entries, "name").map_or(item.at, |n| n.at);
            if name.is_empty() {
                return Err(self.error(
                    at,
                    "an item of `replaces` without a name; envoyproxy/ratelimit refuses it too: name the rate_limit it replaces",
                ));
            }
            if Some(name.as_str()) == own {
                return Err(self.error(
                    at,
                    format!(
                        "this rate_limit is named `{name}` and replaces `{name}`; envoyproxy/ratelimit refuses a limit that replaces itself"
                    ),
                ));
            }
            names.push((name, at));
        }
        Ok(names)
    }

    /// Every replaced name must be some `rate_limit`'s name in the domain: envoyproxy/ratelimit
    /// would replace nothing, which is a typo more often than a plan.
    fn check_replaces(&self, domain: &str, descriptors: &[Descriptor]) -> Result<(), ConfigError> {
        for descriptor in descriptors {
            for (name, at) in &descriptor.replaces {
                if !descriptors.iter().any(|d| d.name.as_deref() == Some(name)) {
                    return Err(self.error(
                        *at,
                        format!(
                            "replaces `{name}`, which no rate_limit of domain `{domain}` is named (`rate_limit: {{name: {name}, ...}}`); it would replace nothing, so fix the name or remove it"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn mapping<'n>(&self, node: &'n Node, what: &str) -> Result<Entries<'n>, ConfigError> {
        match &node.value {
            Value::Map(entries) => Ok(entries),
            _ => Err(self.error(node.at, format!("expected {what}, found {}", node.kind()))),
        }
    }

    fn known_keys(
        &self,
        entries: Entries<'_>,
        known: &[&str],
        what: &str,
    ) -> Result<(), ConfigError> {
        for (key, _) in entries {
            let name = match &key.value {
                Value::Scalar { text, .. } => text.as_str(),
                Value::Null => "",
                _ => unreachable!("keys are scalars"),
            };
            if known.contains(&name) {
                continue;
            }
            let message = if let Some((_, elsewhere)) = ELSEWHERE.iter().find(|(k, _)| *k == name) {
                format!("`{name}` is no key of {what}: {elsewhere}")
            } else if let Some(best) = did_you_mean(name, known) {
                format!("unknown key `{name}`; did you mean `{best}`?")
            } else {
                format!(
                    "unknown key `{name}` in {what}; expected one of {}",
                    known
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Err(self.error(key.at, message));
        }
        Ok(())
    }

    /// A scalar as text, whatever YAML would resolve it to (Go's YAML reads `value: 500` into a
    /// string as `500`).
    fn text_of(&self, node: &Node, key: &str) -> Result<String, ConfigError> {
        match &node.value {
            Value::Scalar { text, .. } => Ok(text.clone()),
            Value::Null => Ok(String::new()),
            _ => Err(self.error(node.at, format!("`{key}` is text, not {}", node.kind()))),
        }
    }

    /// A boolean as Go's YAML (YAML 1.1) reads one; absent or empty is false.
    fn flag(&self, entries: Entries<'_>, key: &str) -> Result<bool, ConfigError> {
        let Some(node) = get(entries, key) else {
            return Ok(false);
        };
        match &node.value {
            Value::Null => Ok(false),
            Value::Scalar { text, plain: true } => match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "y"
                | "Y" => Ok(true),
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "n"
                | "N" => Ok(false),
                _ => Err(self.error(node.at, format!("`{key}` is true or false, not `{text}`"))),
            },
            _ => Err(self.error(
                node.at,
                format!(
                    "`{key}` is true or false (unquoted), not {}",
                    describe(node)
                ),
            )),
        }
    }

    /// `requests_per_unit`: a whole number from 0 to 4294967295 (a uint32 in envoyproxy/ratelimit
    /// and in Envoy's protocol).
    fn count(&self, node: &Node) -> Result<u32, ConfigError> {
        let text = match &node.value {
            Value::Scalar { text, plain: true } => text.as_str(),
            _ => {
                return Err(self.error(
                    node.at,
                    format!(
                        "`requests_per_unit` is a whole number (unquoted), not {}",
                        describe(node)
                    ),
                ));
            }
        };
        let digits = text.strip_prefix('+').unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            let why = if text.starts_with('-') {
                "a count of requests is 0 or more"
            } else {
                "write a whole number of requests, like 100"
            };
            return Err(self.error(node.at, format!("requests_per_unit `{text}`: {why}")));
        }
        digits.parse::<u32>().map_err(|_| {
            self.error(
                node.at,
                format!(
                    "requests_per_unit {text} is more than 4294967295, the most Envoy's protocol and envoyproxy/ratelimit carry"
                ),
            )
        })
    }
}

pub(super) fn describe(node: &Node) -> String {
    match &node.value {
        Value::Scalar { text, .. } => format!("\"{text}\""),
        _ => node.kind().to_owned(),
    }
}

pub(super) fn get<'n>(entries: Entries<'n>, key: &str) -> Option<&'n Node> {
    entries
        .iter()
        .find(|(k, _)| matches!(&k.value, Value::Scalar { text, .. } if text == key))
        .map(|(_, v)| v)
}

/// A name Spillway accepts for a service or bucket (letters, digits, `.`, `_`, `-`, starting
/// with a letter or digit), made from text that may hold anything.
pub(super) fn sanitize(text: &str, fallback: &str) -> String {
    let mut name = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            name.push(c);
        } else if !name.ends_with(['-', '_', '.']) {
            name.push('-');
        }
    }
    let start = name
        .find(|c: char| c.is_ascii_alphanumeric())
        .unwrap_or(name.len());
    // A wildcard's `*` would end the name in a dash.
    let name = name[start..].trim_end_matches('-');
    if name.is_empty() {
        fallback.to_owned()
    } else {
        name.to_owned()
    }
}

/// `name`, or `name-2`, `name-3`, ... for the first not `taken`.
pub(super) fn unique(name: String, taken: &[String]) -> String {
    if !taken.contains(&name) {
        return name;
    }
    (2..)
        .map(|n| format!("{name}-{n}"))
        .find(|candidate| !taken.contains(candidate))
        .expect("some suffix is free")
}
