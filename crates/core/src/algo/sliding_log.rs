//! Sliding-window log: the exact sliding window, one entry per admitted request.
//!
//! The only algorithm here that keeps a list, so it sits behind a mutex: it is the exact and the
//! expensive one. Memory is bounded by the limit, not by traffic: entries hold at least one unit
//! each and the log never holds more than `count` units, so at most `count` entries of 16 bytes
//! (a 10,000-unit daily quota is at most 160 KB; the Redis sliding log aims at about 100 bytes per entry in Redis).

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use std::time::Duration;

use super::{Quota, Rate, deny_after, deny_never};
use crate::clock::Nanos;
use crate::decision::Verdict;

/// An exact sliding window of `count` units per `period`.
///
/// A request at `now` is admitted when the units admitted in `(now - period, now]` plus its cost
/// are at most `count`. Retry-after comes from the oldest entries: at 100 per minute with
/// entries of 60 units at 10 s and 40 at 30 s, a request of 50 at 40 s must wait for the 10 s
/// entry to leave, at 70 s, and is told to retry in 30 s. No window boundary lets twice the limit
/// through.
#[derive(Debug)]
pub struct SlidingWindowLog {
    log: Mutex<Log>,
    count: u64,
    period: Nanos,
}

#[derive(Debug, Default)]
struct Log {
    /// (time, cost), oldest first; requests at the same nanosecond share an entry.
    entries: VecDeque<(Nanos, u64)>,
    /// Sum of the costs in `entries`.
    total: u64,
}

impl SlidingWindowLog {
    /// A log of `rate.count()` units per `rate.period()`.
    pub fn new(rate: Rate) -> Self {
        Self {
            log: Mutex::new(Log::default()),
            count: rate.count(),
            period: rate.period_ns(),
        }
    }

    /// Logs `cost` units at `now` if they fit in the window ending at `now`.
    pub fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        if cost == 0 {
            return Verdict::Allow;
        }
        if cost > self.count {
            return deny_never();
        }
        // No update leaves the log half-written, so a panic elsewhere cannot corrupt it.
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        // Threads may read the clock in one order and lock in another: keep the log sorted.
        let now = log.entries.back().map_or(now, |&(t, _)| now.max(t));
        while let Some(&(t, c)) = log.entries.front() {
            if t.saturating_add(self.period) > now {
                break;
            }
            log.entries.pop_front();
            log.total -= c;
        }
        if log.total + cost <= self.count {
            log.total += cost;
            match log.entries.back_mut() {
                Some((t, c)) if *t == now => *c += cost,
                _ => log.entries.push_back((now, cost)),
            }
            return Verdict::Allow;
        }
        // The request fits once enough of the oldest entries have left: entry `t` leaves the
        // window at `t + period`.
        let mut remaining = log.total;
        for &(t, c) in &log.entries {
            remaining -= c;
            if remaining + cost <= self.count {
                return deny_after(t + self.period - now);
            }
        }
        unreachable!("an empty log admits any cost up to the count")
    }

    /// Units in the window ending at `now` (entries older than the window may still be stored
    /// until the next decision evicts them).
    pub fn used(&self, now: Nanos) -> u64 {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.entries
            .iter()
            .filter(|(t, _)| t.saturating_add(self.period) > now)
            .map(|(_, c)| c)
            .sum()
    }

    /// Units left in the window ending at `now`, and the time until the newest entry has left it
    /// (when the whole count is free again).
    ///
    /// Read right after a decision, which evicted what had left the window, this costs O(1): the
    /// log's total less the oldest entries that left since (the log is sorted by time), never a
    /// walk over a log that can hold `count` entries.
    pub fn quota(&self, now: Nanos) -> Quota {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let mut used = log.total;
        for &(t, c) in &log.entries {
            if t.saturating_add(self.period) > now {
                break;
            }
            used -= c;
        }
        let reset = log.entries.back().map_or(0, |&(t, _)| {
            t.saturating_add(self.period).saturating_sub(now)
        });
        Quota {
            remaining: self.count.saturating_sub(used),
            reset: Duration::from_nanos(reset),
        }
    }

    /// Entries stored now, to check that memory stays bounded by the count.
    pub fn entries(&self) -> usize {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn retry_after_comes_from_the_oldest_entries() {
        let log = SlidingWindowLog::new(Rate::new(100, Duration::from_secs(60)).unwrap());
        assert!(log.decide(10 * SEC, 60).is_allow());
        assert!(log.decide(30 * SEC, 40).is_allow());
        assert_eq!(
            log.decide(40 * SEC, 50),
            Verdict::Deny {
                retry_after: Duration::from_secs(30)
            }
        );
        assert!(log.decide(70 * SEC, 50).is_allow());
        assert_eq!(log.used(70 * SEC), 90);
        assert_eq!(log.entries(), 2);
    }
}
