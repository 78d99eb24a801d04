//! envoyproxy/ratelimit's YAML configuration files as one Spillway configuration: each
//! file's `domain` becomes a service, and each of its descriptors that envoyproxy/ratelimit
//! answers in a way of its own becomes a descriptor bucket (`match: { descriptor: ... }`).
//!
//! The format is the one its README ("The configuration format") and its loader define: a
//! `domain`, and `descriptors` nested to any depth, each with a `key`, an optional `value` (a
//! trailing `*` makes it a prefix), an optional `rate_limit` (`unit`, `requests_per_unit`,
//! `unlimited`, `name`, `replaces`), `shadow_mode` and `detailed_metric`. A descriptor maps to
//! the bucket whose entries are the keys and values on its path from the domain:
//!
//! | envoyproxy/ratelimit | the bucket |
//! | --- | --- |
//! | `rate_limit: {unit: minute, requests_per_unit: 5}` | `limit: 5/min` (week, month and year are 7, 30 and 365 days, as it counts them) |
//! | `requests_per_unit: 0` | `answer: over-limit` |
//! | `unlimited: true` | `answer: unlimited` |
//! | neither `rate_limit` nor `descriptors` | `answer: allow` (known, never limited) |
//! | `rate_limit` absent, `descriptors` present | no bucket: a level of the path only |
//! | `shadow_mode: true` | `mode: shadow` |
//! | `replaces: [{name: n}]` | `replaces:` every bucket of the domain whose `rate_limit` is named `n` |
//!
//! Buckets take the algorithm and store of [`Options`] (envoyproxy/ratelimit's own model by
//! default: a fixed window on the Unix epoch, counted in Redis). Buckets are named as
//! envoyproxy/ratelimit names its statistics (`key_value.key2`), or by their `rate_limit`'s
//! `name`. What Spillway cannot express, and what envoyproxy/ratelimit itself refuses, is an
//! error at its line and column; what is dropped on purpose (`detailed_metric`) is a [`Note`].
//!
//! ```
//! use spillway_core::import::envoy_ratelimit::{File, Options, convert};
//!
//! let file = File { name: "rl.yaml", text: b"domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: second, requests_per_unit: 10 }\n" };
//! let converted = convert(&[file], &Options::default()).unwrap();
//! assert!(converted.yaml.contains("- name: remote_address"));
//! assert!(converted.yaml.contains("limit: 10/s"));
//! let config = spillway_core::config::load_str(&converted.yaml, "converted.yaml").unwrap();
//! assert_eq!(config.services[0].name, "edge");
//!
//! let file = File { name: "rl.yaml", text: b"domain: edge\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n" };
//! let err = convert(&[file], &Options::default()).unwrap_err();
//! assert!(err.to_string().starts_with("rl.yaml:4:25: unknown unit `fortnight`"), "{err}");
//! ```

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::{self, Write as _};

use super::yaml::{self, Node, Value};
use crate::config::model::{Algorithm, StateStore};
use crate::config::validate::is_name;
use crate::config::{ConfigError, Position, clamp, did_you_mean, utf8};

/// One envoyproxy/ratelimit file: its name as errors and comments should call it, and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct File<'a> {
    pub name: &'a str,
    pub text: &'a [u8],
}

/// How the buckets count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub algorithm: Algorithm,
    pub store: StateStore,
}

impl Default for Options {
    /// envoyproxy/ratelimit's semantics: a fixed window per unit, aligned on the Unix epoch,
    /// counted in Redis.
    fn default() -> Self {
        Options {
            algorithm: Algorithm::FixedWindow,
            store: StateStore::Redis,
        }
    }
}

/// The Spillway configuration, and what the conversion left out on purpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converted {
    /// A whole configuration file (YAML), ready for `spillway check`.
    pub yaml: String,
    pub notes: Vec<Note>,
}

/// Something in an input file that the converted configuration does not carry, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub file: String,
    pub position: Position,
    pub message: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: note: {}", self.file, self.position, self.message)
    }
}

/// The units envoyproxy/ratelimit reads (any case, as it upper-cases them for Envoy's enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

const UNITS: [&str; 7] = ["second", "minute", "hour", "day", "week", "month", "year"];

