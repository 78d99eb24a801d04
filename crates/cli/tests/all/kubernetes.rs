//! The Kubernetes manifests in `deploy/kubernetes/` (docs/kubernetes.md): every file passes PyPI's
//! `kubernetes-validate --strict` against a current Kubernetes version, and every `spillway`
//! subcommand and `--flag` in their containers' `args` exists in that subcommand's `--help`, so a
//! renamed flag breaks this test rather than a deploy.
//!
//! The validator comes from the virtual environment that scripts/test makes (`SPILLWAY_PYTHON`);
//! without it that part is skipped with a message, unless `SPILLWAY_REQUIRE_PROMTOOL` (the CI
//! marker scripts/test sets) is set, when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

const MANIFESTS: &str = "deploy/kubernetes";
/// The Kubernetes version whose schemas the manifests must satisfy: native sidecars
/// (`restartPolicy: Always` on an initContainer) and the `sleep` preStop action need 1.30+.
const KUBERNETES_VERSION: &str = "1.31.0";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The manifests, sorted by name.
fn manifests() -> Vec<PathBuf> {
    let dir = root().join(MANIFESTS);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "too few manifests in {MANIFESTS}: {files:?}"
    );
    files
}

#[test]
fn manifests_pass_kubernetes_validate_strict() {
    let required = std::env::var_os("SPILLWAY_REQUIRE_PROMTOOL").is_some();
    let Some(python) = std::env::var_os("SPILLWAY_PYTHON") else {
        assert!(
            !required,
            "SPILLWAY_REQUIRE_PROMTOOL is set but SPILLWAY_PYTHON is not: scripts/test makes the \
             virtual environment with kubernetes-validate"
        );
        eprintln!(
            "skipped: SPILLWAY_PYTHON is unset (scripts/test makes a venv with kubernetes-validate)"
        );
        return;
    };
    let validator = Path::new(&python).with_file_name("kubernetes-validate");
    if !validator.exists() {
        assert!(
            !required,
            "{} is missing: pip install kubernetes-validate into the venv of SPILLWAY_PYTHON",
            validator.display()
        );
        eprintln!("skipped: {} is missing", validator.display());
        return;
    }
    let out = Command::new(&validator)
        .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
        .args(manifests())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", validator.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubernetes-validate --strict failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Every manifest was read and at least one resource of each passed.
    for file in manifests() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(&name) && l.contains("passed")),
            "kubernetes-validate reported nothing passed for {name}:\n{stdout}\n{stderr}"
        );
    }
}

/// One container's `args:` list: where it is and its items, quotes removed.
struct Args {
    origin: String,
    items: Vec<String>,
}

/// The `args:` block lists of a manifest (`args:` alone on its line, then `- item` lines
/// indented deeper), the only form the manifests use.
fn args_lists(file: &str, text: &str) -> Vec<Args> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        if line.trim() != "args:" {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let mut items = Vec::new();
        for next in &lines[n + 1..] {
            let trimmed = next.trim_start();
            let next_indent = next.len() - trimmed.len();
            if next_indent < indent || (next_indent == indent && !trimmed.starts_with("- ")) {
                break;
            }
            let item = trimmed
                .strip_prefix("- ")
                .unwrap_or_else(|| panic!("{file}:{}: an args item must be `- VALUE`", n + 1))
                .trim();
            items.push(item.trim_matches('"').trim_matches('\'').to_owned());
        }
        out.push(Args {
            origin: format!("{file}:{}", n + 1),
            items,
        });
    }
    out
}

fn help(subcommand: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_spillway"))
        .args(subcommand)
        .arg("--help")
        .output()
        .expect("running spillway --help");
    assert!(
        out.status.success(),
        "`spillway {} --help` failed: the subcommand does not exist\n{}",
        subcommand.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("help is UTF-8")
}

/// Whether `flag` (`--name`) is an option in a `--help` text: followed by a space, `=`, `,`
/// or the line's end, so `--tls` does not match `--tls-cert`.
fn help_has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let before = help[..at].chars().next_back();
        let after = help[at + flag.len()..].chars().next();
        matches!(before, None | Some(' ' | '[' | '<' | '|' | '\n'))
            && matches!(after, None | Some(' ' | '=' | ',' | '\n' | '>' | ']'))
    })
}

#[test]
fn every_subcommand_and_flag_in_the_manifests_exists() {
    let mut checked = 0;
    for file in manifests() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&file).expect("reading a manifest");
        for args in args_lists(&name, &text) {
            let origin = &args.origin;
            let subcommand: Vec<String> = args
                .items
                .iter()
                .take_while(|item| !item.starts_with('-'))
                .cloned()
                .collect();
            assert!(
                !subcommand.is_empty(),
                "{origin}: args must start with a spillway subcommand"
            );
            let help = help(&subcommand);
            for item in &args.items[subcommand.len()..] {
                if item.starts_with("--") {
                    let flag = item.split('=').next().unwrap();
                    assert!(
                        help_has_flag(&help, flag),
                        "{origin}: `spillway {} --help` has no {flag}",
                        subcommand.join(" ")
                    );
                } else {
                    assert!(
                        !item.starts_with('-'),
                        "{origin}: short flag {item}: write the long form"
                    );
                }
            }
            checked += 1;
        }
    }
    // The rules service, the controller, the aggregator and the proxy sidecar.
    assert!(
        checked >= 4,
        "only {checked} containers with args found under {MANIFESTS}"
    );
}

#[test]
fn a_renamed_flag_is_caught() {
    let help = help(&["aggregator".to_owned()]);
    assert!(help_has_flag(&help, "--tls-cert"));
    assert!(help_has_flag(&help, "--drain-timeout"));
    assert!(!help_has_flag(&help, "--tls"));
    assert!(!help_has_flag(&help, "--drain"));
    assert!(!help_has_flag(&help, "--upstream"));
    let lists = args_lists(
        "x.yaml",
        "      args:\n        - proxy\n        - \"--listen\"\n      env:\n",
    );
    assert_eq!(lists.len(), 1);
    assert_eq!(lists[0].items, ["proxy", "--listen"]);
}

/// The control plane's manifests run no single point of failure: two controllers under the
/// lease with a disruption budget that keeps one, two aggregators of the zone, and a sidecar
/// that names both aggregators.
#[test]
fn the_controller_and_the_zones_aggregator_run_in_pairs() {
    let read = |name: &str| {
        std::fs::read_to_string(root().join(MANIFESTS).join(name))
            .unwrap_or_else(|e| panic!("reading {name}: {e}"))
    };
    let controller = read("30-controller.yaml");
    assert!(controller.contains("replicas: 2"), "two controllers");
    assert!(
        controller.contains("- --lease-store\n            - $(DATABASE_URL)"),
        "the controllers hold the lease in the rules service's database"
    );
    assert!(controller.contains("kind: PodDisruptionBudget"));
    assert!(controller.contains("minAvailable: 1"));
    let aggregator = read("40-aggregator-eu-west-1a.yaml");
    assert!(aggregator.contains("replicas: 2"), "two aggregators");
    assert_eq!(
        aggregator.matches("- --controller").count(),
        2,
        "each aggregator names both controllers"
    );
    let sidecar = read("50-app-with-sidecar.yaml");
    assert_eq!(
        sidecar.matches("- --aggregator").count(),
        2,
        "the sidecar names both aggregators of its zone"
    );
}
