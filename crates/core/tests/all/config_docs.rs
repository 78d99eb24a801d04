//! The examples of `docs/configuration.md` are run: every ```yaml block that is a whole
//! configuration (it starts with `version:`) must load.

use std::path::Path;

use spillway_core::config;

/// The ```yaml blocks of a Markdown text, with the line each starts on.
fn yaml_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (index, line) in markdown.lines().enumerate() {
        match &mut current {
            None if line.trim_start().starts_with("```yaml") => {
                current = Some((index + 2, String::new()));
            }
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(current.take()),
            Some((_, text)) => {
                text.push_str(line);
                text.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn every_whole_configuration_in_the_docs_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let markdown = std::fs::read_to_string(&path).expect("docs/configuration.md exists");
    let whole: Vec<(usize, String)> = yaml_blocks(&markdown)
        .into_iter()
        .filter(|(_, text)| text.starts_with("version:"))
        .collect();
    assert!(
        whole.len() >= 5,
        "only {} whole configurations",
        whole.len()
    );
    for (line, text) in whole {
        let name = format!("docs/configuration.md (block at line {line})");
        if let Err(err) = config::load_str(&text, &name) {
            panic!("{err}\n{text}");
        }
    }
}

#[test]
fn block_extraction_finds_yaml_blocks_only() {
    let markdown = "text\n```yaml\nversion: 1\n```\n```\nnot yaml\n```\n```yaml\na: 1\n```\n";
    let blocks = yaml_blocks(markdown);
    assert_eq!(
        blocks,
        vec![(3, "version: 1\n".to_owned()), (9, "a: 1\n".to_owned())]
    );
}
