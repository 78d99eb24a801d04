//! The sliding-window log agrees exactly with a plain reference implementation.

use std::time::Duration;

use proptest::prelude::*;
use spillway_core::algo::{Rate, SlidingWindowLog};
use spillway_core::clock::Nanos;
use spillway_core::decision::{NEVER, Verdict};

/// The definition, written as plainly as possible: keep every admitted request forever and
/// recount the window each time.
struct Reference {
    count: u64,
    period: Nanos,
    admitted: Vec<(Nanos, u64)>,
}

impl Reference {
    fn in_window(&self, now: Nanos) -> u64 {
        self.admitted
            .iter()
            .filter(|&&(t, _)| t + self.period > now)
            .map(|&(_, c)| c)
            .sum()
    }

    fn decide(&mut self, now: Nanos, cost: u64) -> Verdict {
        if cost > self.count {
            return Verdict::Deny { retry_after: NEVER };
        }
        if self.in_window(now) + cost <= self.count {
            self.admitted.push((now, cost));
            return Verdict::Allow;
        }
        // The first instant at which an entry leaves and the request then fits.
        let wait = self
            .admitted
            .iter()
            .map(|&(t, _)| t + self.period)
            .filter(|&leave| leave > now && self.in_window(leave) + cost <= self.count)
            .min()
            .expect("once every entry has left, any cost up to the count fits");
        Verdict::Deny {
            retry_after: Duration::from_nanos(wait - now),
        }
    }
}

proptest! {
    #[test]
    fn sliding_log_matches_the_reference_decision_for_decision(
        count in 1u64..=15,
        period_ms in 1u64..=1_000,
        reqs in prop::collection::vec((0u64..500, 0u64..=6), 1..120),
    ) {
        let rate = Rate::new(count, Duration::from_millis(period_ms)).unwrap();
        let log = SlidingWindowLog::new(rate);
        let mut reference = Reference { count, period: rate.period_ns(), admitted: Vec::new() };
        let mut now = 1_000_000_007;
        for (i, &(gap, cost)) in reqs.iter().enumerate() {
            // Gaps in thousandths of the period, some 0 so requests share a nanosecond.
            now += rate.period_ns() / 1000 * gap;
            let (got, want) = (log.decide(now, cost), reference.decide(now, cost));
            prop_assert_eq!(got, want, "request {} of cost {} at {}", i, cost, now);
        }
    }
}
