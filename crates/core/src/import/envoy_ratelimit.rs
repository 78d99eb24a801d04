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

mod read;
mod write;
use self::read::{Reader, invalid, sanitize, unique};
use self::write::{header, write_service};

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

#[cfg(test)]
mod tests {
    use super::write::scalar;
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
