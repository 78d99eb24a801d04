//! The request examples of docs/rules-service.md, run in order against a fresh SQLite store, so
//! the documentation cannot drift from what the service accepts.

use crate::common::{Db, start};

/// Every ```http block of the page: `METHOD PATH`, a blank line, the body.
fn examples(page: &str) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    let mut rest = page;
    while let Some(start) = rest.find("```http\n") {
        let block = &rest[start + "```http\n".len()..];
        let end = block.find("\n```").expect("every block is closed");
        let (head, body) = block[..end]
            .split_once("\n\n")
            .expect("a request line, a blank line and a body");
        let (method, path) = head.split_once(' ').expect("METHOD PATH");
        found.push((method.to_owned(), path.to_owned(), body.to_owned()));
        rest = &block[end..];
    }
    found
}

#[test]
fn every_request_in_the_rules_service_page_succeeds_in_order() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/rules-service.md"
    ))
    .expect("docs/rules-service.md");
    let requests = examples(&page);
    assert!(requests.len() >= 4, "the page shows its examples");
    let service = start(Db::sqlite());
    let client = service.client(&service.admin);
    for (method, path, body) in &requests {
        assert_eq!(method, "POST", "the page only shows POSTs");
        let answer = client.post(path, body).expect("the service answers");
        assert!(
            (200..300).contains(&answer.status),
            "{method} {path} answered {}: {}",
            answer.status,
            answer.body
        );
    }
    let rules = service.rules();
    let names: Vec<&str> = rules.iter().filter_map(|r| r["name"].as_str()).collect();
    assert_eq!(
        names.len(),
        3,
        "three rules created; the dry run stored nothing: {names:?}"
    );
    for name in ["gateway-orders", "per-user-search", "incident-4711"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
}
