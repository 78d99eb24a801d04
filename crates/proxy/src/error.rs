//! Why the proxy could not start.

use std::net::SocketAddr;

use spillway_client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The configuration file is unreadable or invalid (exit status 2).
    #[error(transparent)]
    Config(#[from] ClientError),
    /// `--upstream` is not a plain `http://HOST:PORT` URL.
    #[error(
        "upstream \"{url}\": {problem}; write it like http://127.0.0.1:8080 (TLS to the upstream is not supported)"
    )]
    Upstream { url: String, problem: String },
    /// The aggregator's URL is unusable (exit status 2).
    #[error("aggregator: {0}")]
    Aggregator(#[source] spillway_client::control::UrlError),
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A serving thread or its runtime could not be started.
    #[error("cannot start a worker thread: {0}")]
    Workers(#[source] std::io::Error),
}

impl ProxyError {
    /// Bad configuration or usage (exit 2), as opposed to a runtime failure (exit 1).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ProxyError::Config(_) | ProxyError::Upstream { .. } | ProxyError::Aggregator(_)
        )
    }
}
