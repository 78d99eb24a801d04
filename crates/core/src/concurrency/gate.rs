//! The in-flight gate: the hot path of a concurrency limit. Admitting a request is one atomic
//! compare-and-swap of the in-flight counter against the current limit, and completing it a few
//! atomic adds into the window's sums; the algorithm runs in [`Gate::update`], off the hot path,
//! and publishes its limit with one atomic store. Nothing on the hot path allocates or locks.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::{
    ConcurrencyLimiter, ConcurrencySettings, ConcurrencyWindow, LimitAlgorithm, MAX_WINDOW,
    MIN_SAMPLES,
};
use crate::criticality::Criticality;

/// The counter every request touches, on a cache line of its own so that the window's sums,
/// written on completion, do not share it.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Padded(AtomicU32);

/// What the requests completed since the last window saw, summed atomically.
#[derive(Debug)]
struct Sums {
    samples: AtomicU64,
    rtt_sum_ns: AtomicU64,
    rtt_min_ns: AtomicU64,
    dropped: AtomicU64,
    max_inflight: AtomicU32,
}

impl Default for Sums {
    fn default() -> Self {
        Sums {
            samples: AtomicU64::new(0),
            rtt_sum_ns: AtomicU64::new(0),
            rtt_min_ns: AtomicU64::new(u64::MAX),
            dropped: AtomicU64::new(0),
            max_inflight: AtomicU32::new(0),
        }
    }
}

/// What only [`Gate::update`] and [`Gate::configure`] touch.
#[derive(Debug)]
struct State {
    settings: Option<ConcurrencySettings>,
    limiter: Option<ConcurrencyLimiter>,
    /// When the open window began.
    opened: Duration,
}

/// An in-flight limit in front of one upstream; off (admitting everything, counting nothing)
/// until configured.
#[derive(Debug)]
pub struct Gate {
    inflight: Padded,
    limit: AtomicU32,
    enabled: AtomicBool,
    sums: Sums,
    rejected: [AtomicU64; Criticality::ALL.len()],
    state: Mutex<State>,
}

/// A request the gate refused: the limit was reached for its tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    /// The limit when it was refused.
    pub limit: u32,
    /// How many of its tier may be in flight at that limit ([`Gate::tier_limit`]).
    pub tier_limit: u32,
    pub criticality: Criticality,
}

/// A request admitted through the gate. Report how it went with [`Permit::completed`] or
/// [`Permit::failed`]; dropping it unreported (a cancelled request, an upgrade) frees its place
/// and teaches the algorithm nothing.
#[derive(Debug)]
#[must_use = "a permit holds a place in flight until it is dropped"]
pub struct Permit {
    /// `None` when the gate was off at admission: nothing to give back.
    gate: Option<Arc<Gate>>,
}

impl Gate {
    /// A gate running `settings` from `now`, or off for `None`.
    pub fn new(settings: Option<ConcurrencySettings>, now: Duration) -> Arc<Self> {
        let gate = Arc::new(Gate {
            inflight: Padded::default(),
            limit: AtomicU32::new(0),
            enabled: AtomicBool::new(false),
            sums: Sums::default(),
            rejected: Default::default(),
            state: Mutex::new(State {
                settings: None,
                limiter: None,
                opened: now,
            }),
        });
        gate.configure(settings, now);
        gate
    }

    /// How many requests of tier `criticality` may be in flight at `limit`: the whole limit for
    /// `critical_plus` and `critical`, 90% of it for `sheddable_plus` and 75% for `sheddable`, so
    /// that as the requests in flight near the limit the lower tiers are refused first and the
    /// last places are kept for the higher ones.
    pub fn tier_limit(limit: u32, criticality: Criticality) -> u32 {
        match criticality {
            Criticality::CriticalPlus | Criticality::Critical => limit,
            Criticality::SheddablePlus => limit - limit / 10,
            Criticality::Sheddable => limit - limit / 4,
        }
    }

    /// Admits a request of tier `criticality` if fewer than its tier's share of the limit are in
    /// flight. Never lets more than the limit be in flight: the count only grows by a
    /// compare-and-swap from below the limit.
    pub fn try_acquire(self: &Arc<Self>, criticality: Criticality) -> Result<Permit, Rejected> {
        if !self.enabled.load(Relaxed) {
            return Ok(Permit { gate: None });
        }
        let limit = self.limit.load(Relaxed);
        let tier_limit = Self::tier_limit(limit, criticality);
        let mut inflight = self.inflight.0.load(Relaxed);
        loop {
            if inflight >= tier_limit {
                self.rejected[criticality.index()].fetch_add(1, Relaxed);
                return Err(Rejected {
                    limit,
                    tier_limit,
                    criticality,
                });
            }
            match self
                .inflight
                .0
                .compare_exchange_weak(inflight, inflight + 1, Relaxed, Relaxed)
            {
                Ok(_) => break,
                Err(now) => inflight = now,
            }
        }
        self.sums.max_inflight.fetch_max(inflight + 1, Relaxed);
        Ok(Permit {
            gate: Some(self.clone()),
        })
    }

