//! The client side of Spillway's control link, with no server in it: what an embedding client or
//! a sidecar needs to report to its zone's aggregator and follow the instructions that come back
//! ([`ClientLink`]), and what every reconnecting link of the control plane shares: the wall clock
//! the cores are given, endpoints, the stop signal, capped and jittered [`Backoff`] and the one
//! reconnect loop ([`reconnect`]); and the face a zone shows to clients in its aggregator's own
//! process ([`ZoneClients`]).
#![forbid(unsafe_code)]

mod backoff;
mod client;
mod clock;
mod local;
mod session;

pub use backoff::Backoff;
pub use client::{
    ClientLink, HostLimiters, Housekeeping, LinkOptions, LinkStatus, rules_handshake,
};
pub use clock::{now_ms, now_unix_ns};
pub use local::{InstructionsRx, LocalRefusal, ZoneClient, ZoneClients};
pub use session::{
    CONNECT_TIMEOUT, FAILOVER_MAX_WAIT, LEADER_HINT, OPEN_TIMEOUT, SILENT_INTERVALS, SessionError,
    Stop, Target, UrlError, endpoint, open_stream, reconnect, reconnect_any, silence_limit,
    sleep_or_stop, stopped,
};
