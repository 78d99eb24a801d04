//! `spillway check` and `spillway schema` as a user runs them: the built binary, real files.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn spillway(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spillway"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the spillway binary runs")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn files_in(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

#[test]
fn check_accepts_every_example_and_prints_its_buckets() {
    let examples = files_in(&workspace().join("examples"), "yaml");
    assert!(examples.len() >= 10, "only {} examples", examples.len());
    for path in examples {
        let relative = format!("examples/{}", path.file_name().unwrap().to_string_lossy());
        let out = spillway(&workspace(), &["check", "-c", &relative]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{relative}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.starts_with("SERVICE"), "{relative}: {stdout}");
        // Every bucket named in the file is a row of the table.
        let text = fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            if let Some(name) = line.trim().strip_prefix("- name: ") {
                assert!(
                    stdout
                        .lines()
                        .any(|row| row.split_whitespace().nth(1) == Some(name)),
                    "{relative}: bucket {name} missing from\n{stdout}"
                );
            }
        }
    }
}

#[test]
fn check_rejects_every_broken_file_with_exit_2_and_its_exact_message() {
    // The expected messages name the files relative to crates/core, as the core test does.
    let core = workspace().join("crates/core");
    let broken = files_in(&core.join("tests/broken"), "yaml");
    assert!(broken.len() >= 15);
    for path in broken {
        let relative = format!(
            "tests/broken/{}",
            path.file_name().unwrap().to_string_lossy()
        );
        let out = spillway(&core, &["check", "-c", &relative]);
        let expected = fs::read_to_string(path.with_extension("expected")).unwrap();
        assert_eq!(out.status.code(), Some(2), "{relative}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), expected, "{relative}");
        assert!(out.stdout.is_empty(), "{relative}");
    }
}

#[test]
fn check_on_a_missing_file_exits_2_with_the_path_and_the_os_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = spillway(dir.path(), &["check", "-c", "nowhere.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("nowhere.yaml: cannot read the file: No such file or directory"),
        "{stderr}"
    );
}

#[test]
fn schema_prints_a_json_schema_of_the_configuration() {
    let out = spillway(&workspace(), &["schema"]);
    assert_eq!(out.status.code(), Some(0));
    let schema: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(schema["title"], "Spillway configuration");
    assert_eq!(schema["required"], serde_json::json!(["version"]));
    assert_eq!(schema["additionalProperties"], false);
    let bucket = &schema["$defs"]["BucketFile"];
    assert_eq!(bucket["additionalProperties"], false);
    assert_eq!(schema["$defs"]["Limit"]["type"], "string");
}