    /// Applies a `concurrency:` section (or `None`, off) as of `now`. The same settings again
    /// change nothing; new ones start their algorithm afresh at its initial limit. Requests in
    /// flight keep their places.
    pub fn configure(&self, settings: Option<ConcurrencySettings>, now: Duration) {
        let mut state = self.lock();
        if state.settings == settings {
            return;
        }
        state.settings = settings;
        state.limiter = settings.map(|s| s.limiter());
        state.opened = now;
        self.take_window();
        match &state.limiter {
            Some(limiter) => {
                self.limit.store(limiter.limit(), Relaxed);
                self.enabled.store(true, Relaxed);
            }
            None => {
                self.enabled.store(false, Relaxed);
                self.limit.store(0, Relaxed);
            }
        }
    }

    /// Closes the window at `now` if it holds [`MIN_SAMPLES`] completions or has been open for
    /// [`MAX_WINDOW`], and lets the algorithm move the limit. Called from a timer, every
    /// [`super::UPDATE_EVERY`]; returns the limit in force (0 when off).
    pub fn update(&self, now: Duration) -> u32 {
        let mut state = self.lock();
        let opened = state.opened;
        let Some(limiter) = state.limiter.as_mut() else {
            return 0;
        };
        let samples = self.sums.samples.load(Relaxed);
        let dropped = self.sums.dropped.load(Relaxed);
        if samples < MIN_SAMPLES && dropped == 0 && now.saturating_sub(opened) < MAX_WINDOW {
            return self.limit.load(Relaxed);
        }
        let window = self.take_window();
        let limit = limiter.update(now, &window);
        state.opened = now;
        self.limit.store(limit, Relaxed);
        limit
    }

