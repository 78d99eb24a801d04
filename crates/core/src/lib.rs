//! Spillway's core: everything a decision needs, and nothing that does I/O.
//!
//! The configuration model ([`config`]) is parsed and validated once; [`matcher`] compiles it into
//! a structure that finds the buckets of a request without allocating; [`algo`] holds every
//! limiter algorithm and [`control`] the drop-ratio math that the control plane runs. Time always
//! comes from a [`clock::Clock`], so the simulator and the tests drive the same code with a fake
//! clock.
#![forbid(unsafe_code)]

pub mod algo;
pub mod clock;
pub mod concurrency;
pub mod config;
pub mod control;
pub mod counters;
pub mod criticality;
pub mod decision;
pub mod descriptor;
pub mod history;
pub mod import;
pub mod leadership;
pub mod limit;
pub mod matcher;
pub mod pattern;
pub mod request_id;
pub mod rule;
pub mod rules;
pub mod surge;
pub mod time;
