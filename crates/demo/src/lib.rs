//! Spillway in one process: `spillway demo` (a rules store, a controller, two zones with an
//! aggregator each, four sidecars, an upstream and a load generator that runs a 15x surge, with a
//! live view, a summary and a chart) and `spillway up` (a real single node).
//!
//! The demo measures what MISSION G11 and G16 are about: how long after a 15x surge the fleet
//! admits the limit again (the enforcement delay), how close to the limit it stays, and what
//! the sidecar adds to the latency of a request.
#![forbid(unsafe_code)]

pub mod chart;
pub mod demo;
pub mod load;
pub mod node;
pub mod store;
pub mod summary;
pub mod view;

pub use demo::{DemoOptions, run};
pub use node::{Node, NodeOptions};
pub use summary::Summary;

/// Why the demo or a node could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The configuration is invalid (exit status 2).
    #[error("{0}")]
    Config(String),
    #[error("rules store: {0}")]
    Store(String),
    #[error("control plane: {0}")]
    Control(#[from] spillway_control::ControlError),
    #[error("proxy: {0}")]
    Proxy(#[from] spillway_proxy::ProxyError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("chart: {0}")]
    Chart(String),
}

impl DemoError {
    fn store(err: spillway_rules::StoreError) -> Self {
        DemoError::Store(err.to_string())
    }

    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| DemoError::Io { what, source }
    }

    /// Bad configuration or usage (exit 2), as opposed to a runtime failure (exit 1).
    pub fn is_usage(&self) -> bool {
        match self {
            DemoError::Config(_) => true,
            DemoError::Proxy(e) => e.is_usage(),
            DemoError::Control(e) => e.is_usage(),
            _ => false,
        }
    }
}
