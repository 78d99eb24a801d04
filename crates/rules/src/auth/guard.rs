//! What bounds the cost of a bearer token nobody can vouch for: each argon2 check costs 4 MiB
//! and a few milliseconds of a core, and anyone can send a well-formed made-up token.
//!
//! - At most one check per core runs at a time ([`Guard::verify`]), on threads of its own, and
//!   at most [`QUEUE_PER_CORE`] per core wait for one; a request beyond that is answered 503
//!   with `retry-after` at once. So the checks hold at most `cores × 4 MiB` whatever the load,
//!   and that memory is the same few blocks every time: on tokio's blocking pool each check
//!   could land on a new thread, whose allocator arena then kept its 4 MiB (167 MB after a
//!   burst from many addresses, against 72 MB on these threads).
//! - Each check is charged, before it runs, to the request's source address and to the token id
//!   it names ([`Guard::charge`]); one that succeeds is refunded. A source or an id out of
//!   allowance is answered 429 with `retry-after`, without a check: [`SOURCE_ALLOWANCE`] wrong
//!   tokens at once, then one a second, per address; [`ID_ALLOWANCE`] then one a second per id.
//!   Since a single address may hold fewer check slots than the queue has, a client at another
//!   address still gets its token checked during a flood from one.
//! - Requests with the same token that arrive while it is being checked wait for that check
//!   ([`Guard::board`]) and are not charged: a client that starts twenty requests with a new
//!   token costs one check.
//! - An (id, secret) pair that failed its check is remembered ([`FAILED_FOR`], by SHA-256 of the
//!   pair), so sending it again costs no check. Only failures are remembered: a token that is
//!   revoked or rotated is never answered from here.
//! - Refusals are counted for `/metrics` and logged at most once per [`LOG_EVERY`].
//! - After a burst of checks the allocator is asked to hand its free memory back to the system
//!   ([`Guard::burst_ended`], [`return_free_memory`]): glibc keeps what its per-thread arenas
//!   freed (91 MB held after a burst from many addresses, 43 MB once trimmed).
//!
//! Every table has a fixed maximum size, so a flood of distinct addresses or ids costs bounded
//! memory: past it, the entries whose allowance is whole again are dropped, and if none is, the
//! newcomers share one overflow allowance.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::{oneshot, watch};

/// Requests that may wait for a check, per core, besides the ones being checked.
pub const QUEUE_PER_CORE: usize = 16;

/// Wrong tokens a source address may send at once before it is throttled...
pub const SOURCE_ALLOWANCE: u32 = 10;
/// ...and wrong tokens naming one token id.
pub const ID_ALLOWANCE: u32 = 5;
/// Either allowance grows back by one every this long.
pub const REFILL_EVERY: Duration = Duration::from_secs(1);

/// How long a failed (id, secret) pair is answered without a check.
pub const FAILED_FOR: Duration = Duration::from_secs(10);

/// Entries each table holds at most: source addresses, token ids, failed pairs.
pub const TRACKED: usize = 16_384;

/// Refusals are logged at most this often, as one summary line.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Why a check was not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardRefusal {
    /// The source or the token id is out of allowance: ask again in this many seconds.
    Throttled(u64),
    /// Every check slot is taken.
    Busy,
}

/// Allowances, the check slots and the failed pairs of one service.
pub struct Guard {
    checks: mpsc::Sender<Job>,
    admitted: Arc<AtomicUsize>,
    capacity: usize,
    /// Whether a check ran since [`Guard::burst_ended`] last said so.
    checked: Arc<AtomicBool>,
    sources: Mutex<Allowances<IpAddr>>,
    ids: Mutex<Allowances<String>>,
    failed: Mutex<HashMap<[u8; 32], Instant>>,
    /// The pairs being checked: a receiver that wakes when that check has ended.
    flights: Mutex<HashMap<[u8; 32], watch::Receiver<()>>>,
    counts: GuardCounts,
    log: Mutex<LogWindow>,
}

/// What `/metrics` shows: totals since start.
#[derive(Default)]
pub struct GuardCounts {
    pub failed: AtomicU64,
    pub throttled: AtomicU64,
    pub busy: AtomicU64,
}

#[derive(Default)]
struct LogWindow {
    last: Option<Instant>,
    throttled: u64,
    busy: u64,
    latest: Option<IpAddr>,
}

impl Default for Guard {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Guard::with_cores(cores)
    }
}

