//! Per-subject buckets (`user: "*"`): one limiter per subject value in a sharded map whose idle
//! subjects are evicted.
//!
//! A subject is evicted once it has been idle long enough that its limiter has fully recovered
//! (a meter has refilled its burst, a window has slid past its last request), so eviction never
//! changes a decision: a returning subject gets the same answer from a fresh limiter as it would
//! have from its old one.
//!
//! # Memory bound
//! A subject costs its key, one table slot and one limiter. Its key is its value when that is at
//! most [`SUBJECT_VALUE_MAX`] (256) bytes long, else the value's SHA-256 in hex (64 bytes,
//! [`subject_key`]), so no header length makes a subject dearer than a 256-byte one. For every
//! algorithm but sliding-window-log a subject holds at most [`SUBJECT_BYTES_BOUND`] (256) bytes of
//! heap with a key of up to 64 bytes, hashed ones included, and at most [`SUBJECT_BYTES_MAX`]
//! (512) whatever its value, allocator overhead and hash-table slack included: about 170 bytes
//! plus the key rounded up to a 16-byte allocator chunk. `tests/all/subjects_memory.rs` measures
//! about 150 bytes for 1,000,000 subjects with 12-byte ids, `tests/all/subjects_long.rs` about 425
//! for 1,000,000 of 256 bytes and about 235 for 1,000,000 of 1 KiB. A sliding-window-log subject
//! adds 16 bytes per request in its window. A bucket holds at most
//! [`DEFAULT_MAX_SUBJECTS`] (1,048,576) subjects, so one bucket with a million active users stays
//! under 1,048,576 x 512 B = 512 MiB however long their ids, and under 256 MiB with ids of up to
//! 64 bytes; a subject arriving when the map is full and nothing idle can be evicted is admitted
//! without a limiter (fail-open) and counted, since refusing it would punish a legitimate
//! newcomer for the crowd, while an attacker rotating ids already gets a fresh bucket per id.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use sha2::{Digest, Sha256};
use spillway_core::algo::{
    FixedWindow, Gcra, LeakyBucket, ParamError, Quota, Rate, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};
use spillway_core::clock::Nanos;
use spillway_core::config::Algorithm;
use spillway_core::decision::Verdict;

/// The most subjects one bucket holds by default.
pub const DEFAULT_MAX_SUBJECTS: usize = 1 << 20;

/// Heap bytes per subject, all overheads included, for every algorithm but sliding-window-log,
/// when its key is at most 64 bytes long (which every hashed value's is).
pub const SUBJECT_BYTES_BOUND: usize = 256;

/// The longest subject value that keys its bucket as it is; a longer one keys it by its SHA-256
/// ([`subject_key`]).
pub const SUBJECT_VALUE_MAX: usize = 256;

/// Heap bytes per subject, all overheads included, for every algorithm but sliding-window-log,
/// whatever the length of its value: a value of [`SUBJECT_VALUE_MAX`] bytes is the longest key.
pub const SUBJECT_BYTES_MAX: usize = 512;

/// Enough shards that 2 to 64 cores rarely meet on one lock; each shard is a plain hash map.
const SHARDS: usize = 64;

/// The local algorithms, without the large control-plane ones, so a slot stays small.
#[derive(Debug)]
enum SubjectLimiter {
    TokenBucket(TokenBucket),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    /// Boxed: the log is the largest state and allocates anyway, and boxing it shrinks every
    /// other algorithm's slot from 80 to 56 bytes.
    SlidingWindowLog(Box<SlidingWindowLog>),
    SlidingWindowCounter(SlidingWindowCounter),
    Gcra(Gcra),
}

impl SubjectLimiter {
    fn decide(&self, now: Nanos, cost: u64) -> Verdict {
        match self {
            SubjectLimiter::TokenBucket(a) => a.decide(now, cost),
            SubjectLimiter::LeakyBucket(a) => a.decide(now, cost),
            SubjectLimiter::FixedWindow(a) => a.decide(now, cost),
            SubjectLimiter::SlidingWindowLog(a) => a.decide(now, cost),
            SubjectLimiter::SlidingWindowCounter(a) => a.decide(now, cost),
            SubjectLimiter::Gcra(a) => a.decide(now, cost),
        }
    }

    /// Decides `cost`, or with `owing` admits a request whose response reports its cost.
    fn decide_as(&self, now: Nanos, cost: u64, owing: bool) -> Verdict {
        match (self, owing) {
            (SubjectLimiter::TokenBucket(a), true) => a.admit_owing(now, cost),
            (SubjectLimiter::Gcra(a), true) => a.admit_owing(now, cost),
            (other, true) => other.decide(now, cost.max(1)),
            (other, false) => other.decide(now, cost),
        }
    }

