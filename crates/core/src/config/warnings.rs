//! What a valid file says that is probably not what its author meant: `spillway check` prints
//! these to stderr and still exits 0.

use std::fmt;

use super::model::{Identity, Source};
use super::positions::{Position, Positions};

/// One warning, placed like a configuration error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub file: String,
    pub position: Position,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: warning: {}",
            self.file, self.position, self.message
        )
    }
}

/// The warnings about the `identity` section: a header named as the source of `procedure` or
/// `caller`, which decides the bucket a request falls in and which a client writes itself unless
/// a trusted hop sets it (SPEC §3a), and an `xff_trusted_hops` that nothing reads.
pub(crate) fn identity(identity: &Identity, positions: &Positions, file: &str) -> Vec<Warning> {
    let mut warnings = Vec::new();
    let mut warn = |key: &str, message: String| {
        warnings.push(Warning {
            file: file.to_owned(),
            position: positions.value(&format!("identity.{key}")),
            message,
        });
    };
    let named = |key: &str| positions.contains(&format!("identity.{key}"));
    let header = |sources: &super::Sources| {
        sources.0.iter().find_map(|source| match source {
            Source::Header(name) => Some(name.clone()),
            _ => None,
        })
    };
    if named("procedure")
        && let Some(name) = header(&identity.procedure)
    {
        warn(
            "procedure",
            format!(
                "`procedure` reads header `{name}`, which the client controls unless a trusted hop sets it: a client that sends its own chooses its bucket (`{name}: /x` escapes a `procedure: /ip*` bucket while the upstream still serves the path). Name a header here only when a hop in front of the proxy (a mesh sidecar, a gateway) sets it on every request and drops the client's; otherwise use `path`, the default"
            ),
        );
    }
    if named("caller")
        && let Some(name) = header(&identity.caller)
    {
        warn(
            "caller",
            format!(
                "`caller` reads header `{name}`, which the client controls unless a trusted hop sets it: buckets matched on the caller hold only if a hop in front of the proxy (a mesh sidecar, a gateway) sets it on every request and drops the client's"
            ),
        );
    }
    let reads_xff = identity
        .ip
        .0
        .iter()
        .any(|source| matches!(source, Source::Header(name) if name == "x-forwarded-for"));
    if named("xff_trusted_hops") && !reads_xff {
        warn(
            "xff_trusted_hops",
            format!(
                "`xff_trusted_hops` counts the hops of `x-forwarded-for`, which `ip` does not read (it reads `{}`); it has no effect",
                identity.ip
            ),
        );
    }
    warnings
}
