//! Fuzzing the configuration loader: whatever the input, `load_*` returns (never panics), and
//! every rejection names a line and column inside the input.
//!
//! Three generators: arbitrary bytes, arbitrary text, and YAML assembled from the configuration's
//! own vocabulary (its keys and typical values, mixed with random ones) so that most cases get
//! past the YAML parser and exercise deserialization and validation.

use proptest::prelude::*;
use spillway_core::config::{self, ConfigError};

/// Lines as the widest definition of a line break counts them (YAML 1.1 also breaks on NEL, LS
/// and PS), and the longest line as the narrowest definition measures it.
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
    prop_assert!(
        position.line >= 1 && position.line <= breaks + 1,
        "line {} outside {} lines: {err}",
        position.line,
        breaks + 1
    );
    prop_assert!(
        position.column >= 1 && position.column <= longest + 1,
        "column {} beyond the longest line ({longest}): {err}",
        position.column
    );
    let shown = err.to_string();
    prop_assert!(
        shown.starts_with(&format!(
            "fuzz.yaml:{}:{}: ",
            position.line, position.column
        )),
        "{shown}"
    );
    Ok(())
}

#[derive(Debug, Clone)]
enum Node {
    Scalar(String),
    Map(Vec<(String, Node)>),
    Seq(Vec<Node>),
}

const KEYS: &[&str] = &[
    "version",
    "identity",
    "control",
    "services",
    "redis",
    "payments",
    "search",
    "buckets",
    "name",
    "match",
    "limit",
    "burst",
    "burst_window",
    "scope",
    "mode",
    "algorithm",
    "store",
    "cost",
    "on_store_failure",
    "batch",
    "caller",
    "procedure",
    "user",
    "org",
    "api_key",
    "ip",
    "header",
    "default",
    "url",
    "sentinel",
    "master",
    "nodes",
    "cluster",
    "timeout",
    "report_interval",
    "instruction_ttl",
    "limt",
    "<<",
];

const VALUES: &[&str] = &[
    "1",
    "0",
    "-1",
    "2",
    "18446744073709551616",
    "1.5",
    "5000/s",
    "0/s",
    "-3/min",
    "100 per 30s",
    "7 per 0ms",
    "3/h",
    "9/d",
    "1/m",
    "1s",
    "250ms",
    "0s",
    "20s",
    "30s",
    "1.5s",
    "drop-ratio",
    "adaptive-token-bucket",
    "token-bucket",
    "leaky-bucket",
    "fixed-window",
    "sliding-window-log",
    "sliding-window-counter",
    "gcra",
    "token_bucket",
    "redis",
    "local",
    "control-plane",
    "open",
    "closed",
    "global",
    "region",
    "zone",
    "shadow",
    "enforce",
    "\"*\"",
    "'*'",
    "/search",
    "api-gateway",
    "header:x-user-id",
    "header:rpc-procedure,path",
    "peer",
    "path",
    "cookie:x",
    "redis://127.0.0.1:6379",
    "127.0.0.1:6379",
    "~",
    "null",
    "true",
    "\"\"",
    "[]",
    "{}",
    "&a x",
    "*a",
    "!!str 5",
    "|\n  block",
    "'quoted: yes'",
    "é",
];

fn scalar() -> impl Strategy<Value = Node> {
    prop_oneof![
        6 => prop::sample::select(VALUES).prop_map(|v| Node::Scalar(v.to_owned())),
        1 => "[ -~]{0,12}".prop_map(Node::Scalar),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-z_]{1,8}",
    ]
}

fn node() -> impl Strategy<Value = Node> {
    scalar().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            3 => prop::collection::vec((key(), inner.clone()), 0..6).prop_map(Node::Map),
            1 => prop::collection::vec(inner, 0..4).prop_map(Node::Seq),
        ]
    })
}

