//! Why a control-plane component could not start or go on.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}")]
    Config(#[from] spillway_core::config::ConfigError),
    #[error("cannot render the rules as YAML: {0}")]
    Render(String),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "\"{url}\" is not a usable gRPC address ({reason}); write it like http://127.0.0.1:7001"
    )]
    Url { url: String, reason: String },
}
