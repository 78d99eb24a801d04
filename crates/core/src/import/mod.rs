//! Other rate limiters' configurations as Spillway's: pure conversions from text to a
//! configuration file, with errors that say where and what, as the loader's do.

pub mod envoy_ratelimit;
mod yaml;
