//! What a valid file says that is probably not what its author meant: `spillway check` prints
//! these to stderr and still exits 0.

use std::fmt;

use super::model::{IdentitySources, Source};
use super::positions::{Position, Positions, child, item};
use super::validate::Config;

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
/// a trusted hop sets it, a criticality header trusted to raise a request's tier
///, and an `xff_trusted_hops` that nothing reads.
pub(crate) fn identity(
    identity: &IdentitySources,
    positions: &Positions,
    file: &str,
) -> Vec<Warning> {
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
    if identity.criticality_trusted
        && let Some(name) = header(&identity.criticality)
    {
        warn(
            "criticality_trusted",
            format!(
                "`criticality_trusted: true` lets header `{name}` raise a request above `critical`: any client that sends `{name}: critical_plus` then outranks everyone else's traffic when a bucket must drop. Trust it only when a hop in front of the proxy sets it on every request and drops the client's"
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

/// A token budget whose estimate (`cost.request`) is more than its bucket holds: each request
/// reserves the whole bucket instead, so one is admitted only when the bucket is full.
pub(crate) fn budgets(config: &Config, positions: &Positions, file: &str) -> Vec<Warning> {
    let mut warnings = Vec::new();
    for service in &config.services {
        let buckets = child(&child("services", &service.name), "buckets");
        let written = service.buckets.iter().filter(|b| !b.is_candidate());
        for (index, bucket) in written.enumerate() {
            let super::model::Cost::Response(cost) = &bucket.cost else {
                continue;
            };
            let holds = bucket.holds();
            let estimate = cost.estimate();
            if estimate > holds {
                let at = child(&child(&item(&buckets, index), "cost"), "request");
                warnings.push(Warning {
                    file: file.to_owned(),
                    position: positions.value(&at),
                    message: format!(
                        "bucket \"{}\" reserves an estimate of {estimate}, more than it holds ({holds}): each request reserves the whole bucket instead, so one is admitted only when the bucket is full; lower the estimate or raise burst",
                        bucket.name
                    ),
                });
            }
        }
    }
    warnings
}
