//! The loader's error: `FILE:LINE:COLUMN: what is wrong`, and the rewording of serde's messages
//! into that form ("unknown key `limt`; did you mean `limit`?").

use std::io;
use std::path::PathBuf;

use super::positions::{Position, Positions};

/// Why a configuration was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("{}: cannot read the file: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The file was read and is wrong at this place.
    #[error("{file}:{}:{}: {message}", position.line, position.column)]
    Invalid {
        file: String,
        position: Position,
        message: String,
    },
}

impl ConfigError {
    /// Where in the file, for every error but [`ConfigError::Read`].
    pub fn position(&self) -> Option<Position> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Invalid { position, .. } => Some(*position),
        }
    }

    /// What is wrong, without the file and position.
    pub fn message(&self) -> String {
        match self {
            ConfigError::Read { source, .. } => format!("cannot read the file: {source}"),
            ConfigError::Invalid { message, .. } => message.clone(),
        }
    }
}

/// Places a `yaml_serde` error and rewrites its message in the loader's words.
pub(crate) fn from_yaml(err: &yaml_serde::Error, positions: &Positions) -> (Position, String) {
    let mut message = err.to_string();
    let position = match err.location() {
        Some(location) => {
            // The message ends with the position we print in front instead.
            let suffix = format!(" at line {} column {}", location.line(), location.column());
            if let Some(at) = message.find(&suffix) {
                message.replace_range(at..at + suffix.len(), "");
            }
            Position {
                line: location.line(),
                column: location.column(),
            }
        }
        None => Position::START,
    };
    let (path, rest) = split_path(&message, positions);
    let rest = reword(rest, path);
    (position, rest)
}

/// `yaml_serde` prefixes messages with the path of the value (`services.x.buckets[0]: ...`);
/// the position says where already, but the path's last key names the thing in the message.
fn split_path<'m>(message: &'m str, positions: &Positions) -> (&'m str, &'m str) {
    let mut from = 0;
    while let Some(found) = message[from..].find(": ") {
        let at = from + found;
        let head = &message[..at];
        if head == "." || head.ends_with('?') || positions.contains(head) {
            return (head, &message[at + 2..]);
        }
        from = at + 2;
    }
    ("", message)
}

/// The last key of a path: `services.x.buckets[0].algorithm` -> `algorithm`.
fn last_key(path: &str) -> &str {
    let tail = path.rsplit('.').next().unwrap_or(path);
    tail.split('[').next().unwrap_or(tail)
}

fn reword(message: &str, path: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (name, expected) = split_unknown(rest);
        return unknown("key", name, &expected);
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (name, expected) = split_unknown(rest);
        let noun = match last_key(path) {
            "" | "." => "value",
            key => key,
        };
        return unknown(noun, name, &expected);
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        let name = rest.trim_matches('`');
        return match name {
            "version" => "missing key `version`; a configuration starts with `version: 1`".into(),
            "limit" => "missing key `limit`; every bucket needs one, like `limit: 100/s`".into(),
            "name" => "missing key `name`; every bucket needs a name unique in its service".into(),
            _ => format!("missing key `{name}`"),
        };
    }
    let mut message = message.to_owned();
    // serde's "invalid type: X, expected Y" ends with what was expected, in Rust's words.
    for (serde_words, ours) in [
        (
            "expected a nonzero u64",
            "expected a whole number of at least 1",
        ),
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected a sequence", "expected a list"),
        ("expected a map", "expected a mapping"),
        ("expected a string", "expected text"),
    ] {
        if let Some(head) = message.strip_suffix(serde_words) {
            message = format!("{head}{ours}");
        }
    }
    if let Some(at) = message.find("expected struct ") {
        let end = message[at + 16..]
            .find(|c: char| !c.is_alphanumeric())
            .map_or(message.len(), |e| at + 16 + e);
        message.replace_range(at..end, "expected a mapping");
    }
    if let Some(at) = message.find("expected enum ") {
        let end = message[at + 14..]
            .find(|c: char| !c.is_alphanumeric())
            .map_or(message.len(), |e| at + 14 + e);
        message.replace_range(at..end, "expected one of its names");
    }
    message
}

/// Splits "`limt`, expected one of `name`, `limit`" into the name and the expected names.
fn split_unknown(rest: &str) -> (&str, Vec<&str>) {
    let (name, expected) = rest.split_once(", ").unwrap_or((rest, ""));
    let names = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|n| !n.is_empty())
        .collect();
    (name.trim_matches('`'), names)
}

fn unknown(noun: &str, name: &str, expected: &[&str]) -> String {
    match did_you_mean(name, expected) {
        Some(best) => format!("unknown {noun} `{name}`; did you mean `{best}`?"),
        None if expected.is_empty() => format!("unknown {noun} `{name}`; nothing is expected here"),
        None => format!(
            "unknown {noun} `{name}`; expected one of {}",
            expected
                .iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The closest candidate, if it is close enough to be what was meant: `limt` -> `limit`,
/// `token_bucket` -> `token-bucket`, `algo` -> `algorithm`.
pub(crate) fn did_you_mean<'a>(name: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let folded = name.to_ascii_lowercase().replace('_', "-");
    candidates
        .iter()
        .map(|c| {
            let c_folded = c.replace('_', "-");
            let score = strsim::jaro_winkler(&folded, &c_folded);
            let close = strsim::damerau_levenshtein(&folded, &c_folded) <= 2 || score >= 0.88;
            (c, score, close)
        })
        .filter(|(.., close)| *close)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, ..)| *c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_names_are_suggested_and_far_ones_are_not() {
        let keys = ["name", "match", "limit", "algorithm", "store"];
        assert_eq!(did_you_mean("limt", &keys), Some("limit"));
        assert_eq!(did_you_mean("algo", &keys), Some("algorithm"));
        assert_eq!(did_you_mean("Store", &keys), Some("store"));
        assert_eq!(did_you_mean("priority", &keys), None);
        assert_eq!(
            did_you_mean("token_bucket", &["drop-ratio", "token-bucket", "gcra"]),
            Some("token-bucket")
        );
    }

    #[test]
    fn serde_messages_are_reworded() {
        assert_eq!(
            reword("unknown field `limt`, expected one of `name`, `limit`", "a"),
            "unknown key `limt`; did you mean `limit`?"
        );
        assert_eq!(
            reword("unknown field `zzz`, expected `url` or `cluster`", "redis"),
            "unknown key `zzz`; expected one of `url`, `cluster`"
        );
        assert_eq!(
            reword(
                "unknown variant `fast`, expected `enforce` or `shadow`",
                "services.a.buckets[0].mode"
            ),
            "unknown mode `fast`; expected one of `enforce`, `shadow`"
        );
        assert_eq!(
            reword("invalid type: string \"x\", expected u32", "version"),
            "invalid type: string \"x\", expected a whole number"
        );
    }
}
