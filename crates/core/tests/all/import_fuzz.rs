//! Fuzzing the envoyproxy/ratelimit importer: whatever the input, `convert` returns (never
//! panics); every rejection names a line and column inside the input; and every configuration it
//! writes loads. Inputs are arbitrary text and YAML assembled from envoyproxy/ratelimit's own
//! vocabulary, so that most cases get past the YAML parser into the conversion.

use proptest::prelude::*;
use spillway_core::config::{self, ConfigError};
use spillway_core::import::envoy_ratelimit::{File, Options, convert};

#[derive(Debug, Clone)]
enum Node {
    Scalar(String),
    Map(Vec<(String, Node)>),
    Seq(Vec<Node>),
}

const KEYS: &[&str] = &[
    "domain",
    "descriptors",
    "key",
    "value",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "shadow_mode",
    "detailed_metric",
    "unti",
];

const VALUES: &[&str] = &[
    "rl",
    "foo",
    "a_b",
    "remote_address",
    "50.0.0.5",
    "second",
    "MINUTE",
    "hour",
    "day",
    "week",
    "month",
    "year",
    "fortnight",
    "0",
    "1",
    "10",
    "-1",
    "4294967296",
    "1.5",
    "true",
    "false",
    "yes",
    "\"true\"",
    "ba*",
    "\"*\"",
    "a*b",
    "x**",
    "k*",
    "~",
    "\"\"",
    "[]",
    "{}",
    "&a x",
    "*a",
    "!!str 5",
    "'quoted: yes'",
    "é",
    "\"\\u0007\"",
];

fn scalar() -> impl Strategy<Value = Node> {
    prop_oneof![
        6 => prop::sample::select(VALUES).prop_map(|v| Node::Scalar(v.to_owned())),
        1 => "[ -~]{0,10}".prop_map(Node::Scalar),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-z_]{1,8}",
    ]
}

fn node() -> impl Strategy<Value = Node> {
    scalar().prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            3 => prop::collection::vec((key(), inner.clone()), 0..5).prop_map(Node::Map),
            1 => prop::collection::vec(inner, 0..4).prop_map(Node::Seq),
        ]
    })
}

/// A descriptor that is often valid: a key, maybe a value, a rate limit or children.
fn descriptor() -> impl Strategy<Value = Node> {
    let leaf = (
        prop::sample::select(&["foo", "bar", "remote_address", "a_b", ""][..]),
        prop::option::of(prop::sample::select(
            &["b", "banned", "sha*", "a*b", "\"\""][..],
        )),
        prop::option::of((
            prop::sample::select(&["second", "minute", "day", "year", "fortnight"][..]),
            prop::sample::select(&["0", "3", "-1", "x"][..]),
            prop::bool::weighted(0.1),
            prop::option::of(prop::sample::select(&["n1", "n2", "bad name"][..])),
            prop::option::of(prop::sample::select(&["n1", "n2", "n3"][..])),
        )),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(key, value, rate_limit, shadow)| {
            let mut entries = vec![("key".to_owned(), Node::Scalar(key.to_owned()))];
            if let Some(value) = value {
                entries.push(("value".to_owned(), Node::Scalar(value.to_owned())));
            }
            if let Some((unit, count, unlimited, name, replaces)) = rate_limit {
                let mut limit = Vec::new();
                if unlimited {
                    limit.push(("unlimited".to_owned(), Node::Scalar("true".to_owned())));
                } else {
                    limit.push(("unit".to_owned(), Node::Scalar(unit.to_owned())));
                    limit.push((
                        "requests_per_unit".to_owned(),
                        Node::Scalar(count.to_owned()),
                    ));
                }
                if let Some(name) = name {
                    limit.push(("name".to_owned(), Node::Scalar(name.to_owned())));
                }
                if let Some(replaced) = replaces {
                    let item =
                        Node::Map(vec![("name".to_owned(), Node::Scalar(replaced.to_owned()))]);
                    limit.push(("replaces".to_owned(), Node::Seq(vec![item])));
                }
                entries.push(("rate_limit".to_owned(), Node::Map(limit)));
            }
            if shadow {
                entries.push(("shadow_mode".to_owned(), Node::Scalar("true".to_owned())));
            }
            entries
        });
    leaf.prop_recursive(3, 24, 4, |inner| {
        (
            inner.clone(),
            prop::collection::vec(inner.prop_map(Node::Map), 0..3),
        )
            .prop_map(|(mut entries, children)| {
                if !children.is_empty() {
                    entries.push(("descriptors".to_owned(), Node::Seq(children)));
                }
                entries
            })
    })
    .prop_map(Node::Map)
}

