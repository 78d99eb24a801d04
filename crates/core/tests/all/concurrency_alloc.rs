//! Proves that the concurrency gate's hot path allocates nothing (DESIGN.md: no allocation per
//! decision): admitting, refusing, completing and failing requests, with a global allocator that
//! counts the allocations of one thread.

use std::time::Duration;

use spillway_core::concurrency::{AlgorithmName, ConcurrencySettings, Gate};
use spillway_core::criticality::Criticality;
use spillway_testkit::alloc::allocations_in;

#[test]
fn concurrency_gate_admits_refuses_and_releases_without_allocating() {
    // A limit of 2 refuses the third of every three requests; gradient's 20 and no limit refuse
    // none.
    for (settings, expected) in [
        (Some(ConcurrencySettings::fixed(2)), 10_000),
        (
            Some(ConcurrencySettings::adaptive(AlgorithmName::Gradient)),
            0,
        ),
        (None, 0),
    ] {
        let gate = Gate::new(settings, Duration::ZERO);
        let refused = std::cell::Cell::new(0);
        let allocations = allocations_in(|| {
            for i in 0..10_000u32 {
                let a = gate.try_acquire(Criticality::Critical);
                let b = gate.try_acquire(Criticality::Sheddable);
                let c = gate.try_acquire(Criticality::Critical);
                refused.set(refused.get() + [&a, &b, &c].iter().filter(|p| p.is_err()).count());
                if let Ok(permit) = a {
                    permit.completed(Duration::from_micros(u64::from(i % 50)));
                }
                if let Ok(permit) = b {
                    permit.failed();
                }
                drop(c);
            }
        });
        assert_eq!(allocations, 0, "{settings:?}: {allocations} allocations");
        assert_eq!(refused.get(), expected, "{settings:?}");
        assert_eq!(gate.inflight(), 0);
    }
}
