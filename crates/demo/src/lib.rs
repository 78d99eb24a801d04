//! `spillway demo`: the whole system in one process (a rules store, a controller, two zones with
//! an aggregator each, four sidecars, an upstream and a load generator that runs a 15x surge),
//! with a live view, a summary and a chart. The real single node, `spillway up`, is
//! `spillway-node`.
//!
//! `--scenario tokens` runs token budgets instead ([`tokens`]): a fake LLM API, sidecars with a
//! budget of tokens per API key charged when each response ends, and keys offering more.
//!
//! The demo measures what the demo is are about: how long after a 15x surge the fleet
//! admits the limit again (the enforcement delay), how close to the limit it stays, and what
//! the sidecar adds to the latency of a request.
#![forbid(unsafe_code)]

pub mod chart;
pub mod demo;
pub mod load;
pub mod summary;
pub mod tokens;
pub mod view;

pub use demo::{DASHBOARD, Demo, DemoOptions, run};
pub use summary::Summary;
pub use tokens::{TokensOptions, TokensSummary, run_tokens};

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Seeding or following the demo's rules store (the same code as `spillway up`'s).
    #[error(transparent)]
    Store(#[from] spillway_node::NodeError),
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
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| DemoError::Io { what, source }
    }

    /// Bad configuration or usage (exit 2), as opposed to a runtime failure (exit 1).
    pub fn is_usage(&self) -> bool {
        match self {
            DemoError::Store(e) => e.is_usage(),
            DemoError::Proxy(e) => e.is_usage(),
            DemoError::Control(e) => e.is_usage(),
            _ => false,
        }
    }
}
