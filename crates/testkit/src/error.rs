//! What can go wrong when starting or driving a private server.

use std::fmt;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

/// A failure of the harness. Each variant names what failed; a server that did not start
/// carries the tail of its log, which is usually where the real reason is.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A program the harness needs is not installed.
    #[error("`{program}` was not found (searched {searched}); scripts/test installs it")]
    NotFound {
        program: &'static str,
        searched: String,
    },
    /// A file-system or process call failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A server exited or never became ready.
    #[error("{what} did not start: {reason}\n--- last lines of its log ---\n{log_tail}")]
    Start {
        what: String,
        reason: String,
        log_tail: String,
    },
    /// A helper command (`initdb`, `createdb`, ...) failed.
    #[error("`{command}` failed ({status}):\n{output}")]
    Command {
        command: String,
        status: ExitStatus,
        output: String,
    },
    /// The sentinels give an answer the harness cannot use.
    #[error("the sentinels {0}")]
    Sentinels(String),
    /// A cluster could not be formed.
    #[error("redis cluster: {0}")]
    Cluster(String),
    /// Something the harness waits for (a failover, say) did not happen in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout { what: String, after: Duration },
}

// Tests report a failed start through `.expect()`, which prints `Debug`: the derived form
// would squeeze the log tail onto one line of escaped `\n`, so show the readable message.
impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The harness's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
