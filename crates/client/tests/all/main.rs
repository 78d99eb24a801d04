//! spillway-client's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

// One global allocator for every test here: it counts one thread's allocations when asked
// and the process's live heap, and nextest runs each test in a process of its own.
#[global_allocator]
static ALLOCATOR: spillway_testkit::alloc::CountingAllocator =
    spillway_testkit::alloc::CountingAllocator;

#[cfg(feature = "redis")]
mod redis_auth;

mod acquire;
mod decide;
mod descriptor_alloc;
mod descriptors;
mod identify_alloc;
mod layer;
mod path_props;
mod redis_password_env;
mod redis_password_file;
mod subjects_long;
mod subjects_memory;
mod surge;
mod tokens;
mod watch;
mod without_redis;