/// A bucket that is often valid, or nearly: plausible keys and values plus random entries.
fn bucket() -> impl Strategy<Value = Node> {
    let pick = |keys: &'static [&'static str]| {
        prop::sample::select(keys).prop_map(|v| Node::Scalar(v.to_owned()))
    };
    (
        prop::sample::select(&["a", "b", "c", "a b"][..]),
        pick(&["5000/s", "100 per 60s", "0/s", "7/min", "5"]),
        prop::option::of(pick(&[
            "drop-ratio",
            "token-bucket",
            "gcra",
            "sliding-window-log",
            "adaptive-token-bucket",
            "magic",
        ])),
        prop::option::of(pick(&["local", "redis", "control-plane"])),
        prop::option::of(pick(&["3", "0", "x"])),
        prop::collection::vec(
            (
                prop::sample::select(&["caller", "procedure", "user", "org", "ip", "x"][..]),
                pick(&["\"*\"", "/search", "api-gateway", "\"\"", "bot-*"]),
            ),
            0..3,
        ),
        prop::collection::vec((key(), node()), 0..2),
    )
        .prop_map(|(name, limit, algorithm, store, burst, matches, extra)| {
            let mut entries = vec![
                ("name".to_owned(), Node::Scalar(name.to_owned())),
                ("limit".to_owned(), limit),
            ];
            for (k, v) in [("algorithm", algorithm), ("store", store), ("burst", burst)] {
                if let Some(v) = v {
                    entries.push((k.to_owned(), v));
                }
            }
            if !matches.is_empty() {
                let m = matches
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect();
                entries.push(("match".to_owned(), Node::Map(m)));
            }
            entries.extend(extra);
            Node::Map(entries)
        })
}

/// A whole configuration shaped like the real thing.
fn config() -> impl Strategy<Value = Node> {
    (
        prop::collection::vec(bucket(), 0..4),
        prop::option::of(node()),
        prop::bool::ANY,
        prop::collection::vec((key(), node()), 0..2),
    )
        .prop_map(|(buckets, redis, with_version, extra)| {
            let mut root = Vec::new();
            if with_version {
                root.push(("version".to_owned(), Node::Scalar("1".to_owned())));
            }
            let service = Node::Map(vec![("buckets".to_owned(), Node::Seq(buckets))]);
            root.push((
                "services".to_owned(),
                Node::Map(vec![("payments".to_owned(), service)]),
            ));
            if let Some(redis) = redis {
                root.push(("redis".to_owned(), redis));
            }
            root.extend(extra);
            Node::Map(root)
        })
}

fn render_block(node: &Node, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match node {
        Node::Scalar(s) => {
            out.push_str(&pad);
            out.push_str(s);
            out.push('\n');
        }
        Node::Map(entries) if entries.is_empty() => out.push_str(&format!("{pad}{{}}\n")),
        Node::Seq(items) if items.is_empty() => out.push_str(&format!("{pad}[]\n")),
        Node::Map(entries) => {
            for (k, v) in entries {
                match v {
                    Node::Scalar(s) => out.push_str(&format!("{pad}{k}: {s}\n")),
                    _ => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        render_block(v, indent + 2, out);
                    }
                }
            }
        }
        Node::Seq(items) => {
            for item in items {
                out.push_str(&format!("{pad}-\n"));
                render_block(item, indent + 2, out);
            }
        }
    }
}

fn render_flow(node: &Node) -> String {
    match node {
        Node::Scalar(s) => s.clone(),
        Node::Map(entries) => {
            let inner: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{k}: {}", render_flow(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
        Node::Seq(items) => {
            let inner: Vec<String> = items.iter().map(render_flow).collect();
            format!("[{}]", inner.join(", "))
        }
    }
}

fn check_text(text: &str) -> Result<(), TestCaseError> {
    match config::load_str(text, "fuzz.yaml") {
        Ok(_) => Ok(()),
        Err(err) => assert_inside(text, &err),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_and_errors_are_placed(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(err) = config::load_bytes(&bytes, "fuzz.yaml") {
            assert_inside(&String::from_utf8_lossy(&bytes), &err)?;
        }
    }

    #[test]
    fn arbitrary_text_never_panics_and_errors_are_placed(text in any::<String>()) {
        check_text(&text)?;
    }

    #[test]
    fn yaml_from_the_vocabulary_never_panics_and_errors_are_placed(tree in node()) {
        let mut block = String::new();
        render_block(&tree, 0, &mut block);
        check_text(&block)?;
        check_text(&render_flow(&tree))?;
    }

    #[test]
    fn configuration_shaped_yaml_never_panics_and_errors_are_placed(tree in config()) {
        let mut block = String::new();
        render_block(&tree, 0, &mut block);
        check_text(&block)?;
        check_text(&render_flow(&tree))?;
    }
}

/// The generator is only useful if a fair share of its files pass every check: count them.
#[test]
fn configuration_shaped_yaml_is_often_valid() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = config();
    let mut accepted = 0;
    for _ in 0..300 {
        let tree = strategy.new_tree(&mut runner).unwrap().current();
        let mut text = String::new();
        render_block(&tree, 0, &mut text);
        if config::load_str(&text, "fuzz.yaml").is_ok() {
            accepted += 1;
        }
    }
    assert!(
        accepted >= 10,
        "only {accepted} of 300 generated files were valid"
    );
}
