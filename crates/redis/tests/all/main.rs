//! spillway-redis's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

mod common;

mod batch;
mod breaker;
mod breaker_idle;
mod cluster;
mod scripts;
mod sentinel;
