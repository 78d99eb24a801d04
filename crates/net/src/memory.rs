//! Giving freed memory back to the system, for servers whose clients come and go in crowds (RLQS
//! hosts on an aggregator, a burst of made-up tokens at the rules service).

/// Asks glibc to hand the free pages of its arenas back to the system. glibc keeps what a
/// process frees in the free lists of the arena of the thread that freed it, counted in the
/// process's RSS: an aggregator whose RLQS hosts held 100 MB of bucket ids, or a rules service
/// after a burst of argon2 checks (4 MiB each), would show that RSS long after. Callers run it
/// on a blocking thread after such a burst, at most about once a second. Elsewhere (another libc
/// or allocator) it does nothing.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn return_free_memory() {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: malloc_trim takes no pointer and only releases memory no allocation holds; glibc
    // locks each arena while it trims it, so it is safe beside other threads' allocations.
    unsafe {
        malloc_trim(0);
    }
}

/// Asks the allocator to hand its free memory back: only glibc's needs asking.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn return_free_memory() {}
