//! The file descriptors a proxy may hold and the connections they allow: the soft
//! `RLIMIT_NOFILE` raised to the hard limit at start ([`raise_fd_limit`]), the default
//! `--max-connections` derived from it ([`default_max_connections`]), and the count of open
//! downstream connections the acceptor keeps under the cap ([`Connections`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use tokio::time::Instant;

/// File descriptors kept for everything but downstream connections and their upstream ones:
/// listeners, runtimes, the HTTP/2 upstream pool, Redis, the control link, files and logs. Half
/// the limit when that is smaller, so a tiny limit still leaves room for connections.
pub const FD_RESERVE: u64 = 256;

/// The most connections derived when the descriptor limit is unlimited or huge.
const MAX_DERIVED: u64 = 1 << 20;

/// How often refused connections are logged at most.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// The file descriptor limit in force after [`raise_fd_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdLimit {
    /// The soft limit now in force (`None`: unlimited).
    pub soft: Option<u64>,
    /// The hard limit (`None`: unlimited).
    pub hard: Option<u64>,
    /// The soft limit before, when it was raised.
    pub raised_from: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as nginx's `worker_rlimit_nofile` and Go's
/// runtime do: distributions default the soft limit to 1024, which a busy sidecar (one descriptor
/// per downstream connection, another for its upstream connection) reaches quickly. A hard limit
/// of "unlimited" is left alone, since Linux refuses it as a soft limit. Returns the limit in
/// force; on failure the limit stays as it was and the error says why.
pub fn raise_fd_limit() -> std::io::Result<FdLimit> {
    let before = getrlimit(Resource::Nofile);
    let mut limit = FdLimit {
        soft: before.current,
        hard: before.maximum,
        raised_from: None,
    };
    if let (Some(soft), Some(hard)) = (before.current, before.maximum)
        && soft < hard
    {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        )?;
        limit.soft = Some(hard);
        limit.raised_from = Some(soft);
    }
    Ok(limit)
}

/// `soft 1048576 (raised from 1024), hard 1048576`.
impl std::fmt::Display for FdLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let limit = |n: Option<u64>| n.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        write!(f, "soft {}", limit(self.soft))?;
        if let Some(before) = self.raised_from {
            write!(f, " (raised from {before})")?;
        }
        write!(f, ", hard {}", limit(self.hard))
    }
}

/// The soft `RLIMIT_NOFILE` in force (`None`: unlimited).
pub fn fd_soft_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

/// The default `--max-connections` for a soft descriptor limit of `soft` (`None`: unlimited):
/// `(soft - min(FD_RESERVE, soft / 2)) / 2`, at least 1, since each downstream HTTP/1.1
/// connection may hold an upstream connection of its own. 1024 gives 384, 65,536 gives 32,640,
/// 1,048,576 gives 524,160; 64 gives 16; unlimited gives 1,048,576.
pub fn default_max_connections(soft: Option<u64>) -> usize {
    let derived = soft.map_or(MAX_DERIVED, |soft| {
        let usable = soft - FD_RESERVE.min(soft / 2);
        (usable / 2).clamp(1, MAX_DERIVED)
    });
    usize::try_from(derived).unwrap_or(usize::MAX)
}

/// The open downstream connections and the cap on them, shared by the acceptor, which counts a
/// connection in ([`Connections::admit`]), and the connection's task, whose [`Open`] guard counts
/// it out when it ends.
#[derive(Debug)]
pub(crate) struct Connections {
    max: usize,
    open: AtomicUsize,
    refused: AtomicU64,
}

impl Connections {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            open: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// The cap.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A connection just accepted: counted in, or `None` (and counted as refused) when the cap
    /// is reached. Only the acceptor admits, so the check and the count cannot race.
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Open> {
        if self.open.load(Ordering::Acquire) >= self.max {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.open.fetch_add(1, Ordering::AcqRel);
        Some(Open(self.clone()))
    }

    /// Connections open now (`spillway_connections`).
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections refused since start (`spillway_connections_refused_total`).
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// One open downstream connection, counted out when dropped (with its connection's task).
#[derive(Debug)]
pub(crate) struct Open(Arc<Connections>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The acceptor's log of refused connections: the first refusal at once, then at most one line
/// per [`REFUSAL_LOG_EVERY`] with how many were refused since the last line.
#[derive(Debug, Default)]
pub(crate) struct RefusalLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl RefusalLog {
    pub(crate) fn refused(&mut self, connections: &Connections) {
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < REFUSAL_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            refused = self.unlogged,
            max_connections = connections.max(),
            "{} connection{} refused (closed at once) since the last such line: {} connections open, the --max-connections cap",
            self.unlogged,
            if self.unlogged == 1 { "" } else { "s" },
            connections.open(),
        );
        self.last = Some(now);
        self.unlogged = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_keeps_a_reserve_and_halves_the_rest() {
        assert_eq!(default_max_connections(Some(1024)), 384);
        assert_eq!(default_max_connections(Some(65_536)), 32_640);
        assert_eq!(default_max_connections(Some(1_048_576)), 524_160);
        assert_eq!(default_max_connections(Some(64)), 16);
        assert_eq!(default_max_connections(Some(1)), 1);
        assert_eq!(default_max_connections(None), 1 << 20);
    }

    #[test]
    fn connections_are_counted_in_and_out_and_refused_at_the_cap() {
        let connections = Connections::new(2);
        let a = connections.admit().unwrap();
        let _b = connections.admit().unwrap();
        assert!(connections.admit().is_none());
        assert_eq!((connections.open(), connections.refused()), (2, 1));
        drop(a);
        assert!(connections.admit().is_some());
    }
}
