//! One million per-subject buckets stay within `SUBJECT_BYTES_BOUND` bytes each, and evicting
//! them gives the memory back. Measured with a global allocator that models glibc's chunks.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use spillway_client::{Client, NoHeaders, SUBJECT_BYTES_BOUND};
use spillway_core::clock::FakeClock;
use spillway_core::config::load_str;
use spillway_core::pattern::{RequestAttrs, SubjectKind};

/// Live heap bytes as the allocator would hold them: each request rounded up to a glibc chunk
/// (8 bytes of header, 16-byte alignment, 32 bytes at least), so the bound includes overhead.
static LIVE: AtomicIsize = AtomicIsize::new(0);

fn chunk(size: usize) -> isize {
    ((size + 8 + 15) & !15).max(32) as isize
}

struct Measuring;

// SAFETY (the only unsafe in spillway-client's tests): every method forwards its arguments
// unchanged to the system allocator, which upholds the `GlobalAlloc` contract; measuring only
// adds to an atomic.
unsafe impl GlobalAlloc for Measuring {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(chunk(layout.size()), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(chunk(layout.size()), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(chunk(new_size) - chunk(layout.size()), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Measuring = Measuring;

const SUBJECTS: usize = 1_000_000;

// The only test of this binary, so no other test allocates while it measures.
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
    let before = LIVE.load(Ordering::Relaxed);
    for n in 0..SUBJECTS {
        use std::fmt::Write;
        id.clear();
        write!(id, "user-{n:07}").unwrap(); // 12 bytes, like a short id
        let mut attrs = RequestAttrs::default();
        attrs.subjects[SubjectKind::User.index()] = Some(&id);
        assert!(client.decide(&attrs, &NoHeaders).forwards());
    }
    let used = LIVE.load(Ordering::Relaxed) - before;
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
    let left = LIVE.load(Ordering::Relaxed) - before;
    assert!(
        left < 64 * 1024,
        "{left} bytes still held after evicting every subject"
    );
}