    fn settle(&self, now: Nanos, reserved: u64, actual: u64) {
        match self {
            SubjectLimiter::TokenBucket(a) => a.settle(now, reserved, actual),
            SubjectLimiter::Gcra(a) => a.settle(now, reserved, actual),
            _ => {}
        }
    }

    fn quota(&self, now: Nanos) -> Quota {
        match self {
            SubjectLimiter::TokenBucket(a) => a.quota(now),
            SubjectLimiter::LeakyBucket(a) => a.quota(now),
            SubjectLimiter::FixedWindow(a) => a.quota(now),
            SubjectLimiter::SlidingWindowLog(a) => a.quota(now),
            SubjectLimiter::SlidingWindowCounter(a) => a.quota(now),
            SubjectLimiter::Gcra(a) => a.quota(now),
        }
    }
}

#[derive(Debug)]
struct Slot {
    limiter: SubjectLimiter,
    last_seen: Nanos,
}

type Shard = HashMap<Box<str>, Slot, foldhash::quality::RandomState>;

/// The limiters of one per-subject bucket.
#[derive(Debug)]
pub(crate) struct SubjectMap {
    algorithm: Algorithm,
    rate: Rate,
    burst: Option<u64>,
    /// Idle this long, a limiter is as good as new.
    idle_ns: Nanos,
    max: usize,
    len: AtomicUsize,
    overflow: AtomicU64,
    next_sweep: AtomicU64,
    /// Keys come from requests, so the hasher is seeded at random (no chosen collisions).
    hasher: foldhash::quality::RandomState,
    shards: Box<[Mutex<Shard>]>,
}

