//! Proves that `Matcher::find` allocates nothing once its buffer has warmed up (DESIGN.md: no
//! allocation per decision), with a global allocator that counts the allocations of one thread.

use spillway_testkit::alloc::allocations_in;

use spillway_core::matcher::{Matcher, Matches};
use spillway_core::pattern::{
    MatchSpec, Pattern, RequestAttrs, Subject, SubjectKind, SubjectValue,
};

fn spec(caller: Option<&str>, procedure: Option<&str>) -> MatchSpec {
    MatchSpec {
        caller: caller.map(Pattern::new),
        procedure: procedure.map(Pattern::new),
        subject: None,
    }
}

/// 1,000 buckets: exact (caller, procedure) pairs, caller and procedure globs, a `*` caller, and
/// per-user and per-org buckets.
fn thousand_buckets() -> Vec<MatchSpec> {
    let mut specs = Vec::new();
    for caller in 0..40 {
        for method in 0..23 {
            specs.push(spec(
                Some(&format!("svc-{caller}")),
                Some(&format!("/svc.v1.Service/M{method}")),
            ));
        }
    }
    for team in 0..30 {
        specs.push(spec(Some(&format!("svc-{team}*")), None));
    }
    for method in 0..29 {
        specs.push(MatchSpec {
            subject: Some(Subject {
                kind: SubjectKind::User,
                value: SubjectValue::Each,
            }),
            ..spec(None, Some(&format!("/svc.v1.Service/M{method}")))
        });
    }
    for org in 0..20 {
        specs.push(MatchSpec {
            subject: Some(Subject {
                kind: SubjectKind::Org,
                value: SubjectValue::new(&format!("org-{org}*")),
            }),
            ..spec(Some("*"), Some("/svc.v1.*"))
        });
    }
    specs.push(spec(None, None));
    assert_eq!(specs.len(), 1000);
    specs
}

/// A request's attributes, owned, so that each lookup borrows them as a real request would.
struct OwnedRequest {
    caller: Option<String>,
    procedure: Option<String>,
    subjects: [Option<String>; 4],
}

impl OwnedRequest {
    fn attrs(&self) -> RequestAttrs<'_> {
        RequestAttrs {
            caller: self.caller.as_deref(),
            procedure: self.procedure.as_deref(),
            subjects: self.subjects.each_ref().map(Option::as_deref),
            criticality: Default::default(),
        }
    }
}

/// Hits, misses, missing attributes and subjects.
fn requests() -> Vec<OwnedRequest> {
    (0..200)
        .map(|i| OwnedRequest {
            caller: (i % 7 != 0).then(|| format!("svc-{}", i % 45)),
            procedure: (i % 11 != 0).then(|| format!("/svc.v1.Service/M{}", i % 27)),
            subjects: [
                (i % 3 == 0).then(|| format!("user-{i}")),
                (i % 5 == 0).then(|| format!("org-{}", i % 25)),
                None,
                None,
            ],
        })
        .collect()
}

#[test]
fn the_counter_sees_a_deliberate_allocation() {
    // Without this, a counter that never counts would make the test below pass vacuously.
    assert!(allocations_in(|| Vec::<u8>::with_capacity(16)) >= 1);
    let mut out = Matches::new();
    let matcher = Matcher::compile(&[MatchSpec::default()]);
    // A cold, empty buffer has to grow on its first match: the counter must see that too.
    assert!(allocations_in(|| matcher.find(&RequestAttrs::default(), &mut out)) >= 1);
}

#[test]
fn find_allocates_nothing_after_warm_up() {
    let matcher = Matcher::compile(&thousand_buckets());
    let requests = requests();
    let mut out = Matches::new();
    for request in &requests {
        matcher.find(&request.attrs(), &mut out);
    }
    let mut found = 0;
    let allocations = allocations_in(|| {
        for _ in 0..50 {
            for request in &requests {
                matcher.find(&request.attrs(), &mut out);
                found += out.len();
            }
        }
    });
    assert_eq!(allocations, 0);
    // The lookups did real work: many matched, some several buckets at once.
    assert!(found > 10_000, "only {found} matches");
}

#[test]
fn a_buffer_sized_by_the_matcher_never_allocates_even_cold() {
    let matcher = Matcher::compile(&thousand_buckets());
    let requests = requests();
    let mut out = matcher.matches_buffer();
    let allocations = allocations_in(|| {
        for request in &requests {
            matcher.find(&request.attrs(), &mut out);
        }
    });
    assert_eq!(allocations, 0);
}
