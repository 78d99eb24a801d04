//! spillway-control's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

mod support;

mod feedback;
mod leave;
mod peer_region;
mod plausibility;
mod rules_as_data;
mod zone_wire;