impl Guard {
    /// A guard that runs `cores` checks at a time.
    pub fn with_cores(cores: usize) -> Self {
        let cores = cores.max(1);
        let (checks, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..cores {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name("token-check".to_owned())
                .spawn(move || {
                    // Ends when the guard, and with it the sender, is dropped.
                    loop {
                        let job = match queue.lock() {
                            Ok(queue) => queue.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(err) = spawned {
                tracing::error!(%err, "starting a bearer token check thread");
            }
        }
        Guard {
            checks,
            admitted: Arc::default(),
            checked: Arc::default(),
            capacity: cores * (1 + QUEUE_PER_CORE),
            sources: Mutex::new(Allowances::new(SOURCE_ALLOWANCE)),
            ids: Mutex::new(Allowances::new(ID_ALLOWANCE)),
            failed: Mutex::default(),
            flights: Mutex::default(),
            counts: GuardCounts::default(),
            log: Mutex::default(),
        }
    }

    pub fn counts(&self) -> &GuardCounts {
        &self.counts
    }

    /// The key a failed pair is remembered by.
    pub fn digest(id: &str, secret: &str) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(id.as_bytes());
        hasher.update([0]);
        hasher.update(secret.as_bytes());
        hasher.finalize().into()
    }

    /// Whether this pair failed its check within [`FAILED_FOR`]; counted as a failure if so.
    pub fn failed_recently(&self, digest: &[u8; 32]) -> bool {
        let hit = self
            .failed
            .lock()
            .ok()
            .and_then(|failed| failed.get(digest).copied())
            .is_some_and(|at| at.elapsed() < FAILED_FOR);
        if hit {
            self.counts.failed.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Leads the check of this pair, or follows the one in progress: wait for it to end and
    /// look again, when its outcome is remembered.
    pub fn board(&self, digest: [u8; 32]) -> Boarding<'_> {
        let Ok(mut flights) = self.flights.lock() else {
            return Boarding::Alone;
        };
        if let Some(done) = flights.get(&digest) {
            return Boarding::Follow(done.clone());
        }
        let (done, ended) = watch::channel(());
        flights.insert(digest, ended);
        Boarding::Lead(Flight {
            guard: self,
            digest,
            _done: done,
        })
    }

    /// Remembers a pair whose check failed.
    pub fn note_failure(&self, digest: [u8; 32]) {
        self.counts.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut failed) = self.failed.lock() {
            if failed.len() >= TRACKED {
                failed.retain(|_, at| at.elapsed() < FAILED_FOR);
                if failed.len() >= TRACKED {
                    // Every one is fresh: a flood of distinct pairs, each of which paid its
                    // check. Forgetting them costs checks, not correctness.
                    failed.clear();
                }
            }
            failed.insert(digest, Instant::now());
        }
    }

    /// Takes one check's worth of allowance from `source` (when known) and from token `id`, or
    /// says when to ask again. Kept unless [`Charge::refund`] gives it back.
    pub fn charge(&self, source: Option<IpAddr>, id: &str) -> Result<Charge<'_>, GuardRefusal> {
        let now = Instant::now();
        let source = source.map(prefix);
        if let Some(source) = source {
            let wait = self
                .sources
                .lock()
                .map_or(None, |mut table| table.take(&source, now));
            if let Some(wait) = wait {
                return Err(self.refuse(GuardRefusal::Throttled(seconds(wait)), Some(source)));
            }
        }
        let wait = self
            .ids
            .lock()
            .map_or(None, |mut table| table.take_with(id, now, str::to_owned));
        if let Some(wait) = wait {
            if let (Some(source), Ok(mut table)) = (source, self.sources.lock()) {
                table.give_back(&source);
            }
            return Err(self.refuse(GuardRefusal::Throttled(seconds(wait)), source));
        }
        Ok(Charge {
            guard: self,
            source,
            id: id.to_owned(),
        })
    }

    /// Runs `check` (argon2) on a check thread once one is free, first come first served;
    /// [`GuardRefusal::Busy`] at once when too many already wait.
    pub async fn verify(
        &self,
        source: Option<IpAddr>,
        check: impl FnOnce() -> bool + Send + 'static,
    ) -> Result<bool, GuardRefusal> {
        let ticket = Ticket::take(&self.admitted, self.capacity)
            .ok_or_else(|| self.refuse(GuardRefusal::Busy, source.map(prefix)))?;
        let (done, outcome) = oneshot::channel();
        let checked = self.checked.clone();
        // The ticket moves into the job: a client that gives up does not free its place before
        // its check has run (or been dropped unrun with the guard).
        let job: Job = Box::new(move || {
            let _ticket = ticket;
            checked.store(true, Ordering::Relaxed);
            // A check that panics fails, and its thread serves on.
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
            let _ = done.send(ok.unwrap_or(false));
        });
        if self.checks.send(job).is_err() {
            return Ok(false);
        }
        Ok(outcome.await.unwrap_or(false))
    }

    /// Whether checks ran since the last call and none runs or waits now: the moment to
    /// [`return_free_memory`].
    pub fn burst_ended(&self) -> bool {
        self.admitted.load(Ordering::Acquire) == 0 && self.checked.swap(false, Ordering::Relaxed)
    }

    /// Counts a refusal, and logs the ones since the last line when [`LOG_EVERY`] has passed.
    fn refuse(&self, refusal: GuardRefusal, source: Option<IpAddr>) -> GuardRefusal {
        match refusal {
            GuardRefusal::Throttled(_) => self.counts.throttled.fetch_add(1, Ordering::Relaxed),
            GuardRefusal::Busy => self.counts.busy.fetch_add(1, Ordering::Relaxed),
        };
        let Ok(mut log) = self.log.lock() else {
            return refusal;
        };
        match refusal {
            GuardRefusal::Throttled(_) => log.throttled += 1,
            GuardRefusal::Busy => log.busy += 1,
        }
        if source.is_some() {
            log.latest = source;
        }
        if log.last.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            let latest = log.latest.map(|a| a.to_string());
            tracing::warn!(
                throttled = log.throttled,
                busy = log.busy,
                latest_source = latest.as_deref().unwrap_or("unknown"),
                "bearer tokens refused unchecked since the last such line: throttled after \
                 failed authentications (429), or every argon2 check slot taken (503)"
            );
            *log = LogWindow {
                last: Some(Instant::now()),
                ..LogWindow::default()
            };
        }
        refusal
    }
}

pub use spillway_net::memory::return_free_memory;

/// A check, as the check threads run it.
type Job = Box<dyn FnOnce() + Send>;

/// How a request takes part in the check of its token.
pub enum Boarding<'a> {
    /// It checks; the others wait until this is dropped.
    Lead(Flight<'a>),
    /// Another request checks the same token: this ends when that check has.
    Follow(watch::Receiver<()>),
    /// It checks, without telling others (the table was poisoned).
    Alone,
}

/// The check of one pair in progress: when dropped, the requests that wait for it wake.
pub struct Flight<'a> {
    guard: &'a Guard,
    digest: [u8; 32],
    _done: watch::Sender<()>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        if let Ok(mut flights) = self.guard.flights.lock() {
            flights.remove(&self.digest);
        }
    }
}

