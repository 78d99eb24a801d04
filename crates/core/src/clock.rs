//! Time for the core: a `Clock` trait, the system clock, a coarse one and a fake one for tests.
//!
//! Algorithms never read a clock themselves: they take `now` as an argument (sans-IO), so the
//! proxy passes [`SystemClock`] readings while the simulator and the tests pass simulated time.
//! Time is a plain `u64` of nanoseconds since an arbitrary epoch, which keeps every algorithm's
//! state small enough for one atomic word; `u64` nanoseconds last 584 years.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds since the clock's epoch. Monotonic: never goes backwards for one clock.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// Converts a duration to nanoseconds, saturating at `u64::MAX` (584 years).
pub fn nanos(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A monotonic source of time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> Nanos;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// The real clock: nanoseconds since this value was created, from [`Instant`].
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        nanos(self.origin.elapsed())
    }
}

/// A cheaper real clock: the kernel's coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`), the
/// time of the last timer tick. On a 2-vCPU VM one reading costs about 2 ns against 22 ns for
/// [`Instant::now`], at a resolution of one tick ([`CoarseClock::resolution`], 1 to 4 ms).
///
/// Worth it where a decision's time only needs milliseconds: a drop-ratio instruction's expiry
/// (seconds), a fixed window of a second or more. The limits stay exact in the coarse time; a
/// token bucket refills in jumps of one tick's worth instead of continuously.
#[derive(Debug, Clone, Copy)]
pub struct CoarseClock {
    origin: Nanos,
}

impl CoarseClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            origin: Self::read(),
        }
    }

    /// How far apart two distinct readings are at least: one kernel timer tick.
    pub fn resolution() -> Duration {
        let res = rustix::time::clock_getres(rustix::time::ClockId::MonotonicCoarse);
        Duration::new(
            u64::try_from(res.tv_sec).unwrap_or(0),
            u32::try_from(res.tv_nsec).unwrap_or(0),
        )
    }

    fn read() -> Nanos {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
        u64::try_from(ts.tv_sec)
            .unwrap_or(0)
            .saturating_mul(NANOS_PER_SEC)
            .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
    }
}

impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for CoarseClock {
    fn now(&self) -> Nanos {
        Self::read().saturating_sub(self.origin)
    }
}

/// A clock that moves only when told to. `Sync`, so threads can share it by reference.
#[derive(Debug, Default)]
pub struct FakeClock {
    now: AtomicU64,
}

impl FakeClock {
    /// A fake clock reading `start`.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: AtomicU64::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.advance_nanos(nanos(by));
    }

    /// Moves the clock forward by `by` nanoseconds.
    pub fn advance_nanos(&self, by: Nanos) {
        self.now.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the clock to `to`; it is never moved backwards (a smaller `to` is ignored), which keeps
    /// the clock monotonic as the trait promises.
    pub fn set(&self, to: Nanos) {
        self.now.fetch_max(to, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_coarse_clock_is_monotonic_and_keeps_pace_within_its_resolution() {
        let resolution = CoarseClock::resolution();
        assert!(resolution > Duration::ZERO && resolution <= Duration::from_millis(10));
        let coarse = CoarseClock::new();
        let precise = SystemClock::new();
        // Each precise read is bracketed by two coarse ones, so a thread preempted between the
        // reads (a loaded machine) widens the bracket instead of failing the test.
        let (a1, p1, a2) = (coarse.now(), precise.now(), coarse.now());
        let mut last = a2;
        let deadline = Instant::now() + Duration::from_millis(60);
        while Instant::now() < deadline {
            let now = coarse.now();
            assert!(now >= last, "went back from {last} to {now}");
            last = now;
        }
        let (b1, p2, b2) = (coarse.now(), precise.now(), coarse.now());
        // Over the same stretch both clocks advance alike, within a tick at each end.
        let tick = nanos(resolution);
        let precise_elapsed = p2 - p1;
        assert!(
            precise_elapsed + 2 * tick >= b1.saturating_sub(a2)
                && precise_elapsed <= (b2 - a1) + 2 * tick,
            "precise {precise_elapsed} ns against coarse {}..{} ns",
            b1.saturating_sub(a2),
            b2 - a1
        );
        assert!(b2 - a1 >= nanos(Duration::from_millis(60)) - 2 * tick);
    }

    use super::*;

    #[test]
    fn fake_clock_advances_and_never_goes_back() {
        let clock = FakeClock::new(5);
        clock.advance(Duration::from_micros(1));
        assert_eq!(clock.now(), 1_005);
        clock.set(10);
        assert_eq!(clock.now(), 1_005);
        clock.set(2_000);
        // Through the blanket impl for references, as a shared clock is passed around.
        fn read(c: impl Clock) -> Nanos {
            c.now()
        }
        assert_eq!(read(&clock), 2_000);
    }

    #[test]
    fn system_clock_is_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }
}
