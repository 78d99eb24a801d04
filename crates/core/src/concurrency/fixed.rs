//! The fixed limit: a ceiling that never moves, the baseline the adaptive ones are measured
//! against.

use std::time::Duration;

use super::{ConcurrencyWindow, LimitAlgorithm};

/// Always the same limit, whatever the upstream does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    limit: u32,
}

impl Fixed {
    /// A limit of `limit` requests in flight (at least 1).
    pub fn new(limit: u32) -> Self {
        Fixed {
            limit: limit.max(1),
        }
    }
}

impl LimitAlgorithm for Fixed {
    fn limit(&self) -> u32 {
        self.limit
    }

    fn update(&mut self, _now: Duration, _window: &ConcurrencyWindow) -> u32 {
        self.limit
    }
}
