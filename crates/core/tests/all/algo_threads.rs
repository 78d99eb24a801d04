//! Concurrent decisions lose no update: threads racing on one limiter admit exactly what one
//! thread would.

use std::sync::Barrier;
use std::time::Duration;

use spillway_core::algo::{Kind, Limiter, Rate};

const THREADS: usize = 4;

/// Admitted requests when `THREADS` threads each send `per_thread` requests of cost 1 at the
/// same instant.
fn race(limiter: &Limiter, per_thread: usize) -> u64 {
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..per_thread)
                        .filter(|_| limiter.decide(5_000_000_000, 1).is_allow())
                        .count() as u64
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

#[test]
fn racing_threads_admit_exactly_the_capacity() {
    let rate = Rate::new(1_000, Duration::from_secs(60)).unwrap();
    // At one instant nothing refills, so each algorithm admits its capacity and no more: 1,000
    // for the windows and the default bucket, the burst of 500 for GCRA, and a backlog of 9
    // intervals plus the request that finds it for the leaky bucket.
    let cases = [
        (Kind::TokenBucket, None, 1_000),
        (Kind::Gcra, Some(500), 500),
        (Kind::LeakyBucket, Some(9), 10),
        (Kind::FixedWindow, None, 1_000),
        (Kind::SlidingWindowCounter, None, 1_000),
        (Kind::SlidingWindowLog, None, 1_000),
    ];
    for (kind, burst, expected) in cases {
        let limiter = Limiter::new(kind, rate, burst).unwrap();
        assert_eq!(race(&limiter, 2_000), expected, "{}", kind.name());
    }
}
