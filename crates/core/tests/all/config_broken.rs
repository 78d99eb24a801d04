//! Every file in `tests/broken/` is rejected with exactly the message in its `.expected` file:
//! `FILE:LINE:COLUMN: what is wrong`, the file named as the test passes it.
//!
//! After an intended change of wording, `SPILLWAY_BLESS=1 cargo test --test config_broken`
//! rewrites the `.expected` files; review the diff before committing it.

use std::fs;
use std::path::{Path, PathBuf};

use spillway_core::config;

fn broken_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broken"))
            .expect("tests/broken exists")
            .map(|entry| entry.expect("readable entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
            .collect();
    files.sort();
    files
}

#[test]
fn every_broken_file_is_rejected_with_its_expected_message() {
    let files = broken_files();
    assert!(files.len() >= 15, "only {} broken files", files.len());
    let bless = std::env::var_os("SPILLWAY_BLESS").is_some();
    let mut mismatches = Vec::new();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let relative = format!("tests/broken/{name}");
        let text = fs::read(&path).unwrap();
        let got = match config::load_bytes(&text, &relative) {
            Ok(_) => format!("(accepted) {relative}"),
            Err(err) => err.to_string(),
        };
        let expected_path = path.with_extension("expected");
        if bless {
            fs::write(&expected_path, format!("{got}\n")).unwrap();
            continue;
        }
        let expected = fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} is missing", expected_path.display()));
        if got != expected.trim_end() {
            mismatches.push(format!(
                "{name}\n  expected: {}\n       got: {got}",
                expected.trim_end()
            ));
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// The same files through `load_file`, which names the file as its path is written.
#[test]
fn load_file_names_the_path_as_given() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broken/limit-zero.yaml");
    let err = config::load_file(&path).unwrap_err();
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{}:6:16: ", path.display())),
        "{message}"
    );
    assert_eq!(err.message(), "limit \"0/s\": the count must be at least 1");
}

#[test]
fn an_unreadable_file_names_its_path_and_the_os_error() {
    let err = config::load_file(Path::new("tests/broken/no-such-file.yaml")).unwrap_err();
    assert!(err.position().is_none());
    let message = err.to_string();
    assert!(
        message.starts_with("tests/broken/no-such-file.yaml: cannot read the file: "),
        "{message}"
    );
    assert!(message.contains("No such file"), "{message}");
}
