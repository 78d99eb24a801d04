//! The compiled matcher on the edge cases that matter to configurations: missing attributes, an
//! empty configuration, subjects, `*` against a missing key, and a glob and an exact value on the
//! same key.

use spillway_core::decision::BucketId;
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

fn with_subject(mut spec: MatchSpec, kind: SubjectKind, value: &str) -> MatchSpec {
    spec.subject = Some(Subject {
        kind,
        value: SubjectValue::new(value),
    });
    spec
}

fn request<'a>(caller: Option<&'a str>, procedure: Option<&'a str>) -> RequestAttrs<'a> {
    RequestAttrs {
        caller,
        procedure,
        ..RequestAttrs::default()
    }
}

fn find(matcher: &Matcher, request: &RequestAttrs<'_>) -> Vec<u32> {
    let mut out = Matches::new();
    matcher.find(request, &mut out);
    out.iter().map(|bucket| bucket.0).collect()
}

#[test]
fn an_empty_configuration_matches_nothing() {
    let matcher = Matcher::compile(&[]);
    assert!(matcher.is_empty());
    assert_eq!(matcher.max_matches(), 0);
    assert_eq!(find(&matcher, &request(Some("gw"), Some("/a"))), [0u32; 0]);
    assert_eq!(find(&matcher, &RequestAttrs::default()), [0u32; 0]);
}

#[test]
fn a_spec_without_keys_matches_every_request_even_an_empty_one() {
    let matcher = Matcher::compile(&[MatchSpec::default()]);
    assert_eq!(find(&matcher, &RequestAttrs::default()), [0]);
    assert_eq!(find(&matcher, &request(Some("gw"), Some("/a"))), [0]);
}

#[test]
fn a_key_in_the_spec_requires_the_attribute_in_the_request() {
    let specs = [
        spec(Some("gw"), None),
        spec(None, Some("/a")),
        spec(Some("gw"), Some("/a")),
    ];
    let matcher = Matcher::compile(&specs);
    assert_eq!(find(&matcher, &request(Some("gw"), None)), [0]);
    assert_eq!(find(&matcher, &request(None, Some("/a"))), [1]);
    assert_eq!(find(&matcher, &request(None, None)), [0u32; 0]);
    assert_eq!(find(&matcher, &request(Some("gw"), Some("/a"))), [0, 1, 2]);
}

#[test]
fn a_star_matches_any_value_but_not_a_missing_attribute() {
    let specs = [spec(Some("*"), None), spec(None, Some("*"))];
    let matcher = Matcher::compile(&specs);
    assert_eq!(find(&matcher, &request(Some(""), None)), [0]);
    assert_eq!(find(&matcher, &request(None, Some("/x"))), [1]);
    assert_eq!(find(&matcher, &request(None, None)), [0u32; 0]);
}

#[test]
fn an_each_subject_requires_the_request_to_carry_it() {
    let specs = [with_subject(
        spec(None, Some("/search")),
        SubjectKind::User,
        "*",
    )];
    let matcher = Matcher::compile(&specs);
    let mut search = request(None, Some("/search"));
    assert_eq!(find(&matcher, &search), [0u32; 0]);
    // Another subject does not stand in for the user.
    search.subjects[SubjectKind::Org.index()] = Some("acme");
    assert_eq!(find(&matcher, &search), [0u32; 0]);
    search.subjects[SubjectKind::User.index()] = Some("alice");
    assert_eq!(find(&matcher, &search), [0]);
}

#[test]
fn subject_values_and_globs_filter_the_candidates() {
    let specs = [
        with_subject(MatchSpec::default(), SubjectKind::Ip, "10.0.0.1"),
        with_subject(MatchSpec::default(), SubjectKind::Ip, "10.*"),
        with_subject(MatchSpec::default(), SubjectKind::ApiKey, "10.0.0.1"),
    ];
    let matcher = Matcher::compile(&specs);
    let mut req = RequestAttrs::default();
    req.subjects[SubjectKind::Ip.index()] = Some("10.0.0.1");
    assert_eq!(find(&matcher, &req), [0, 1]);
    req.subjects[SubjectKind::Ip.index()] = Some("10.9.9.9");
    assert_eq!(find(&matcher, &req), [1]);
    req.subjects[SubjectKind::Ip.index()] = Some("192.168.0.1");
    assert_eq!(find(&matcher, &req), [0u32; 0]);
}

#[test]
fn a_glob_and_an_exact_value_on_the_same_key_both_match_in_bucket_order() {
    // The glob comes first so that order by bucket id differs from order by group.
    let specs = [
        spec(Some("api-*"), Some("/a")),
        spec(Some("api-1"), Some("/a")),
        spec(Some("api-*"), Some("/a/*")),
        spec(Some("api-1"), Some("/a/x")),
    ];
    let matcher = Matcher::compile(&specs);
    assert_eq!(find(&matcher, &request(Some("api-1"), Some("/a"))), [0, 1]);
    assert_eq!(find(&matcher, &request(Some("api-2"), Some("/a"))), [0]);
    assert_eq!(
        find(&matcher, &request(Some("api-1"), Some("/a/x"))),
        [2, 3]
    );
    assert_eq!(find(&matcher, &request(Some("api"), Some("/a"))), [0u32; 0]);
}

#[test]
fn results_from_every_group_come_out_in_ascending_bucket_order() {
    let specs = [
        spec(None, None),
        spec(Some("gw"), Some("/a")),
        spec(Some("*"), Some("/a")),
        spec(Some("g*"), None),
        spec(None, Some("/*")),
        spec(Some("gw"), None),
        spec(Some("gw"), Some("/a")),
    ];
    let matcher = Matcher::compile(&specs);
    assert_eq!(
        find(&matcher, &request(Some("gw"), Some("/a"))),
        [0, 1, 2, 3, 4, 5, 6]
    );
}

#[test]
fn identical_specs_are_distinct_buckets() {
    let specs = [spec(Some("gw"), Some("/a")), spec(Some("gw"), Some("/a"))];
    let matcher = Matcher::compile(&specs);
    assert_eq!(find(&matcher, &request(Some("gw"), Some("/a"))), [0, 1]);
}

#[test]
fn find_replaces_the_previous_result() {
    let specs = [spec(Some("gw"), None), spec(Some("other"), None)];
    let matcher = Matcher::compile(&specs);
    let mut out = matcher.matches_buffer();
    matcher.find(&request(Some("gw"), None), &mut out);
    assert_eq!(out.as_slice(), [BucketId(0)]);
    matcher.find(&request(Some("other"), None), &mut out);
    assert_eq!(out.as_slice(), [BucketId(1)]);
    matcher.find(&request(Some("nobody"), None), &mut out);
    assert!(out.is_empty());
}

#[test]
fn exact_keys_are_compared_whole_and_case_sensitively() {
    let specs = [spec(Some("gw"), None), spec(Some(""), None)];
    let matcher = Matcher::compile(&specs);
    assert_eq!(find(&matcher, &request(Some("GW"), None)), [0u32; 0]);
    assert_eq!(find(&matcher, &request(Some("gw2"), None)), [0u32; 0]);
    assert_eq!(find(&matcher, &request(Some(""), None)), [1]);
}
