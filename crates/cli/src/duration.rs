//! The parser of every duration flag, shared by the argument tree and the commands that
//! define their own arguments.

use std::time::Duration;

/// `30d`, `12h`, `15m`: the durations of the configuration file, for every duration flag.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    spillway_core::limit::parse_duration(text).map_err(|e| e.to_string())
}
