//! The sidecar on the control plane (`spillway proxy --aggregator`): which rules it starts with,
//! and the link that reports its counts and applies drop ratios, shares and rules.
//!
//! Linked, the proxy starts from the last good rules the control plane sent (kept in the state
//! directory), or from its file when there are none yet, and from then on takes its rules from
//! the control plane only: the file is not watched, so an edit on one host cannot fork it from
//! the fleet.

use std::path::Path;
use std::sync::Arc;

use spillway_client::control::{ControlOptions, ControlPlane, last_good_rules};
use spillway_client::{Client, ClientError};
use spillway_core::config;

use crate::error::ProxyError;
use crate::options::ProxyOptions;

/// The client the proxy decides with, and its control-plane link when it has an aggregator.
pub(crate) fn start(
    options: &ProxyOptions,
) -> Result<(Arc<Client>, Option<ControlPlane>), ProxyError> {
    start_engine(&options.config, options.control.as_ref())
}

/// A client from the file `config` and, with `control`, its control-plane link, started as the
/// proxy starts them (the last good rules from the state directory first): for a process that
/// decides like a sidecar without proxying, `spillway rls`. Standalone, the caller watches the
/// file (`spillway_client::watch_file`).
pub fn start_engine(
    config: &Path,
    control: Option<&ControlOptions>,
) -> Result<(Arc<Client>, Option<ControlPlane>), ProxyError> {
    let Some(control) = control else {
        return Ok((Arc::new(Client::from_file(config)?), None));
    };
    // Its own file gives what is this process's own (identity, redis) beside saved rules.
    let own = config::load_file(config).map_err(ClientError::from)?;
    let saved = control
        .state_dir
        .as_deref()
        .and_then(|dir| last_good_rules(dir, &own));
    let (client, version) = match saved {
        Some((version, config)) => {
            tracing::info!(
                version,
                "starting with the last good rules from the control plane"
            );
            (Client::new(config)?, version)
        }
        None => (Client::new(own)?, 0),
    };
    let client = Arc::new(client);
    let link = ControlPlane::spawn(client.clone(), control.clone(), version)
        .map_err(ProxyError::Aggregator)?;
    Ok((client, Some(link)))
}
