//! Where each key and value of a YAML document starts, by path, so checks made after
//! deserialization can point at the line and column they are about.
//!
//! Paths use the same spelling as `yaml_serde`'s error messages (`services.payments.buckets[1].name`),
//! which lets the loader recognise and strip that prefix. The walk also catches what serde cannot
//! place precisely: duplicate keys, and a second document in the file.

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Marker, Parser};

/// A place in the file; both numbers start at 1 and the column counts characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

impl Position {
    pub const START: Position = Position { line: 1, column: 1 };

    pub(crate) fn from_marker(marker: Marker) -> Self {
        Position {
            line: marker.line().max(1),
            column: marker.col() + 1,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// A problem found while walking the document, with its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub position: Position,
    pub message: String,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Where the key that holds the node starts; `None` for sequence items and the root.
    key: Option<Position>,
    value: Position,
}

/// The path -> position index of one document.
#[derive(Debug, Default)]
pub struct Positions {
    entries: HashMap<String, Entry>,
    has_root: bool,
}

impl Positions {
    /// Walks the whole document. Fails on a YAML syntax error, a duplicate key or a second
    /// document, each with the position of the offending token.
    pub fn index(text: &str) -> Result<Positions, Located> {
        let mut walker = Walker::default();
        let mut parser = Parser::new_from_str(text);
        while let Some(event) = parser.next_event() {
            let (event, span) = event.map_err(|e| Located {
                position: Position::from_marker(*e.marker()),
                message: format!("invalid YAML: {}", e.info()),
            })?;
            walker.on_event(event, Position::from_marker(span.start))?;
        }
        Ok(walker.positions)
    }

    /// Whether the document holds anything at all (an empty file or only comments does not).
    pub fn has_root(&self) -> bool {
        self.has_root
    }

    pub fn contains(&self, path: &str) -> bool {
        self.entries.contains_key(path)
    }

    /// Where the value at `path` starts, or the nearest ancestor's when the path is not in the
    /// document (a default, or a key brought in by a YAML merge).
    pub fn value(&self, path: &str) -> Position {
        self.lookup(path, |entry| Some(entry.value))
    }

    /// Where the key of `path` starts (for "this key should not be here"); falls back like
    /// [`Positions::value`].
    pub fn key(&self, path: &str) -> Position {
        self.lookup(path, |entry| entry.key.or(Some(entry.value)))
    }

    fn lookup(&self, path: &str, pick: impl Fn(&Entry) -> Option<Position>) -> Position {
        let mut path = path;
        loop {
            if let Some(position) = self.entries.get(path).and_then(&pick) {
                return position;
            }
            match parent(path) {
                Some(p) => path = p,
                None => return Position::START,
            }
        }
    }
}

/// `a.b[2].c` -> `a.b[2]` -> `a.b` -> `a` -> `` (the root).
fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    Some(&path[..cut])
}

/// The path of a child, spelled as `yaml_serde` spells it.
pub fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

pub fn item(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

enum Frame {
    Map {
        path: String,
        /// The key read and waiting for its value.
        pending: Option<(String, Position)>,
        seen: HashMap<String, Position>,
        /// This mapping is itself a key (`? {a: 1}: x`), which we only need to skip.
        is_key: bool,
    },
    Seq {
        path: String,
        next: usize,
        is_key: bool,
    },
}

#[derive(Default)]
struct Walker {
    positions: Positions,
    stack: Vec<Frame>,
    documents: usize,
}

/// What the next node is, seen from its parent.
enum Role {
    Key,
    Value { path: String, key: Option<Position> },
}

impl Walker {
    fn on_event(&mut self, event: Event<'_>, at: Position) -> Result<(), Located> {
        match event {
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(Located {
                        position: at,
                        message: "a configuration is one YAML document; remove this second one"
                            .to_owned(),
                    });
                }
            }
            Event::Scalar(text, ..) => match self.role(at) {
                Role::Key => self.set_pending(text.into_owned(), at)?,
                Role::Value { path, key } => self.record(path, key, at),
            },
            Event::Alias(_) => match self.role(at) {
                Role::Key => self.set_pending("*alias".to_owned(), at)?,
                Role::Value { path, key } => self.record(path, key, at),
            },
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let is_map = matches!(event, Event::MappingStart(..));
                let (path, is_key) = match self.role(at) {
                    Role::Key => (String::new(), true),
                    Role::Value { path, key } => {
                        self.record(path.clone(), key, at);
                        (path, false)
                    }
                };
                self.stack.push(if is_map {
                    Frame::Map {
                        path,
                        pending: None,
                        seen: HashMap::new(),
                        is_key,
                    }
                } else {
                    Frame::Seq {
                        path,
                        next: 0,
                        is_key,
                    }
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let was_key = match self.stack.pop() {
                    Some(Frame::Map { is_key, .. } | Frame::Seq { is_key, .. }) => is_key,
                    None => false,
                };
                if was_key {
                    // A complex key is never one of ours; serde reports it with its own message.
                    self.set_pending(format!("<complex key at {at}>"), at)?;
                }
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {}
        }
        Ok(())
    }

    /// Decides whether a node starting now is a key or a value, and consumes the slot.
    fn role(&mut self, _at: Position) -> Role {
        match self.stack.last_mut() {
            None => Role::Value {
                path: String::new(),
                key: None,
            },
            Some(Frame::Map { path, pending, .. }) => match pending.take() {
                None => Role::Key,
                Some((key, key_at)) => Role::Value {
                    path: child(path, &key),
                    key: Some(key_at),
                },
            },
            Some(Frame::Seq { path, next, .. }) => {
                let index = *next;
                *next += 1;
                Role::Value {
                    path: item(path, index),
                    key: None,
                }
            }
        }
    }

    fn set_pending(&mut self, key: String, at: Position) -> Result<(), Located> {
        if let Some(Frame::Map { pending, seen, .. }) = self.stack.last_mut() {
            if let Some(first) = seen.get(&key) {
                return Err(Located {
                    position: at,
                    message: format!(
                        "duplicate key `{key}` (first at line {}); keep one of them",
                        first.line
                    ),
                });
            }
            seen.insert(key.clone(), at);
            *pending = Some((key, at));
        }
        Ok(())
    }

    fn record(&mut self, path: String, key: Option<Position>, value: Position) {
        if path.is_empty() {
            self.positions.has_root = true;
        }
        self.positions
            .entries
            .entry(path)
            .or_insert(Entry { key, value });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
version: 1
services:
  payments:
    buckets:
      - name: a
        limit: 5/s
      - { name: b, limit: 7/s }
";

    #[test]
    fn keys_and_values_are_indexed_by_path() {
        let p = Positions::index(DOC).unwrap();
        assert_eq!(
            p.value("version"),
            Position {
                line: 1,
                column: 10
            }
        );
        assert_eq!(p.key("services.payments"), Position { line: 3, column: 3 });
        assert_eq!(
            p.value("services.payments.buckets[0].limit"),
            Position {
                line: 6,
                column: 16
            }
        );
        assert_eq!(
            p.key("services.payments.buckets[1].limit"),
            Position {
                line: 7,
                column: 20
            }
        );
    }

    #[test]
    fn a_missing_path_falls_back_to_its_nearest_ancestor() {
        let p = Positions::index(DOC).unwrap();
        assert_eq!(
            p.value("services.payments.buckets[1].store"),
            p.value("services.payments.buckets[1]")
        );
        assert_eq!(p.value("redis.url"), Position::START);
    }

    #[test]
    fn duplicate_keys_point_at_the_second_one() {
        let err = Positions::index("version: 1\nredis: {}\nversion: 2\n").unwrap_err();
        assert_eq!(err.position, Position { line: 3, column: 1 });
        assert!(err.message.contains("first at line 1"), "{}", err.message);
    }

    #[test]
    fn syntax_errors_and_second_documents_are_located() {
        let err = Positions::index("a: [1, 2\n").unwrap_err();
        assert!(err.message.starts_with("invalid YAML"), "{}", err.message);
        let err = Positions::index("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(err.position.line, 2);
    }
}
