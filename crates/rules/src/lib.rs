//! Spillway's rules service (S1-S4): rules in PostgreSQL or SQLite, changed through one audited
//! REST API within a daily budget, and announced to every follower as soon as they commit.
//!
//! - [`store`] holds users, rules, the audit log and the rules version;
//! - [`api`] serves SPEC §4 over it, [`problem`] maps its errors to RFC 9457 answers;
//! - [`watch`] follows a store for the controller and the proxy ([`RulesWatcher`]), and
//!   [`follow`](mod@follow) turns what it announces into the rules they run;
//! - [`client`] is the blocking HTTP client the `spillway rules` commands use.
#![forbid(unsafe_code)]

pub mod api;
pub mod auth;
pub mod client;
pub mod follow;
pub mod problem;
pub mod rule;
pub mod store;
pub mod time;
pub mod watch;

pub use api::{ApiDoc, bind_and_serve, serve};
pub use follow::{apply_each, follow};
pub use rule::{Rule, RuleError};
pub use store::{Budgets, Role, Store, StoreError, User};
pub use watch::{RuleSet, RulesWatcher};
