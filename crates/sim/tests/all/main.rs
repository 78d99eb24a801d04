//! spillway-sim's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

mod goals;
mod invariants;
