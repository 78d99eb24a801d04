//! spillway-rls's integration tests, one binary: one test crate to compile and link instead of
//! one per file.

mod support;

mod redis;
mod rlqs;
mod rlqs_identity;
mod rls;
mod settle;
mod tls;
