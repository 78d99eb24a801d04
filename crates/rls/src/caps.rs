//! The caps on the bucket ids RLQS hosts hold: per stream, per host, and for the whole
//! aggregator, so that an Envoy whose matcher makes one bucket id per user cannot grow an
//! aggregator's memory without bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bucket ids one stream may hold: an Envoy whose matcher makes one per user id would grow an
/// aggregator's memory without bound. A host and the whole aggregator have their own caps
/// ([`Caps`]).
pub const MAX_BUCKETS: usize = 10_000;

/// The longest bucket id, its keys and values together: 1 KiB (a user id, a path and a method
/// fit many times over), so that the caps on bucket ids bound memory too.
pub const MAX_BUCKET_ID_BYTES: usize = 1024;

/// The caps on bucket ids: per stream ([`MAX_BUCKETS`] at most), per host, and for every host of
/// the aggregator together (`held`, shared by all of them).
#[derive(Debug, Clone)]
pub struct Caps {
    pub per_stream: usize,
    pub per_host: usize,
    pub total: usize,
    /// Bucket ids held now by every host of the aggregator.
    pub held: Arc<AtomicUsize>,
}

impl Caps {
    /// `per_host` and `total` bucket ids; a stream holds at most [`MAX_BUCKETS`] of them.
    pub fn new(per_host: usize, total: usize) -> Self {
        Self {
            per_stream: MAX_BUCKETS.min(per_host),
            per_host,
            total,
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Takes one bucket id from the aggregator's total, if one is left.
    pub(crate) fn take(&self) -> bool {
        self.held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < self.total).then_some(held + 1)
            })
            .is_ok()
    }

    pub(crate) fn give(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::Relaxed);
    }
}

impl Default for Caps {
    /// 10,000 bucket ids per host, 50,000 per aggregator.
    fn default() -> Self {
        Self::new(MAX_BUCKETS, 50_000)
    }
}

/// Which cap a new bucket id met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaScope {
    Stream,
    Host,
    Aggregator,
}

impl std::fmt::Display for QuotaScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuotaScope::Stream => "the stream",
            QuotaScope::Host => "the stream's host (its connection, or its identity with TLS)",
            QuotaScope::Aggregator => "the aggregator (every host together)",
        })
    }
}
