//! The Spillway sidecar (`spillway proxy`): an HTTP/1.1 and h2c reverse proxy that decides every
//! request in-process with [`spillway_client`] and forwards what it admits.
//!
//! [`Proxy::start`] binds the listener (and the admin listener), loads the rules from the file
//! and watches it; [`Proxy::shutdown`] stops accepting and drains the requests in flight. What the
//! proxy answers on its own account (429, gRPC `RESOURCE_EXHAUSTED`, 502) is decided in one
//! place, [`answer`].
//!
//! What one client can hold is bounded: connections ([`ProxyOptions::max_connections`],
//! derived by [`default_max_connections`] from the descriptor limit that [`raise_fd_limit`]
//! raises), the time a connection waits for a request or an HTTP/2 connection has no stream
//! ([`ProxyOptions::header_timeout`], [`ProxyOptions::idle_timeout`]), the time a request body
//! may make no progress ([`ProxyOptions::body_timeout`]) and a request head's size
//! ([`ProxyOptions::max_head`]).
#![forbid(unsafe_code)]

mod admin;
pub mod answer;
mod body;
mod control;
mod downstream;
mod error;
mod forward;
mod forwarded;
mod handle;
mod hop;
mod limits;
mod options;
mod pause;
pub mod request_id;
mod server;
mod shared;
mod upgrade;
mod usage;
mod worker;

pub use admin::EngineView;
pub use control::start_engine;
pub use error::ProxyError;
pub use limits::{FD_RESERVE, FdLimit, default_max_connections, fd_soft_limit, raise_fd_limit};
pub use options::{DEFAULT_MAX_HEAD, DRAIN_GRACE, ForwardedFields, ProxyOptions};
pub use server::Proxy;
