//! spillway-core's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

// One global allocator for every test here: it counts one thread's allocations when asked
// and the process's live heap, and nextest runs each test in a process of its own.
#[global_allocator]
static ALLOCATOR: spillway_testkit::alloc::CountingAllocator =
    spillway_testkit::alloc::CountingAllocator;

mod algo_bounds;
mod algo_quota;
mod algo_reference;
mod algo_retry_after;
mod algo_threads;
mod concurrency_alloc;
mod concurrency_sim;
mod config_broken;
mod config_docs;
mod config_fuzz;
mod config_limits;
mod config_model;
mod config_redis_password;
mod config_warnings;
mod control_drop_ratio;
mod control_smoothing;
mod counters_striped;
mod descriptor_match;
mod import_fuzz;
mod matcher_alloc;
mod matcher_cases;
mod matcher_props;
