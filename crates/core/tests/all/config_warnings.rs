//! The warnings of `spillway check` (issue 18, "Changed defaults"): a file that names a header as
//! the source of `procedure` or `caller` loads, with a warning that the client controls it unless
//! a trusted hop sets it; the defaults warn about nothing.

use spillway_core::config::{self, Source};

fn warnings(yaml: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spillway.yaml");
    std::fs::write(&path, yaml).unwrap();
    let (_, warnings) = config::check_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let prefix = format!("{}:", path.display());
    warnings
        .iter()
        .map(|w| w.to_string().strip_prefix(&prefix).unwrap().to_owned())
        .collect()
}

#[test]
fn procedure_defaults_to_the_path_and_xff_to_one_trusted_hop() {
    let config = config::load_str("version: 1\n", "t.yaml").unwrap();
    assert_eq!(config.identity.procedure.0, vec![Source::Path]);
    assert_eq!(config.identity.xff_trusted_hops, 1);
}

#[test]
fn the_defaults_warn_about_nothing() {
    assert!(warnings("version: 1\n").is_empty());
    assert!(
        warnings("version: 1\nidentity: { procedure: path, user: header:x-user }\n").is_empty()
    );
    assert!(
        warnings("version: 1\nidentity: { ip: header:x-forwarded-for, xff_trusted_hops: 2 }\n")
            .is_empty()
    );
}

#[test]
fn a_header_for_procedure_or_caller_is_named_as_client_controlled() {
    let found = warnings(
        "version: 1\nidentity:\n  procedure: header:rpc-procedure,path\n  caller: header:x-caller\n",
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].starts_with("3:14: warning: `procedure` reads header `rpc-procedure`, which the client controls unless a trusted hop sets it"), "{}", found[0]);
    assert!(found[1].starts_with("4:11: warning: `caller` reads header `x-caller`, which the client controls unless a trusted hop sets it"), "{}", found[1]);
}

#[test]
fn xff_trusted_hops_without_x_forwarded_for_has_no_effect() {
    let found = warnings("version: 1\nidentity: { xff_trusted_hops: 2 }\n");
    assert_eq!(found.len(), 1);
    assert!(
        found[0].contains("`ip` does not read (it reads `peer`)"),
        "{}",
        found[0]
    );
}

#[test]
fn a_token_budget_whose_estimate_is_more_than_its_bucket_holds_loads_with_a_warning() {
    let file = "version: 1\nservices:\n  llm:\n    buckets:\n      - name: tokens\n        limit: 1000/min\n        algorithm: gcra\n        cost: { response: \"json:usage.total_tokens\", request: 5000 }\n";
    let said = warnings(file);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("8:")
            && said[0].contains("estimate of 5000, more than it holds (1000)"),
        "{}",
        said[0]
    );
    // One that fits warns about nothing.
    assert!(warnings(&file.replace("5000", "1000")).is_empty());
}