/// A whole file shaped like envoyproxy/ratelimit's.
fn file() -> impl Strategy<Value = Node> {
    (
        prop::sample::select(&["rl", "edge", "", "a b"][..]),
        prop::collection::vec(descriptor(), 0..4),
        prop::collection::vec((key(), node()), 0..2),
    )
        .prop_map(|(domain, descriptors, extra)| {
            let mut root = vec![
                ("domain".to_owned(), Node::Scalar(domain.to_owned())),
                ("descriptors".to_owned(), Node::Seq(descriptors)),
            ];
            root.extend(extra);
            Node::Map(root)
        })
}

fn render(node: &Node, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match node {
        Node::Scalar(s) => out.push_str(&format!("{pad}{s}\n")),
        Node::Map(entries) if entries.is_empty() => out.push_str(&format!("{pad}{{}}\n")),
        Node::Seq(items) if items.is_empty() => out.push_str(&format!("{pad}[]\n")),
        Node::Map(entries) => {
            for (k, v) in entries {
                match v {
                    Node::Scalar(s) => out.push_str(&format!("{pad}{k}: {s}\n")),
                    _ => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        render(v, indent + 2, out);
                    }
                }
            }
        }
        Node::Seq(items) => {
            for item in items {
                out.push_str(&format!("{pad}-\n"));
                render(item, indent + 2, out);
            }
        }
    }
}

/// Lines as the widest definition of a line break counts them, columns as the narrowest.
fn assert_inside(text: &str, err: &ConfigError) -> Result<(), TestCaseError> {
    let position = err
        .position()
        .ok_or_else(|| TestCaseError::fail(format!("no position: {err}")))?;
    let breaks = text
        .replace("\r\n", "\n")
        .chars()
        .filter(|c| matches!(c, '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}'))
        .count();
    let longest = text
        .split('\n')
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0);
    prop_assert!(position.line >= 1 && position.line <= breaks + 1, "{err}");
    prop_assert!(
        position.column >= 1 && position.column <= longest + 1,
        "{err}"
    );
    prop_assert!(
        err.to_string().starts_with(&format!(
            "fuzz.yaml:{}:{}: ",
            position.line, position.column
        )),
        "{err}"
    );
    Ok(())
}

/// Converts `text`; an error must be placed inside it, and a conversion must load.
fn check(text: &str) -> Result<bool, TestCaseError> {
    let file = File {
        name: "fuzz.yaml",
        text: text.as_bytes(),
    };
    match convert(&[file], &Options::default()) {
        Ok(converted) => {
            if let Err(err) = config::load_str(&converted.yaml, "converted.yaml") {
                return Err(TestCaseError::fail(format!(
                    "{err}\ninput:\n{text}\noutput:\n{}",
                    converted.yaml
                )));
            }
            Ok(true)
        }
        Err(err) => assert_inside(text, &err).map(|()| false),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics_the_converter(text in any::<String>()) {
        check(&text)?;
    }

    #[test]
    fn yaml_from_the_vocabulary_never_panics_the_converter(tree in node()) {
        let mut text = String::new();
        render(&tree, 0, &mut text);
        check(&text)?;
    }

    #[test]
    fn ratelimit_shaped_files_convert_to_loading_configurations_or_are_placed(tree in file()) {
        let mut text = String::new();
        render(&tree, 0, &mut text);
        check(&text)?;
    }
}

/// The generator is only useful if a fair share of its files convert: count them.
#[test]
fn ratelimit_shaped_files_often_convert() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = file();
    let mut converted = 0;
    for _ in 0..300 {
        let tree = strategy.new_tree(&mut runner).unwrap().current();
        let mut text = String::new();
        render(&tree, 0, &mut text);
        if check(&text).unwrap() {
            converted += 1;
        }
    }
    assert!(converted >= 30, "only {converted} of 300 files converted");
}
