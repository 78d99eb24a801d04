//! Spillway's rules service: rules in PostgreSQL or SQLite, changed through one audited
//! REST API within a daily budget, and announced to every follower as soon as they commit.
//!
//! - [`store`] holds users, rules, the audit log and the rules version;
//! - [`api`] serves the REST API over it (and, in `access`, its users and tokens),
//!   [`auth`] checks bearer tokens, [`problem`] maps its errors to RFC 9457 answers, and
//!   [`server`] serves it in plaintext or over TLS;
//! - [`watch`] follows a store for the controller and the proxy ([`RulesWatcher`]), and
//!   [`follow`](mod@follow) turns what it announces into the rules they run;
//! - [`client`] is the blocking HTTP and HTTPS client the `spillway rules` commands use.
#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod client;
pub mod follow;
pub mod problem;
pub mod rule;
pub mod server;
pub mod store;
pub mod time;
mod token_hash;
pub mod trace;
pub mod watch;

pub use api::ApiDoc;
pub use follow::{apply_each, follow};
pub use rule::{Bounds, MAX_REASON_BYTES, Rule, RuleError};
pub use server::{ServerTls, bind_and_serve, serve, serve_tls, serve_with};
pub use store::{AccessError, Budgets, Role, Store, StoreError, TokenInfo, User, UserInfo};
pub use watch::{RuleSet, RulesWatcher};
