//! Rule sets shared by the benchmarks: one bucket, and a 1,000-bucket mesh configuration.

// Each benchmark uses part of this module; what one leaves unused another uses.
#![allow(dead_code)]

use spillway_core::pattern::{
    MatchSpec, Pattern, RequestAttrs, Subject, SubjectKind, SubjectValue,
};

pub fn spec(caller: Option<&str>, procedure: Option<&str>) -> MatchSpec {
    MatchSpec {
        caller: caller.map(Pattern::new),
        procedure: procedure.map(Pattern::new),
        subject: None,
    }
}

/// One exact (caller, procedure) bucket.
pub fn one_bucket() -> Vec<MatchSpec> {
    vec![spec(
        Some("api-gateway"),
        Some("/payments.v1.Payments/Charge"),
    )]
}

/// A request that hits [`one_bucket`].
pub fn one_bucket_hit() -> RequestAttrs<'static> {
    RequestAttrs {
        caller: Some("api-gateway"),
        procedure: Some("/payments.v1.Payments/Charge"),
        ..RequestAttrs::default()
    }
}

/// The shape of a large mesh configuration: 950 exact (caller, procedure) pairs, 20 caller globs,
/// 20 procedure globs and 10 per-user buckets.
pub fn thousand_buckets() -> Vec<MatchSpec> {
    let mut specs = Vec::with_capacity(1000);
    for caller in 0..50 {
        for method in 0..19 {
            specs.push(spec(
                Some(&format!("svc-{caller}")),
                Some(&format!("/svc.v1.Service/Method{method}")),
            ));
        }
    }
    for team in 0..20 {
        specs.push(spec(
            Some(&format!("team{team}-*")),
            Some("/svc.v1.Service/Method0"),
        ));
    }
    for package in 0..20 {
        specs.push(spec(None, Some(&format!("/pkg{package}.v1.*"))));
    }
    for method in 0..10 {
        specs.push(MatchSpec {
            subject: Some(Subject {
                kind: SubjectKind::User,
                value: SubjectValue::Each,
            }),
            ..spec(None, Some(&format!("/svc.v1.Service/Method{method}")))
        });
    }
    specs
}

/// A request that hits an exact pair of [`thousand_buckets`] and one per-user bucket.
pub fn thousand_buckets_hit() -> RequestAttrs<'static> {
    let mut hit = RequestAttrs {
        caller: Some("svc-17"),
        procedure: Some("/svc.v1.Service/Method7"),
        ..RequestAttrs::default()
    };
    hit.subjects[SubjectKind::User.index()] = Some("alice");
    hit
}
