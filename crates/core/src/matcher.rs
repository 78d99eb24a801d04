//! Matching: from (caller, procedure, subjects) to the buckets that apply, without allocating.
