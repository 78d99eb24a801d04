//! Spillway's transport security: SPIFFE identities ([`identity`]), a process's
//! certificate files re-read when they change ([`files`]), the dialling side of a mutual-TLS
//! link that verifies the server by identity ([`client`]), listeners that hand each
//! connection's verified identity to the services ([`server`], feature `server`), a
//! development PKI ([`certs`], feature `dev-pki`), and the stop signal and accept loop every
//! task and listener of a role shares ([`stop`]).
#![forbid(unsafe_code)]

#[cfg(feature = "dev-pki")]
pub mod certs;
pub mod client;
pub mod files;
pub mod identity;
#[cfg(feature = "server")]
pub mod server;
pub mod stop;

pub use client::{Connector, Expect};
pub use files::{TlsError, TlsFiles, TlsSource};
pub use identity::{DEFAULT_TRUST_DOMAIN, Identity, IdentityError, SanPolicy, WorkloadRole};
pub use stop::{Stop, accept_until, sleep_or_stop, stopped};