/// What a check was charged to.
pub struct Charge<'a> {
    guard: &'a Guard,
    source: Option<IpAddr>,
    id: String,
}

impl Charge<'_> {
    /// Gives the allowance back: the token was right, or it was never checked.
    pub fn refund(self) {
        if let (Some(source), Ok(mut table)) = (self.source, self.guard.sources.lock()) {
            table.give_back(&source);
        }
        if let Ok(mut table) = self.guard.ids.lock() {
            table.give_back(self.id.as_str());
        }
    }
}

/// A place among the requests admitted to wait for a check; given back when dropped.
struct Ticket(Arc<AtomicUsize>);

impl Ticket {
    fn take(admitted: &Arc<AtomicUsize>, capacity: usize) -> Option<Ticket> {
        admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < capacity).then_some(n + 1)
            })
            .ok()
            .map(|_| Ticket(admitted.clone()))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Allowances by key: a GCRA, each key's theoretical arrival time.
struct Allowances<K> {
    burst: u32,
    due: HashMap<K, Instant>,
    /// Shared by the keys that found the table full.
    overflow: Option<Instant>,
}

impl<K: Hash + Eq> Allowances<K> {
    fn new(burst: u32) -> Self {
        Allowances {
            burst,
            due: HashMap::new(),
            overflow: None,
        }
    }

    /// Takes one from `key`'s allowance, or says how long until one is back.
    fn take(&mut self, key: &K, now: Instant) -> Option<Duration>
    where
        K: Clone,
    {
        self.take_with(key, now, K::clone)
    }

    fn take_with<Q>(
        &mut self,
        key: &Q,
        now: Instant,
        owned: impl FnOnce(&Q) -> K,
    ) -> Option<Duration>
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let window = REFILL_EVERY * self.burst.saturating_sub(1);
        if !self.due.contains_key(key) {
            if self.due.len() >= TRACKED {
                self.due.retain(|_, due| *due > now);
            }
            if self.due.len() < TRACKED {
                self.due.insert(owned(key), now);
            }
        }
        let slot = match self.due.get_mut(key) {
            Some(due) => due,
            None => self.overflow.get_or_insert(now),
        };
        let due = (*slot).max(now);
        let ahead = due - now;
        if ahead > window {
            return Some(ahead - window);
        }
        *slot = due + REFILL_EVERY;
        None
    }

    fn give_back<Q>(&mut self, key: &Q)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = match self.due.get_mut(key) {
            Some(due) => due,
            None => match self.overflow.as_mut() {
                Some(due) => due,
                None => return,
            },
        };
        *slot = slot.checked_sub(REFILL_EVERY).unwrap_or(*slot);
    }
}

