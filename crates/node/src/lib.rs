//! One real Spillway node in one process (`spillway up`): the rules service on its store, a
//! controller following it, one zone's aggregator and a sidecar linked to it.
//!
//! A production single-node deployment, not a demonstration: `spillway demo` lives in
//! `spillway-demo` and borrows only the store seeding ([`seed_and_follow`]) and the audit log
//! its dashboard lists ([`follow_changes`]) from here.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;

use spillway_loop::RulesError;
use spillway_rules::StoreError;
use spillway_rules::store::ChangeError;

pub mod changes;
pub mod node;
pub mod store;

pub use changes::follow_changes;
pub use node::{Node, NodeOptions};
pub use store::{StoreRules, seed_and_follow};

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration file is unreadable or invalid (exit status 2).
    #[error("{0}")]
    Config(String),
    /// The store's rules cannot be rendered with the file's sections.
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error("rules store: {0}")]
    Store(#[from] StoreError),
    /// The store refused the file's rules (a conflict, or the seeding user's daily budget).
    #[error("cannot seed the rules store from the file: {0}")]
    Seed(#[from] ChangeError),
    #[error("cannot create the state directory {}: {source}", path.display())]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The rules service's address (the other parts report theirs as control or proxy errors).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("control plane: {0}")]
    Control(#[from] spillway_control::ControlError),
    #[error("proxy: {0}")]
    Proxy(#[from] spillway_proxy::ProxyError),
}

impl NodeError {
    /// Bad configuration or usage (exit 2), as opposed to a runtime failure (exit 1).
    pub fn is_usage(&self) -> bool {
        match self {
            NodeError::Config(_) | NodeError::Rules(RulesError::Config(_)) => true,
            NodeError::Proxy(e) => e.is_usage(),
            NodeError::Control(e) => e.is_usage(),
            _ => false,
        }
    }
}
