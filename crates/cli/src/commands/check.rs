//! `spillway check` and `spillway schema`.

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use spillway_core::config;

/// Prints the compiled buckets and exits 0, or prints `FILE:LINE:COLUMN: what is wrong` (or the
/// unreadable path and the OS error) to stderr and exits 2, as for any bad configuration.
/// A file that loads may still get warnings on stderr (`FILE:LINE:COLUMN: warning: ...`, such as
/// an identity read from a header the client controls); they do not change the exit status.
pub fn check(path: &Path) -> ExitCode {
    match config::check_file(path) {
        Ok((config, warnings)) => {
            for warning in &warnings {
                eprintln!("{warning}");
            }
            print_out(&config::render_table(&config))
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::from(2)
        }
    }
}

/// Prints the configuration's JSON Schema, generated from the same types the loader reads.
pub fn schema() -> ExitCode {
    match serde_json::to_string_pretty(&config::json_schema()) {
        Ok(text) => print_out(&format!("{text}\n")),
        Err(err) => {
            eprintln!("spillway schema: {err}");
            ExitCode::from(1)
        }
    }
}

/// Writes to stdout; a reader that stopped early (`| head`) is not a failure.
fn print_out(text: &str) -> ExitCode {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("spillway: cannot write to stdout: {err}");
            ExitCode::from(1)
        }
    }
}