/// The address allowances are kept by: an IPv6 client usually holds a whole /64, so that is
/// one source.
fn prefix(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
    }
}

/// Whole seconds, rounded up, at least one: what `retry-after` says.
fn seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowance_runs_out_and_grows_back() {
        let mut table = Allowances::new(3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(table.take(&1, t0), None);
        }
        let wait = table.take(&1, t0).expect("the fourth at once is refused");
        assert_eq!(wait, REFILL_EVERY);
        assert_eq!(table.take(&2, t0), None, "another key has its own");
        assert_eq!(table.take(&1, t0 + REFILL_EVERY), None, "one grew back");
        assert!(table.take(&1, t0 + REFILL_EVERY).is_some());
    }

    #[test]
    fn a_refund_gives_one_back() {
        let mut table = Allowances::new(1);
        let t0 = Instant::now();
        assert_eq!(table.take(&1, t0), None);
        assert!(table.take(&1, t0).is_some());
        table.give_back(&1);
        assert_eq!(table.take(&1, t0), None);
    }

    #[test]
    fn a_full_table_drops_whole_allowances_then_shares_one() {
        let mut table = Allowances::new(2);
        let t0 = Instant::now();
        for key in 0..TRACKED {
            assert_eq!(table.take(&key, t0), None);
        }
        // Every key still owes: newcomers share the overflow allowance.
        assert_eq!(table.take(&usize::MAX, t0), None);
        assert_eq!(table.take(&(usize::MAX - 1), t0), None);
        assert!(table.take(&(usize::MAX - 2), t0).is_some());
        assert_eq!(table.due.len(), TRACKED);
        // A second later every allowance is whole again, and those entries go.
        let later = t0 + REFILL_EVERY * 2;
        assert_eq!(table.take(&usize::MAX, later), None);
        assert_eq!(table.due.len(), 1);
    }

    #[test]
    fn a_guard_throttles_by_source_and_by_id_and_refunds() {
        let guard = Guard::with_cores(1);
        let source = Some(IpAddr::from([192, 0, 2, 1]));
        for i in 0..SOURCE_ALLOWANCE {
            guard.charge(source, &format!("{i:032x}")).unwrap();
        }
        assert!(matches!(
            guard.charge(source, "ff"),
            Err(GuardRefusal::Throttled(1))
        ));
        let other = Some(IpAddr::from([192, 0, 2, 2]));
        for _ in 0..ID_ALLOWANCE {
            guard.charge(other, "aa").unwrap().refund();
        }
        for _ in 0..ID_ALLOWANCE {
            let _kept = guard.charge(None, "bb").unwrap();
        }
        assert!(guard.charge(other, "bb").is_err(), "the id is throttled");
        assert!(
            guard.charge(other, "cc").is_ok(),
            "and its refusal took nothing from the source"
        );
        assert_eq!(guard.counts().throttled.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn ipv6_sources_count_by_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::2".parse().unwrap();
        assert_eq!(prefix(a), prefix(b));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(prefix(mapped), IpAddr::from([192, 0, 2, 7]));
    }

    #[test]
    fn failures_are_remembered_for_a_while() {
        let guard = Guard::with_cores(1);
        let digest = Guard::digest("aa", "wrong");
        assert!(!guard.failed_recently(&digest));
        guard.note_failure(digest);
        assert!(guard.failed_recently(&digest));
        assert!(!guard.failed_recently(&Guard::digest("aa", "other")));
        assert!(!guard.failed_recently(&Guard::digest("aaw", "rong")));
    }

    #[tokio::test]
    async fn checks_beyond_the_queue_are_refused_at_once() {
        let guard = Arc::new(Guard::with_cores(1));
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let hold = Arc::new(Mutex::new(hold));
        let mut waiting = Vec::new();
        for _ in 0..=QUEUE_PER_CORE {
            let guard = guard.clone();
            let hold = hold.clone();
            waiting.push(tokio::spawn(async move {
                guard
                    .verify(None, move || hold.lock().unwrap().recv().is_ok())
                    .await
            }));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while guard.admitted.load(Ordering::Acquire) < 1 + QUEUE_PER_CORE {
            assert!(Instant::now() < deadline, "the checks never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(guard.verify(None, || true).await, Err(GuardRefusal::Busy));
        for _ in 0..=QUEUE_PER_CORE {
            release.send(()).unwrap();
        }
        for task in waiting {
            assert_eq!(task.await.unwrap(), Ok(true));
        }
        assert_eq!(guard.verify(None, || true).await, Ok(true));
        assert_eq!(guard.counts().busy.load(Ordering::Relaxed), 1);
    }
}
