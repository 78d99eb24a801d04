//! A decision is a value: allow, drop (with bucket and retry-after) or shadow-drop.
//!
//! Algorithms answer with a [`Verdict`] about their own state; the caller, which knows the bucket
//! and its mode, turns it into a [`Decision`]. Being limited is a value, never an error.

use std::time::Duration;

/// The retry-after of a request that can never be admitted, because its cost is larger than the
/// algorithm could ever hold (for example a cost of 200 against a bucket of 100 tokens).
pub const NEVER: Duration = Duration::MAX;

/// A bucket of the compiled rule set: its position in the sequence given to
/// [`Matcher::compile`](crate::matcher::Matcher::compile). Small and `Copy` so the matcher and a
/// decision carry it freely; ordered as the positions are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketId(pub u32);

impl BucketId {
    /// The position, to index the buckets in the order they were compiled.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Whether a bucket denies or only counts what it would have denied.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Drop what the algorithm denies.
    #[default]
    Enforce,
    /// Let everything through, but count what would have been dropped ("virtual drops").
    Shadow,
}

/// What one algorithm says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The request fits; the algorithm has already charged its cost.
    Allow,
    /// The request does not fit and nothing was charged. The same request sent `retry_after`
    /// later is admitted if nothing else arrives in between; [`NEVER`] if it can never fit.
    Deny { retry_after: Duration },
}

impl Verdict {
    /// Whether the request was admitted.
    pub fn is_allow(self) -> bool {
        matches!(self, Verdict::Allow)
    }

    /// Turns the verdict into the decision of `bucket` in `mode`.
    pub fn into_decision(self, bucket: BucketId, mode: Mode) -> Decision {
        match (self, mode) {
            (Verdict::Allow, _) => Decision::Allow,
            (Verdict::Deny { retry_after }, Mode::Enforce) => Decision::Drop {
                bucket,
                retry_after,
            },
            (Verdict::Deny { retry_after }, Mode::Shadow) => Decision::ShadowDrop {
                bucket,
                retry_after,
            },
        }
    }
}

/// What happens to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Forward it.
    Allow,
    /// Refuse it (429 or RESOURCE_EXHAUSTED) because of `bucket`.
    Drop {
        bucket: BucketId,
        retry_after: Duration,
    },
    /// Forward it, but count it as a virtual drop of `bucket` (shadow mode).
    ShadowDrop {
        bucket: BucketId,
        retry_after: Duration,
    },
}

impl Decision {
    /// Whether the request goes to the upstream (allowed or shadow-dropped).
    pub fn forwards(self) -> bool {
        !matches!(self, Decision::Drop { .. })
    }

    /// The bucket that dropped or would have dropped the request.
    pub fn bucket(self) -> Option<BucketId> {
        match self {
            Decision::Allow => None,
            Decision::Drop { bucket, .. } | Decision::ShadowDrop { bucket, .. } => Some(bucket),
        }
    }

    /// Combines the decisions of two buckets that match one request: a drop wins over a shadow
    /// drop, which wins over an allow; between two of the same kind the longer retry-after wins,
    /// since the request can only pass once every bucket would admit it.
    pub fn combine(self, other: Decision) -> Decision {
        fn rank(d: Decision) -> (u8, Duration) {
            match d {
                Decision::Allow => (0, Duration::ZERO),
                Decision::ShadowDrop { retry_after, .. } => (1, retry_after),
                Decision::Drop { retry_after, .. } => (2, retry_after),
            }
        }
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_maps_to_decision_by_mode() {
        let deny = Verdict::Deny {
            retry_after: Duration::from_millis(250),
        };
        let b = BucketId(7);
        assert_eq!(
            Verdict::Allow.into_decision(b, Mode::Enforce),
            Decision::Allow
        );
        assert_eq!(
            deny.into_decision(b, Mode::Enforce),
            Decision::Drop {
                bucket: b,
                retry_after: Duration::from_millis(250)
            }
        );
        let shadow = deny.into_decision(b, Mode::Shadow);
        assert!(shadow.forwards());
        assert_eq!(shadow.bucket(), Some(b));
    }

    #[test]
    fn combine_prefers_drop_then_longer_retry() {
        let drop = |ms, id| Decision::Drop {
            bucket: BucketId(id),
            retry_after: Duration::from_millis(ms),
        };
        let shadow = Decision::ShadowDrop {
            bucket: BucketId(3),
            retry_after: Duration::from_secs(9),
        };
        assert_eq!(Decision::Allow.combine(shadow), shadow);
        assert_eq!(shadow.combine(drop(10, 1)), drop(10, 1));
        assert_eq!(drop(10, 1).combine(drop(30, 2)), drop(30, 2));
        assert_eq!(drop(30, 2).combine(Decision::Allow), drop(30, 2));
    }
}