impl SubjectMap {
    /// A map for a local `algorithm`; `None` for the control-plane ones, which keep one shared
    /// limiter since their instructions are per bucket.
    pub(crate) fn new(
        algorithm: Algorithm,
        rate: Rate,
        burst: Option<u64>,
        max: usize,
    ) -> Result<Option<Self>, ParamError> {
        if matches!(
            algorithm,
            Algorithm::DropRatio | Algorithm::AdaptiveTokenBucket
        ) {
            return Ok(None);
        }
        let map = Self {
            algorithm,
            rate,
            burst,
            idle_ns: 0,
            max,
            len: AtomicUsize::new(0),
            overflow: AtomicU64::new(0),
            next_sweep: AtomicU64::new(0),
            hasher: foldhash::quality::RandomState::default(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        };
        // Build one limiter now so bad parameters fail at load, not on the first request.
        map.limiter()?;
        let burst_ns = burst
            .unwrap_or(rate.count())
            .saturating_mul(rate.emission_interval_ns());
        Ok(Some(Self {
            idle_ns: rate.period_ns().saturating_mul(2).max(burst_ns),
            ..map
        }))
    }

    fn limiter(&self) -> Result<SubjectLimiter, ParamError> {
        let (rate, burst) = (self.rate, self.burst);
        Ok(match self.algorithm {
            Algorithm::TokenBucket => SubjectLimiter::TokenBucket(TokenBucket::new(rate, burst)?),
            Algorithm::LeakyBucket => SubjectLimiter::LeakyBucket(LeakyBucket::new(rate, burst)?),
            Algorithm::FixedWindow => SubjectLimiter::FixedWindow(FixedWindow::new(rate)?),
            Algorithm::SlidingWindowLog => {
                SubjectLimiter::SlidingWindowLog(Box::new(SlidingWindowLog::new(rate)))
            }
            Algorithm::SlidingWindowCounter => {
                SubjectLimiter::SlidingWindowCounter(SlidingWindowCounter::new(rate)?)
            }
            Algorithm::Gcra => SubjectLimiter::Gcra(Gcra::new(rate, burst)?),
            // `new` returns no map for these.
            Algorithm::DropRatio | Algorithm::AdaptiveTokenBucket => unreachable!(),
        })
    }

    /// Decides a request of `subject`; allocates only for a subject not seen while it was active.
    pub(crate) fn decide(&self, subject: &str, now: Nanos, cost: u64) -> Verdict {
        self.decide_then(subject, now, (cost, false), |_| ()).0
    }

    /// Admits a request of `subject` whose response reports its cost (reserving `estimate`),
    /// with what the subject's limiter holds right after.
    pub(crate) fn admit_owing_quota(
        &self,
        subject: &str,
        now: Nanos,
        estimate: u64,
    ) -> (Verdict, Quota) {
        let (verdict, quota) = self.decide_then(subject, now, (estimate, true), |l| l.quota(now));
        let quota = quota.unwrap_or_else(|| self.full_quota());
        (verdict, quota)
    }

    /// Settles what a response of `subject` reported against what it reserved. A subject
    /// evicted meanwhile (idle so long its limiter was as good as new) is not brought back.
    pub(crate) fn settle(&self, subject: &str, now: Nanos, reserved: u64, actual: u64) {
        self.settle_then(subject, now, (reserved, actual), |_| ());
    }

    /// [`SubjectMap::settle`] with nothing reserved, and what the subject's limiter holds
    /// right after (the whole limit for a subject it does not hold).
    pub(crate) fn settle_quota(&self, subject: &str, now: Nanos, actual: u64) -> Quota {
        self.settle_then(subject, now, (0, actual), |l| l.quota(now))
            .unwrap_or_else(|| self.full_quota())
    }

    fn settle_then<T>(
        &self,
        subject: &str,
        now: Nanos,
        (reserved, actual): (u64, u64),
        then: impl FnOnce(&SubjectLimiter) -> T,
    ) -> Option<T> {
        let mut hex = [0; 64];
        let subject = subject_key(subject, &mut hex);
        let shard = &self.shards[(self.hasher.hash_one(subject) as usize) % SHARDS];
        let mut shard = shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = shard.get_mut(subject)?;
        slot.last_seen = slot.last_seen.max(now);
        slot.limiter.settle(now, reserved, actual);
        Some(then(&slot.limiter))
    }

    /// What a subject with a limiter as good as new has left: the whole limit.
    fn full_quota(&self) -> Quota {
        Quota {
            remaining: self.rate.count(),
            reset: std::time::Duration::ZERO,
        }
    }

    /// Like [`SubjectMap::decide`], with what the subject's limiter still admits right after
    /// (read under the same lock, so no other request of the subject comes between). A subject
    /// admitted without a limiter because the map is full has the whole limit left.
    pub(crate) fn decide_quota(&self, subject: &str, now: Nanos, cost: u64) -> (Verdict, Quota) {
        let (verdict, quota) = self.decide_then(subject, now, (cost, false), |l| l.quota(now));
        let quota = quota.unwrap_or_else(|| self.full_quota());
        (verdict, quota)
    }

    fn decide_then<T>(
        &self,
        subject: &str,
        now: Nanos,
        (cost, owing): (u64, bool),
        then: impl FnOnce(&SubjectLimiter) -> T,
    ) -> (Verdict, Option<T>) {
        let mut hex = [0; 64];
        let subject = subject_key(subject, &mut hex);
        let shard = &self.shards[(self.hasher.hash_one(subject) as usize) % SHARDS];
        let mut shard = shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(slot) = shard.get_mut(subject) {
            slot.last_seen = now;
            let verdict = slot.limiter.decide_as(now, cost, owing);
            return (verdict, Some(then(&slot.limiter)));
        }
        if self.len.load(Ordering::Relaxed) >= self.max {
            let freed = evict_idle(&mut shard, now, self.idle_ns);
            self.len.fetch_sub(freed, Ordering::Relaxed);
            if freed == 0 {
                self.overflow.fetch_add(1, Ordering::Relaxed);
                return (Verdict::Allow, None);
            }
        }
        let Ok(limiter) = self.limiter() else {
            // `new` built one with the same parameters, so this cannot fail; if it ever did,
            // admitting is the fault-free answer (the proxy never turns its fault into a drop).
            return (Verdict::Allow, None);
        };
        let verdict = limiter.decide_as(now, cost, owing);
        let after = then(&limiter);
        shard.insert(
            subject.into(),
            Slot {
                limiter,
                last_seen: now,
            },
        );
        self.len.fetch_add(1, Ordering::Relaxed);
        (verdict, Some(after))
    }

    /// Evicts idle subjects if a sweep is due (every half idle period); returns how many.
    pub(crate) fn maybe_sweep(&self, now: Nanos) -> usize {
        let due = self.next_sweep.load(Ordering::Relaxed);
        if now < due
            || self
                .next_sweep
                .compare_exchange(
                    due,
                    now.saturating_add(self.idle_ns / 2),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return 0;
        }
        self.sweep(now)
    }

    /// Evicts every subject idle for the idle period; returns how many. Locks one shard at a time.
    pub(crate) fn sweep(&self, now: Nanos) -> usize {
        let mut freed = 0;
        for shard in self.shards.iter() {
            let mut shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let n = evict_idle(&mut shard, now, self.idle_ns);
            if shard.is_empty() {
                // Give the table back too, or a past crowd keeps its memory forever.
                shard.shrink_to_fit();
            }
            freed += n;
        }
        self.len.fetch_sub(freed, Ordering::Relaxed);
        freed
    }

    /// Subjects held now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Subjects admitted without a limiter because the map was full.
    pub(crate) fn overflow(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }

    /// How long a subject must be idle before it is evicted.
    pub(crate) fn idle_ns(&self) -> Nanos {
        self.idle_ns
    }
}

/// What subject value `value` keys its bucket by, in memory and in Redis: the value itself when
/// it is at most [`SUBJECT_VALUE_MAX`] bytes long, else its SHA-256 in lowercase hex (64 bytes),
/// written into `hex`. The same on every proxy, so their Redis keys agree, and a subject's memory
/// is bounded whatever its header's length. Nothing is allocated. A client that sends the hex
/// digest of another subject's long value as its own value shares that subject's bucket, which
/// can only limit it.
///
/// ```
/// let mut hex = [0; 64];
/// assert_eq!(spillway_client::subject_key("alice", &mut hex), "alice");
/// let long = "a".repeat(300);
/// assert_eq!(spillway_client::subject_key(&long, &mut hex).len(), 64);
/// ```
pub fn subject_key<'a>(value: &'a str, hex: &'a mut [u8; 64]) -> &'a str {
    if value.len() <= SUBJECT_VALUE_MAX {
        return value;
    }
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(value.as_bytes());
    for (pair, byte) in hex.chunks_exact_mut(2).zip(digest) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    // Hex digits are ASCII, so this never fails.
    std::str::from_utf8(hex).unwrap_or_default()
}

fn evict_idle(shard: &mut Shard, now: Nanos, idle_ns: Nanos) -> usize {
    let before = shard.len();
    shard.retain(|_, slot| now.saturating_sub(slot.last_seen) < idle_ns);
    before - shard.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn map(max: usize) -> SubjectMap {
        let rate = Rate::new(2, Duration::from_secs(1)).unwrap();
        SubjectMap::new(Algorithm::TokenBucket, rate, Some(2), max)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn each_subject_has_its_own_limiter() {
        let m = map(10);
        assert!(m.decide("alice", 0, 1).is_allow());
        assert!(m.decide("alice", 0, 1).is_allow());
        assert!(!m.decide("alice", 0, 1).is_allow());
        assert!(m.decide("bob", 0, 1).is_allow());
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn idle_subjects_are_evicted_and_active_ones_kept() {
        let m = map(10);
        let idle = m.idle_ns();
        assert_eq!(
            idle, 2_000_000_000,
            "two periods of 1s outlast a 2-token refill"
        );
        m.decide("alice", 0, 1);
        m.decide("bob", idle / 2, 1);
        assert_eq!(m.sweep(idle), 1);
        assert_eq!(m.len(), 1);
        assert_eq!(m.sweep(idle / 2 + idle), 1);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_full_map_admits_newcomers_and_counts_them() {
        let m = map(1);
        m.decide("alice", 0, 1);
        assert!(
            m.decide("bob", 1, 5).is_allow(),
            "cost 5 > burst would be denied"
        );
        assert_eq!((m.len(), m.overflow()), (1, 1));
    }

    #[test]
    fn values_longer_than_256_bytes_key_by_their_sha256() {
        let mut hex = [0; 64];
        let longest = "u".repeat(SUBJECT_VALUE_MAX);
        assert_eq!(subject_key(&longest, &mut hex), longest);
        // `printf 'a%.0s' $(seq 257) | sha256sum`
        let long = "a".repeat(SUBJECT_VALUE_MAX + 1);
        assert_eq!(
            subject_key(&long, &mut hex),
            "e8d95cc2b4bc198c54b40bd214df958afb65f5e73d2c2eafe0593cf5c635c1f0"
        );
        // Two long values that differ only in their last byte are two subjects; the same long
        // value is one.
        let m = map(10);
        let (a, b) = ("x".repeat(1000) + "a", "x".repeat(1000) + "b");
        assert!(m.decide(&a, 0, 2).is_allow());
        assert!(!m.decide(&a, 0, 1).is_allow());
        assert!(m.decide(&b, 0, 1).is_allow());
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn control_plane_algorithms_share_one_limiter() {
        let rate = Rate::per_second(5).unwrap();
        assert!(
            SubjectMap::new(Algorithm::DropRatio, rate, None, 10)
                .unwrap()
                .is_none()
        );
    }
}
