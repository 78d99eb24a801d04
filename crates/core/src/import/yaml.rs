//! A YAML document as a tree whose every node knows where it starts: what an importer reads, so
//! that whatever it refuses is named at its line and column.
//!
//! Syntax errors, duplicate keys and a second document are found by the configuration loader's
//! own walk ([`Positions::index`]), with its messages. What a foreign format's reader needs
//! beyond that is here: scalars as written (`value: 500` is the text `500`, as Go's YAML reads
//! it into a string), and a refusal of what this tree does not model (aliases, keys that are not
//! text, nesting deeper than [`MAX_DEPTH`]).

use saphyr_parser::{Event, Parser, ScalarStyle};

use crate::config::Position;
use crate::config::positions::{Located, Positions};

/// How deep mappings and lists may nest: far beyond any configuration, and shallow enough that
/// walking and dropping the tree recursively stays well inside a thread's stack.
pub(crate) const MAX_DEPTH: usize = 200;

/// One node and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub at: Position,
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// `~`, `null`, or nothing at all (`key:`).
    Null,
    /// Text after unquoting; `plain` when written without quotes or a tag, so that YAML's words
    /// (`true`, `12`) can be told from the text `"true"`.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Keys are scalars, in file order, each once.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// What the node is, in words, for "expected X, found Y".
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Null => "nothing",
            Value::Scalar { .. } => "a scalar",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

enum Frame {
    Seq(Position, Vec<Node>),
    Map(Position, Vec<(Node, Node)>, Option<Node>),
}

/// The document's root, or `None` for a file that holds nothing (or only comments).
pub(crate) fn parse(text: &str) -> Result<Option<Node>, Located> {
    // Syntax, duplicate keys and extra documents, in the loader's words.
    Positions::index(text)?;
    let mut stack: Vec<Frame> = Vec::new();
    let mut root = None;
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| Located {
            position: Position::from_marker(*e.marker()),
            message: format!("invalid YAML: {}", e.info()),
        })?;
        let at = Position::from_marker(span.start);
        let done = match event {
            Event::Scalar(text, style, _, tag) => {
                let plain = style == ScalarStyle::Plain && tag.is_none();
                let null = plain && matches!(&*text, "" | "~" | "null" | "Null" | "NULL");
                Node {
                    at,
                    value: if null {
                        Value::Null
                    } else {
                        Value::Scalar {
                            text: text.into_owned(),
                            plain,
                        }
                    },
                }
            }
            Event::Alias(_) => {
                return Err(Located {
                    position: at,
                    message: "aliases (`*name`) are not read here; write the value out in full"
                        .to_owned(),
                });
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                if let Some(Frame::Map(_, _, None)) = stack.last() {
                    return Err(Located {
                        position: at,
                        message: "a key must be text, not a list or a mapping".to_owned(),
                    });
                }
                if stack.len() >= MAX_DEPTH {
                    return Err(Located {
                        position: at,
                        message: format!(
                            "lists and mappings nest deeper than {MAX_DEPTH} levels here; no configuration needs that"
                        ),
                    });
                }
                stack.push(if matches!(event, Event::MappingStart(..)) {
                    Frame::Map(at, Vec::new(), None)
                } else {
                    Frame::Seq(at, Vec::new())
                });
                continue;
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq(at, items)) => Node {
                    at,
                    value: Value::Seq(items),
                },
                _ => unreachable!("the parser ends only the sequence it started"),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map(at, entries, _)) => Node {
                    at,
                    value: Value::Map(entries),
                },
                _ => unreachable!("the parser ends only the mapping it started"),
            },
            Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart(_)
            | Event::DocumentEnd
            | Event::Nothing => continue,
        };
        match stack.last_mut() {
            None => root = Some(done),
            Some(Frame::Seq(_, items)) => items.push(done),
            Some(Frame::Map(_, _, pending @ None)) => *pending = Some(done),
            Some(Frame::Map(_, entries, pending)) => {
                let key = pending.take().expect("matched Some above");
                entries.push((key, done));
            }
        }
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(text: &str, plain: bool) -> Value {
        Value::Scalar {
            text: text.to_owned(),
            plain,
        }
    }

    #[test]
    fn nodes_know_where_they_start_and_how_they_were_written() {
        let root = parse("a: 500\nb: '500'\nc:\nd: [x, ~]\n").unwrap().unwrap();
        let Value::Map(entries) = root.value else {
            panic!("{root:?}")
        };
        assert_eq!(entries[0].1.value, scalar("500", true));
        assert_eq!(entries[0].1.at, Position { line: 1, column: 4 });
        assert_eq!(entries[1].1.value, scalar("500", false));
        assert_eq!(entries[2].1.value, Value::Null);
        let Value::Seq(items) = &entries[3].1.value else {
            panic!("{entries:?}")
        };
        assert_eq!(items[0].value, scalar("x", true));
        assert_eq!(items[1].value, Value::Null);
        assert_eq!(items[1].at, Position { line: 4, column: 8 });
    }

    #[test]
    fn an_empty_document_has_no_root() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
    }

    #[test]
    fn what_the_tree_does_not_model_is_refused_where_it_is() {
        let err = parse("a: &x 1\nb: *x\n").unwrap_err();
        assert_eq!(err.position, Position { line: 2, column: 4 });
        let err = parse("? [a]\n: 1\n").unwrap_err();
        assert!(err.message.contains("key must be text"), "{}", err.message);
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let err = parse(&deep).unwrap_err();
        assert!(err.message.contains("nest deeper"), "{}", err.message);
        let err = parse("a: 1\na: 2\n").unwrap_err();
        assert!(err.message.contains("duplicate key"), "{}", err.message);
    }
}