impl Unit {
    fn parse(text: &str) -> Option<Unit> {
        let unit = match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        };
        Some(unit)
    }

    /// `count` per unit as a Spillway limit: envoyproxy/ratelimit's month is 30 days and its
    /// year 365, as its window divider counts them.
    fn limit(self, count: u32) -> String {
        match self {
            Unit::Second => format!("{count}/s"),
            Unit::Minute => format!("{count}/min"),
            Unit::Hour => format!("{count}/h"),
            Unit::Day => format!("{count}/d"),
            Unit::Week => format!("{count} per 7d"),
            Unit::Month => format!("{count} per 30d"),
            Unit::Year => format!("{count} per 365d"),
        }
    }
}

/// What a descriptor answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Limit { count: u32, unit: Unit },
    OverLimit { unit: Unit },
    Unlimited,
    Allow,
}

/// A descriptor that becomes a bucket.
#[derive(Debug)]
struct Descriptor {
    /// (key, value) from the domain down; `None` is any value.
    entries: Vec<(String, Option<String>)>,
    /// Where its list item starts.
    at: Position,
    rule: Rule,
    shadow: bool,
    /// Its `rate_limit`'s `name`, if any.
    name: Option<String>,
    replaces: Vec<(String, Position)>,
}

#[derive(Debug)]
struct Domain {
    file: String,
    domain: String,
    at: Position,
    descriptors: Vec<Descriptor>,
}

/// Converts the files, in order, into one configuration. The first thing that cannot be
/// converted is the error, `FILE:LINE:COLUMN: what is wrong`.
pub fn convert(files: &[File<'_>], options: &Options) -> Result<Converted, ConfigError> {
    let mut notes = Vec::new();
    let mut domains: Vec<Domain> = Vec::new();
    for file in files {
        let text = utf8(file.text, file.name)?;
        let reader = Reader {
            file: file.name,
            text,
            notes: &mut notes,
            one_count: (options.store == StateStore::ControlPlane).then_some(options.algorithm),
            apart: Vec::new(),
        };
        let domain = reader.read()?;
        if let Some(first) = domains.iter().find(|d| d.domain == domain.domain) {
            return Err(invalid(
                file.name,
                text,
                domain.at,
                format!(
                    "domain `{}` is also the domain of {} (line {}); envoyproxy/ratelimit refuses two files of one domain (unless MERGE_DOMAIN_CONFIG), and so does the importer: put its descriptors in one file",
                    domain.domain, first.file, first.at.line
                ),
            ));
        }
        domains.push(domain);
    }
    let mut yaml = header(&domains, options);
    let mut services: Vec<String> = Vec::new();
    for domain in &domains {
        if domain.descriptors.is_empty() {
            notes.push(Note {
                file: domain.file.clone(),
                position: domain.at,
                message: format!(
                    "domain `{}` has no descriptors, so no bucket: its requests are answered OK, as envoyproxy/ratelimit answers them",
                    domain.domain
                ),
            });
            continue;
        }
        if services.is_empty() {
            yaml.push_str("services:\n");
        }
        let service = unique(sanitize(&domain.domain, "domain"), &services);
        write_service(&mut yaml, domain, &service, options);
        services.push(service);
    }
    if services.is_empty() {
        yaml.push_str("services: {}\n");
    }
    Ok(Converted { yaml, notes })
}

fn invalid(file: &str, text: &str, position: Position, message: String) -> ConfigError {
    ConfigError::Invalid {
        file: file.to_owned(),
        position: clamp(position, text),
        message,
    }
}

/// Reads one file's domain and descriptors.
struct Reader<'a> {
    file: &'a str,
    text: &'a str,
    notes: &'a mut Vec<Note>,
    /// The buckets keep one count each (a control-plane algorithm, `--algorithm drop-ratio`):
    /// a limited descriptor that counts each value of an entry apart is refused.
    one_count: Option<Algorithm>,
    /// For each level of the descriptor being read, where its entry counts each value apart (no
    /// value, or a prefix value) and its key; `None` for a level with one value.
    apart: Vec<Option<(Position, String)>>,
}

/// A mapping's entries by key.
type Entries<'n> = &'n [(Node, Node)];

/// Keys that belong at another level, and where.
const ELSEWHERE: &[(&str, &str)] = &[
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

    fn read(mut self) -> Result<Domain, ConfigError> {
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

fn describe(node: &Node) -> String {
    match &node.value {
        Value::Scalar { text, .. } => format!("\"{text}\""),
        _ => node.kind().to_owned(),
    }
}

fn get<'n>(entries: Entries<'n>, key: &str) -> Option<&'n Node> {
    entries
        .iter()
        .find(|(k, _)| matches!(&k.value, Value::Scalar { text, .. } if text == key))
        .map(|(_, v)| v)
}

