//! The compiled matcher against the reference definition (`MatchSpec::matches`) on random
//! configurations and requests drawn from small vocabularies, so that exact keys collide, globs
//! overlap exact keys and subjects are sometimes missing.

use proptest::prelude::*;
use proptest::sample::select;
use spillway_core::decision::BucketId;
use spillway_core::matcher::{Matcher, Matches};
use spillway_core::pattern::{
    MatchSpec, Pattern, RequestAttrs, Subject, SubjectKind, SubjectValue,
};

// Multi-byte values make sure glob prefixes are compared as bytes, never sliced mid-character.
const CALLER_PATTERNS: &[&str] = &[
    "gw", "api", "api-1", "api-2", "api-*", "*", "g*", "*-1", "", "\u{fc}*", "\u{fc}b*",
];
const PROCEDURE_PATTERNS: &[&str] = &["/a", "/b", "/a/x", "/a/*", "/*", "*", "/a/x*", "**"];
const SUBJECT_PATTERNS: &[&str] = &["*", "alice", "bob", "a*", "*e", ""];

const CALLERS: &[&str] = &[
    "gw",
    "api",
    "api-1",
    "api-2",
    "api-3",
    "g",
    "x-1",
    "",
    "\u{fc}",
    "\u{fc}ber",
    "a\u{fc}",
];
const PROCEDURES: &[&str] = &["/a", "/b", "/a/x", "/a/xy", "/c", "/", ""];
const SUBJECTS: &[&str] = &["alice", "bob", "ann", "eve", ""];

fn pattern(vocabulary: &'static [&'static str]) -> impl Strategy<Value = Option<Pattern>> {
    proptest::option::weighted(0.7, select(vocabulary).prop_map(Pattern::new))
}

fn subject() -> impl Strategy<Value = Option<Subject>> {
    proptest::option::weighted(
        0.3,
        (select(&SubjectKind::ALL[..]), select(SUBJECT_PATTERNS)).prop_map(|(kind, value)| {
            Subject {
                kind,
                value: SubjectValue::new(value),
            }
        }),
    )
}

fn spec() -> impl Strategy<Value = MatchSpec> {
    (
        pattern(CALLER_PATTERNS),
        pattern(PROCEDURE_PATTERNS),
        subject(),
    )
        .prop_map(|(caller, procedure, subject)| MatchSpec {
            caller,
            procedure,
            subject,
        })
}

fn attribute(vocabulary: &'static [&'static str]) -> impl Strategy<Value = Option<&'static str>> {
    proptest::option::weighted(0.8, select(vocabulary))
}

fn request() -> impl Strategy<Value = RequestAttrs<'static>> {
    let subject = || proptest::option::weighted(0.5, select(SUBJECTS));
    (
        attribute(CALLERS),
        attribute(PROCEDURES),
        [subject(), subject(), subject(), subject()],
    )
        .prop_map(|(caller, procedure, subjects)| RequestAttrs {
            caller,
            procedure,
            subjects,
            criticality: Default::default(),
        })
}

fn reference(specs: &[MatchSpec], request: &RequestAttrs<'_>) -> Vec<BucketId> {
    (0..)
        .zip(specs)
        .filter(|(_, spec)| spec.matches(request))
        .map(|(bucket, _)| BucketId(bucket))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn find_returns_exactly_the_matching_buckets_in_ascending_order(
        specs in proptest::collection::vec(spec(), 0..300),
        requests in proptest::collection::vec(request(), 1..24),
    ) {
        let matcher = Matcher::compile(&specs);
        prop_assert_eq!(matcher.len(), specs.len());
        // One buffer for all requests: a stale result left from the previous lookup would show.
        let mut out = Matches::new();
        for request in &requests {
            matcher.find(request, &mut out);
            let expected = reference(&specs, request);
            prop_assert_eq!(out.as_slice(), expected.as_slice(), "request {:?}", request);
            prop_assert!(out.len() <= matcher.max_matches());
        }
    }
}
