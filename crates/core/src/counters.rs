//! Per-bucket counters (offered, allowed, dropped, shadow-dropped), striped per thread.
