//! Striped counters lose nothing: many threads recording at once sum to the exact totals.

use spillway_core::counters::{BucketCounters, Outcome};

#[test]
fn concurrent_records_sum_exactly() {
    let counters = BucketCounters::default();
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let counters = &counters;
            s.spawn(move || {
                for i in 0..10_000u64 {
                    let outcome = match (i + t) % 3 {
                        0 => Outcome::Allowed,
                        1 => Outcome::Dropped,
                        _ => Outcome::ShadowDropped,
                    };
                    counters.record(outcome, 1 + t);
                }
            });
        }
    });
    let snap = counters.snapshot();
    // Thread t records 10,000 times with weight 1 + t: 10,000 x (1 + 2 + ... + 6) = 210,000.
    assert_eq!(snap.offered(), 210_000);
    // Each thread splits its 10,000 records 3,334 / 3,333 / 3,333 depending on its offset.
    let by_outcome = |o: u64| -> u64 {
        (0..6u64)
            .map(|t| (0..10_000u64).filter(|i| (i + t) % 3 == o).count() as u64 * (1 + t))
            .sum()
    };
    assert_eq!(snap.allowed, by_outcome(0));
    assert_eq!(snap.dropped, by_outcome(1));
    assert_eq!(snap.shadow_dropped, by_outcome(2));
}

#[test]
fn one_stripe_still_counts_every_thread() {
    let counters = BucketCounters::with_stripes(1);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..5_000 {
                    counters.record(Outcome::Allowed, 1);
                }
            });
        }
    });
    assert_eq!(counters.snapshot().allowed, 20_000);
}
