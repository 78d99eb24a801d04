//! Subjects of any length cost a bounded amount of memory: one million distinct subjects of the
//! longest value kept as it is (256 bytes) stay within `SUBJECT_BYTES_MAX` bytes each, one million
//! of 1 KiB (keyed by their SHA-256) within `SUBJECT_BYTES_BOUND`, and deciding a known long
//! subject allocates nothing. Measured with a global allocator that models glibc's chunks.

use std::sync::Arc;

use spillway_client::{
    Client, NoHeaders, SUBJECT_BYTES_BOUND, SUBJECT_BYTES_MAX, SUBJECT_VALUE_MAX,
};
use spillway_core::clock::FakeClock;
use spillway_core::config::load_str;
use spillway_core::pattern::{RequestAttrs, SubjectKind};
use spillway_testkit::alloc::{allocations, live_bytes};

const SUBJECTS: usize = 1_000_000;

/// Decides one request for each of `SUBJECTS` distinct values of `length` bytes (a counter in a
/// buffer of `x`s, written in place so the test itself allocates nothing per subject) and returns
/// the heap bytes held per subject afterwards; then lets them idle past the eviction time and
/// checks that they are all evicted and their memory given back.
fn per_subject(client: &Client, clock: &FakeClock, length: usize) -> f64 {
    let mut value = vec![b'x'; length];
    let before = live_bytes();
    for n in 0..SUBJECTS {
        format_counter(n, &mut value);
        let id = std::str::from_utf8(&value).unwrap();
        let mut attrs = RequestAttrs::default();
        attrs.subjects[SubjectKind::User.index()] = Some(id);
        assert!(client.decide(&attrs, &NoHeaders).forwards());
    }
    let used = live_bytes() - before;
    let rules = client.rules();
    let bucket = &rules.buckets()[0];
    assert_eq!(bucket.subjects(), Some(SUBJECTS), "{length}-byte values");
    clock.advance(bucket.subject_idle().unwrap());
    assert_eq!(client.tick(), SUBJECTS);
    assert_eq!(bucket.subjects(), Some(0));
    let left = live_bytes() - before;
    assert!(
        left < 64 * 1024,
        "{left} bytes still held after evicting every {length}-byte subject"
    );
    used as f64 / SUBJECTS as f64
}

/// Writes `n` in decimal, zero-padded to 20 digits, at the start of `value`.
fn format_counter(mut n: usize, value: &mut [u8]) {
    for digit in value[..20].iter_mut().rev() {
        *digit = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

// nextest runs it in a process of its own, so no other test allocates while it measures.
#[test]
fn a_million_subjects_of_any_length_stay_within_their_bound() {
    let clock = Arc::new(FakeClock::new(1));
    let config = load_str(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: per-user, match: { user: \"*\" }, limit: 100/d, algorithm: token-bucket }\n",
        "test.yaml",
    )
    .unwrap();
    let client = Client::with_clock(config, clock.clone()).unwrap();

    // The longest values kept as they are: the most a subject can cost.
    let longest = per_subject(&client, &clock, SUBJECT_VALUE_MAX);
    println!("{SUBJECTS} subjects of {SUBJECT_VALUE_MAX} bytes: {longest:.1} bytes per subject");
    assert!(
        longest <= SUBJECT_BYTES_MAX as f64,
        "{longest:.1} bytes per subject, over the documented {SUBJECT_BYTES_MAX}"
    );

    // Longer values key by their 64-byte SHA-256: they cost like short ids, whatever their
    // length.
    let hashed = per_subject(&client, &clock, 1024);
    println!("{SUBJECTS} subjects of 1024 bytes: {hashed:.1} bytes per subject");
    assert!(
        hashed <= SUBJECT_BYTES_BOUND as f64,
        "{hashed:.1} bytes per 1 KiB subject, over the documented {SUBJECT_BYTES_BOUND}"
    );

    // A known long subject is decided without allocating: its key is hashed on the stack.
    let long = "y".repeat(64 * 1024);
    let mut attrs = RequestAttrs::default();
    attrs.subjects[SubjectKind::User.index()] = Some(&long);
    assert!(client.decide(&attrs, &NoHeaders).forwards());
    let before = allocations();
    for _ in 0..50 {
        assert!(client.decide(&attrs, &NoHeaders).forwards());
    }
    assert_eq!(
        allocations() - before,
        0,
        "deciding a known 64 KiB subject allocated"
    );
}
