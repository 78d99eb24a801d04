//! Giving freed memory back to the system, for servers whose clients come and go in crowds.

/// Returns the pages the allocator holds free to the system. glibc keeps what a process frees in
/// its arenas' free lists, counted in its RSS: an aggregator whose RLQS hosts held 100 MB of
/// bucket ids and decoded reports would show that RSS long after they ended. `malloc_trim` walks
/// every arena and releases each free page (at most once a second, after hosts end); other
/// allocators have nothing to give back here.
pub fn release() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only releases memory the allocator holds free; it
    // is safe to call at any time from any thread (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}