/// A name Spillway accepts for a service or bucket (letters, digits, `.`, `_`, `-`, starting
/// with a letter or digit), made from text that may hold anything.
fn sanitize(text: &str, fallback: &str) -> String {
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
fn unique(name: String, taken: &[String]) -> String {
    if !taken.contains(&name) {
        return name;
    }
    (2..)
        .map(|n| format!("{name}-{n}"))
        .find(|candidate| !taken.contains(candidate))
        .expect("some suffix is free")
}

/// envoyproxy/ratelimit's name for a descriptor in its statistics: `key_value.key2`.
fn stat_key(entries: &[(String, Option<String>)]) -> String {
    entries
        .iter()
        .map(|(key, value)| match value {
            Some(value) => format!("{key}_{value}"),
            None => key.clone(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn header(domains: &[Domain], options: &Options) -> String {
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

fn write_service(yaml: &mut String, domain: &Domain, service: &str, options: &Options) {
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
fn scalar(text: &str) -> Cow<'_, str> {
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
fn comment(text: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_acceptable_and_unique() {
        assert_eq!(sanitize("remote_address", "x"), "remote_address");
        assert_eq!(sanitize("path_/healthz", "x"), "path_healthz");
        assert_eq!(sanitize("__a b", "x"), "a-b");
        assert_eq!(sanitize("***", "x"), "x");
        let taken = vec!["a".to_owned(), "a-2".to_owned()];
        assert_eq!(unique("a".to_owned(), &taken), "a-3");
        assert_eq!(unique("b".to_owned(), &taken), "b");
    }

    #[test]
    fn scalars_are_quoted_when_yaml_could_misread_them() {
        assert_eq!(scalar("remote_address"), "remote_address");
        assert_eq!(scalar("/healthz"), "/healthz");
        assert_eq!(scalar("50.0.0.5"), "\"50.0.0.5\"");
        assert_eq!(scalar("true"), "\"true\"");
        assert_eq!(scalar("sha*"), "\"sha*\"");
        assert_eq!(scalar("a\"b\\c\u{7}"), "\"a\\\"b\\\\c\\u0007\"");
        assert_eq!(scalar(""), "\"\"");
    }

    fn convert_one(text: &str) -> Result<Converted, ConfigError> {
        let file = File {
            name: "rl.yaml",
            text: text.as_bytes(),
        };
        convert(&[file], &Options::default())
    }

    #[test]
    fn a_replaced_name_replaces_every_limit_of_that_name() {
        let converted = convert_one(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: shared, unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {name: shared, unit: second, requests_per_unit: 2}\n  - key: c\n    rate_limit: {replaces: [{name: shared}], unit: second, requests_per_unit: 3}\n",
        )
        .unwrap();
        // The first `shared` keeps the name; the second is named by its key.
        assert!(
            converted.yaml.contains("- name: shared "),
            "{}",
            converted.yaml
        );
        assert!(converted.yaml.contains("- name: b "), "{}", converted.yaml);
        assert!(
            converted.yaml.contains("replaces: [ shared, b ]"),
            "{}",
            converted.yaml
        );
        crate::config::load_str(&converted.yaml, "out.yaml").unwrap();
    }

    #[test]
    fn a_name_spillway_cannot_take_gives_way_to_the_statistics_key() {
        let converted = convert_one(
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n    rate_limit: {name: \"my limit\", unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {replaces: [{name: my limit}], unit: second, requests_per_unit: 3}\n",
        )
        .unwrap();
        assert!(
            converted.yaml.contains("- name: a_x "),
            "{}",
            converted.yaml
        );
        assert!(
            converted.yaml.contains("replaces: [ a_x ]"),
            "{}",
            converted.yaml
        );
    }

    #[test]
    fn units_are_envoyproxy_ratelimits_periods() {
        assert_eq!(Unit::parse("SECOND"), Some(Unit::Second));
        assert_eq!(Unit::parse("Week"), Some(Unit::Week));
        assert_eq!(Unit::parse("unknown"), None);
        assert_eq!(Unit::Month.limit(3), "3 per 30d");
        assert_eq!(Unit::Year.limit(1), "1 per 365d");
    }
}
