//! spillway-loop's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

mod support;

mod aggregator_pairs;
mod feedback;
mod fencing;
mod plausibility;
mod rules_limits;
mod silent;
mod wire_evolution;
mod wire_fuzz;
