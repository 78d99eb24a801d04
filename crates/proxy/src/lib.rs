//! The Spillway sidecar (`spillway proxy`): an HTTP/1.1 and h2c reverse proxy that decides every
//! request in-process with [`spillway_client`] (G1) and forwards what it admits.
//!
//! [`Proxy::start`] binds the listener (and the admin listener), loads the rules from the file
//! and watches it; [`Proxy::shutdown`] stops accepting and drains the requests in flight. What the
//! proxy answers on its own account (429, gRPC `RESOURCE_EXHAUSTED`, 502) is decided in one
//! place, [`answer`].
#![forbid(unsafe_code)]

mod admin;
pub mod answer;
mod control;
mod error;
mod forward;
mod h1;
mod pause;
mod server;

pub use error::ProxyError;
pub use server::{DRAIN_GRACE, Proxy, ProxyOptions};