    /// Empties the sums into a window. A completion that lands between two of the swaps is
    /// counted in this window or the next, whole or split: a window is a mean, not a ledger.
    fn take_window(&self) -> ConcurrencyWindow {
        let samples = self.sums.samples.swap(0, Relaxed);
        let sum = self.sums.rtt_sum_ns.swap(0, Relaxed);
        let min = self.sums.rtt_min_ns.swap(u64::MAX, Relaxed);
        let dropped = self.sums.dropped.swap(0, Relaxed);
        // The next window starts with what is in flight now, even if nothing is admitted in it.
        let max_inflight = self
            .sums
            .max_inflight
            .swap(self.inflight.0.load(Relaxed), Relaxed);
        let mean = sum.checked_div(samples).unwrap_or(0);
        ConcurrencyWindow {
            samples,
            mean_rtt: Duration::from_nanos(mean),
            min_rtt: Duration::from_nanos(if samples == 0 { 0 } else { min }),
            dropped,
            max_inflight,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is replaced whole or updated by arithmetic that cannot panic halfway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limit in force, 0 when off.
    pub fn limit(&self) -> u32 {
        self.limit.load(Relaxed)
    }

    /// Requests admitted and not yet done (those admitted while off are not counted).
    pub fn inflight(&self) -> u32 {
        self.inflight.0.load(Relaxed)
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    /// The settings in force.
    pub fn settings(&self) -> Option<ConcurrencySettings> {
        self.lock().settings
    }

    /// Requests of tier `criticality` refused so far.
    pub fn rejected(&self, criticality: Criticality) -> u64 {
        self.rejected[criticality.index()].load(Relaxed)
    }

    fn release(&self) {
        self.inflight.0.fetch_sub(1, Relaxed);
    }
}

impl Permit {
    /// The request was answered after `rtt`: a sample for the algorithm.
    pub fn completed(mut self, rtt: Duration) {
        if let Some(gate) = self.gate.take() {
            let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
            gate.sums.rtt_sum_ns.fetch_add(ns, Relaxed);
            gate.sums.rtt_min_ns.fetch_min(ns, Relaxed);
            gate.sums.samples.fetch_add(1, Relaxed);
            gate.release();
        }
    }

    /// The request failed or timed out at the upstream: a sign of overload with no round trip.
    pub fn failed(mut self) {
        if let Some(gate) = self.gate.take() {
            gate.sums.dropped.fetch_add(1, Relaxed);
            gate.release();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(gate) = self.gate.take() {
            gate.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::concurrency::AlgorithmName;

    #[test]
    fn a_fixed_gate_refuses_past_its_limit_and_frees_places() {
        let gate = Gate::new(Some(ConcurrencySettings::fixed(2)), Duration::ZERO);
        let a = gate.try_acquire(Criticality::Critical).unwrap();
        let b = gate.try_acquire(Criticality::Critical).unwrap();
        let refused = gate.try_acquire(Criticality::Critical).unwrap_err();
        assert_eq!(refused.limit, 2);
        assert_eq!(gate.inflight(), 2);
        assert_eq!(gate.rejected(Criticality::Critical), 1);
        a.completed(Duration::from_millis(5));
        drop(b);
        assert_eq!(gate.inflight(), 0);
        assert!(gate.try_acquire(Criticality::Critical).is_ok());
    }

    #[test]
    fn lower_tiers_are_refused_first() {
        let gate = Gate::new(Some(ConcurrencySettings::fixed(20)), Duration::ZERO);
        let mut held = Vec::new();
        for _ in 0..15 {
            held.push(gate.try_acquire(Criticality::Critical).unwrap());
        }
        // 15 of 20 in flight: sheddable (75%: 15) is refused, sheddable_plus (90%: 18) is not.
        assert!(gate.try_acquire(Criticality::Sheddable).is_err());
        for _ in 0..3 {
            held.push(gate.try_acquire(Criticality::SheddablePlus).unwrap());
        }
        assert!(gate.try_acquire(Criticality::SheddablePlus).is_err());
        held.push(gate.try_acquire(Criticality::Critical).unwrap());
        held.push(gate.try_acquire(Criticality::CriticalPlus).unwrap());
        assert!(gate.try_acquire(Criticality::CriticalPlus).is_err());
        assert_eq!(gate.rejected(Criticality::Sheddable), 1);
        assert_eq!(gate.rejected(Criticality::SheddablePlus), 1);
        assert_eq!(gate.rejected(Criticality::CriticalPlus), 1);
        assert_eq!(gate.rejected(Criticality::Critical), 0);
    }

    #[test]
    fn an_unconfigured_gate_admits_everything_and_counts_nothing() {
        let gate = Gate::new(None, Duration::ZERO);
        let permits: Vec<_> = (0..1000)
            .map(|_| gate.try_acquire(Criticality::Sheddable).unwrap())
            .collect();
        assert_eq!(gate.inflight(), 0);
        assert_eq!(gate.limit(), 0);
        // Turned on with those still in flight, which give nothing back when they end.
        gate.configure(Some(ConcurrencySettings::fixed(1)), Duration::ZERO);
        drop(permits);
        assert_eq!(gate.inflight(), 0);
        let one = gate.try_acquire(Criticality::Critical).unwrap();
        assert!(gate.try_acquire(Criticality::Critical).is_err());
        drop(one);
    }

    #[test]
    fn a_window_waits_for_enough_samples_then_moves_the_limit() {
        let settings = ConcurrencySettings {
            initial_limit: 100,
            ..ConcurrencySettings::adaptive(AlgorithmName::Gradient)
        };
        let gate = Gate::new(Some(settings), Duration::ZERO);
        let mut permits: Vec<_> = (0..60)
            .map(|_| gate.try_acquire(Criticality::Critical).unwrap())
            .collect();
        for p in permits.drain(..5) {
            p.completed(Duration::from_millis(20));
        }
        // 5 samples after 50 ms: the window stays open.
        assert_eq!(gate.update(Duration::from_millis(50)), 100);
        for p in permits.drain(..) {
            p.completed(Duration::from_millis(20));
        }
        // 60 samples, 60 of 100 in flight at most: the limit grows by 0.8.
        assert_eq!(gate.update(Duration::from_millis(100)), 101);
        assert_eq!(gate.inflight(), 0);
    }

    #[test]
    fn the_same_settings_keep_the_limit_and_new_ones_restart() {
        let gate = Gate::new(
            Some(ConcurrencySettings::adaptive(AlgorithmName::Vegas)),
            Duration::ZERO,
        );
        assert_eq!(gate.limit(), 20);
        gate.configure(
            Some(ConcurrencySettings::adaptive(AlgorithmName::Vegas)),
            Duration::ZERO,
        );
        assert_eq!(gate.limit(), 20);
        gate.configure(Some(ConcurrencySettings::fixed(7)), Duration::ZERO);
        assert_eq!(gate.limit(), 7);
        gate.configure(None, Duration::ZERO);
        assert!(!gate.enabled());
    }
}
