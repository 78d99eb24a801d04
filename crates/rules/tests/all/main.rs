//! The rules service's integration tests, one binary: one test crate to compile and link
//! instead of one per file, each of which built the service's server, client and store anew.

#[macro_use]
mod common;

mod api;
mod bounds;
mod docs;
mod follow;
mod history;
mod limits;
mod outage;
mod tls;
mod tokens;
mod typed_client;
mod watch;
mod whoami;
