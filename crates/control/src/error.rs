//! Why a control-plane server could not start or go on.

use std::path::PathBuf;

use spillway_link::UrlError;
use spillway_loop::RulesError;
use spillway_net::BindError;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The process's certificate does not name the role it runs as.
    #[error("{0}")]
    Identity(String),
}

impl ControlError {
    /// Whether the fault is in what the operator gave (an invalid rules file, an unreadable path,
    /// an unusable address) rather than in the running system: the command line exits 2 then.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            ControlError::Rules(RulesError::Config(_))
                | ControlError::Url(_)
                | ControlError::Read { .. }
                | ControlError::Identity(_)
        )
    }
}
