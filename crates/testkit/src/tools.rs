//! Programs a test runs but does not start as a server of its own (promtool, prometheus): found
//! on `PATH`, or skipped with a message, unless the environment says their absence is a failure.

use std::path::PathBuf;

/// `name` on `PATH`. When it is missing: `None` with a line on stderr saying the test skips,
/// or a panic when the environment variable `require` is set (scripts/test sets it, so CI never
/// skips). `package` names where the program comes from, for the message.
pub fn on_path(name: &str, package: &str, require: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os(require).is_none(),
            "{require} is set but {name} is not on PATH: install {package}"
        );
        eprintln!(
            "SKIPPED: {name} is not on PATH ({package}); set {require}=1 to make its absence a failure"
        );
    }
    found
}
