//! spillway-configure's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

mod builtin;
mod forecast_accuracy;
mod plan;
mod prometheus;
