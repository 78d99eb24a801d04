//! One million per-subject buckets stay within `SUBJECT_BYTES_BOUND` bytes each, and evicting
//! them gives the memory back. Measured with a global allocator that models glibc's chunks.

use std::sync::Arc;

use spillway_client::{Client, NoHeaders, SUBJECT_BYTES_BOUND};
use spillway_core::clock::FakeClock;
use spillway_core::config::load_str;
use spillway_core::pattern::{RequestAttrs, SubjectKind};
use spillway_testkit::alloc::live_bytes;

const SUBJECTS: usize = 1_000_000;

// nextest runs it in a process of its own, so no other test allocates while it measures.
#[test]
fn one_million_subjects_stay_within_the_bound_and_are_evicted_when_idle() {
    let clock = Arc::new(FakeClock::new(1));
    let config = load_str(
        "version: 1\nservices:\n  api:\n    buckets:\n      - { name: per-user, match: { user: \"*\" }, limit: 100/min, algorithm: token-bucket }\n",
        "test.yaml",
    )
    .unwrap();
    let client = Client::with_clock(config, clock.clone()).unwrap();
    let mut id = String::with_capacity(32);
    let before = live_bytes();
    for n in 0..SUBJECTS {
        use std::fmt::Write;
        id.clear();
        write!(id, "user-{n:07}").unwrap(); // 12 bytes, like a short id
        let mut attrs = RequestAttrs::default();
        attrs.subjects[SubjectKind::User.index()] = Some(&id);
        assert!(client.decide(&attrs, &NoHeaders).forwards());
    }
    let used = live_bytes() - before;
    let per_subject = used as f64 / SUBJECTS as f64;
    println!("{SUBJECTS} subjects: {used} bytes, {per_subject:.1} bytes per subject");
    let rules = client.rules();
    let bucket = &rules.buckets()[0];
    assert_eq!(bucket.subjects(), Some(SUBJECTS));
    assert!(
        per_subject <= SUBJECT_BYTES_BOUND as f64,
        "{per_subject:.1} bytes per subject, over the documented {SUBJECT_BYTES_BOUND}"
    );

    // Idle past the eviction time: the next sweep frees them all, and the memory with them.
    clock.advance(bucket.subject_idle().unwrap());
    assert_eq!(client.tick(), SUBJECTS);
    assert_eq!(bucket.subjects(), Some(0));
    let left = live_bytes() - before;
    assert!(
        left < 64 * 1024,
        "{left} bytes still held after evicting every subject"
    );
}
